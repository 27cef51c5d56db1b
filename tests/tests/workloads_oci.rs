//! Charts from OCI registries (issue 43): `helm: {repo: oci://HOST/PATH, chart:, version:, digest:}`.
//!
//! A real registry (the CNCF distribution registry, `target/tools/registry`, built by `tests/tools/build.sh`)
//! runs on loopback; a chart of our own is packaged and pushed to it with the real `helm push`, and the real
//! `windvane build`/`publish` pull it with the real `helm pull --plain-http` (`plainHttp: true`, allowed for a
//! registry on loopback only), check it against the `digest:` pin (the manifest digest `helm push` prints, or
//! the archive's) and render it. A chart whose digest is not the pinned one (the version's tag was pushed
//! again) is refused naming the app and both digests, and nothing is published; so is a pull from a registry
//! that is down.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context, ensure};
use serde_json::Value;
use tempfile::TempDir;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_tests::fleet::{FleetTree, Publisher};
use windvane_tests::process::binary;
use windvane_tests::registry::OciRegistry;

const CHART: &str = "windvane-greeter";
const VERSION: &str = "1.2.0";

/// A tool built by tests/tools/build.sh: `WINDVANE_<NAME>` when set, else the workspace's target/tools.
fn tool(name: &str) -> anyhow::Result<PathBuf> {
    let env = format!("WINDVANE_{}", name.to_ascii_uppercase());
    let path = match std::env::var_os(&env) {
        Some(path) => PathBuf::from(path),
        None => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/tools")
            .join(name),
    };
    ensure!(
        path.is_file(),
        "{} is missing: run tests/tools/build.sh (or set {env})",
        path.display()
    );
    Ok(path)
}

/// The digests of a pushed chart: the OCI manifest's (as `helm push` prints it) and the archive's.
struct Pushed {
    manifest: String,
    archive: String,
}

/// Packages our own chart `CHART` at `VERSION`, whose ConfigMap says `greeting`, and pushes it with the real
/// `helm push` to `charts/` of the registry (pushing the same version again moves its tag).
fn push(registry: &OciRegistry, greeting: &str) -> anyhow::Result<Pushed> {
    let dir = TempDir::new()?;
    let chart = dir.path().join(CHART);
    std::fs::create_dir_all(chart.join("templates"))?;
    std::fs::write(
        chart.join("Chart.yaml"),
        format!("apiVersion: v2\nname: {CHART}\nversion: {VERSION}\nappVersion: \"{greeting}\"\n"),
    )?;
    std::fs::write(chart.join("values.yaml"), "replicas: 1\nname: world\n")?;
    std::fs::write(
        chart.join("templates/configmap.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{{{ .Release.Name }}}}-greeting\ndata:\n  \
             text: \"{greeting}, {{{{ .Values.name }}}}\"\n  replicas: {{{{ .Values.replicas | quote }}}}\n"
        ),
    )?;
    std::fs::write(
        chart.join("templates/service.yaml"),
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: {{ .Release.Name }}\nspec:\n  ports:\n    - port: 80\n",
    )?;
    let helm = |args: &[&str]| -> anyhow::Result<String> {
        let output = Command::new(tool("helm")?)
            .args(args)
            .current_dir(dir.path())
            .env_clear()
            .env("HOME", dir.path())
            .env("HELM_CONFIG_HOME", dir.path().join("config"))
            .env("HELM_CACHE_HOME", dir.path().join("cache"))
            .env("HELM_DATA_HOME", dir.path().join("data"))
            .output()?;
        ensure!(
            output.status.success(),
            "helm {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    };
    helm(&["package", CHART, "--destination", "."])?;
    let archive = dir.path().join(format!("{CHART}-{VERSION}.tgz"));
    let printed = helm(&[
        "push",
        &archive.display().to_string(),
        &registry.oci_url("charts"),
        "--plain-http",
    ])?;
    let manifest = printed
        .lines()
        .find_map(|line| line.strip_prefix("Digest: "))
        .with_context(|| format!("helm push printed no digest: {printed}"))?
        .to_owned();
    Ok(Pushed {
        manifest,
        archive: format!("sha256:{}", sha256_hex(&std::fs::read(&archive)?)),
    })
}

/// A fleet of one app, `greeter`, the chart from `repo` pinned to `digest`, with values of its own.
fn fleet(repo: &str, digest: &str, plain_http: bool) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    let plain = if plain_http {
        "\n      plainHttp: true"
    } else {
        ""
    };
    tree.write(
        "fleet.yaml",
        &format!(
            "fleet: acme\napps:\n  - name: greeter\n    namespace: greet\n    helm:\n      repo: {repo}\n      \
             chart: {CHART}\n      version: {VERSION}\n      digest: {digest}{plain}\n      values: {{name: fleet}}\n"
        ),
    )?;
    Ok(tree)
}

/// Runs the real `windvane` with the real helm.
fn windvane(args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(binary("windvane")?)
        .args(args)
        .env("WINDVANE_HELM", tool("helm")?)
        .output()?)
}

/// `windvane build` of `tree`: the bundle, or standard error when it failed.
fn build(tree: &FleetTree) -> anyhow::Result<Result<Value, String>> {
    let out = TempDir::new()?;
    let bundle = out.path().join("bundle.json");
    let output = windvane(&[
        "build",
        &tree.path().display().to_string(),
        "-o",
        &bundle.display().to_string(),
    ])?;
    if !output.status.success() {
        return Ok(Err(String::from_utf8_lossy(&output.stderr).into_owned()));
    }
    Ok(Ok(serde_json::from_slice(&std::fs::read(&bundle)?)?))
}

/// `windvane publish` of `tree` into the publisher's store on channel `stable`: success, or standard error.
fn publish(publisher: &Publisher, tree: &FleetTree) -> anyhow::Result<Result<(), String>> {
    let output = windvane(&[
        "publish",
        &tree.path().display().to_string(),
        "--root",
        &publisher.store().display().to_string(),
        "--channel",
        "stable",
        "--key",
        &publisher.key_path()?.display().to_string(),
    ])?;
    Ok(if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    })
}

/// The rendered objects of app `greeter`.
fn rendered(bundle: &Value) -> Vec<&Value> {
    bundle["apps"][0]["rendered"]["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| v["manifests"].as_array().into_iter().flatten())
        .map(|m| &m["object"])
        .collect()
}

#[tokio::test]
async fn a_chart_pushed_to_a_registry_is_pulled_checked_against_its_digest_and_rendered()
-> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let pushed = push(&registry, "hello")?;
    let repo = registry.oci_url("charts");

    // Pinned by the digest `helm push` printed (the OCI manifest's).
    let tree = fleet(&repo, &pushed.manifest, true)?;
    let bundle = build(&tree)?.map_err(anyhow::Error::msg)?;
    let objects = rendered(&bundle);
    let kinds: Vec<(&str, &str)> = objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or(""),
                o["metadata"]["name"].as_str().unwrap_or(""),
            )
        })
        .collect();
    ensure!(
        kinds.contains(&("ConfigMap", "greeter-greeting"))
            && kinds.contains(&("Service", "greeter")),
        "rendered: {kinds:?}"
    );
    let config_map = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .context("ConfigMap")?;
    // The chart's own template, with the app's values over the chart's defaults.
    ensure!(
        config_map["data"]["text"] == "hello, fleet" && config_map["data"]["replicas"] == "1",
        "{config_map}"
    );
    let source = &bundle["apps"][0]["rendered"]["source"];
    ensure!(
        source["repo"] == repo.as_str()
            && source["chart"] == CHART
            && source["version"] == VERSION
            && source["manifestDigest"] == pushed.manifest.as_str()
            && source["digest"] == pushed.archive.as_str(),
        "the bundle pins the chart: {source}"
    );

    // Pinned by the archive's digest (as a repository's index.yaml lists it): the same chart.
    let by_archive = build(&fleet(&repo, &pushed.archive, true)?)?.map_err(anyhow::Error::msg)?;
    ensure!(
        by_archive["apps"] == bundle["apps"],
        "the same chart, pinned either way"
    );

    // And published.
    let publisher = Publisher::new(1)?;
    publish(&publisher, &tree)?.map_err(anyhow::Error::msg)?;
    ensure!(publisher.pointer_path("stable").exists(), "published");
    Ok(())
}

#[tokio::test]
async fn a_chart_whose_digest_is_not_the_pinned_one_is_refused_naming_the_app_and_both_digests()
-> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let first = push(&registry, "hello")?;
    let repo = registry.oci_url("charts");
    let tree = fleet(&repo, &first.manifest, true)?;
    build(&tree)?.map_err(anyhow::Error::msg)?;

    // The same version pushed again with other contents: its tag now names another manifest.
    let second = push(&registry, "goodbye")?;
    ensure!(second.manifest != first.manifest, "a different chart");
    let error = build(&tree)?
        .err()
        .context("a chart that is not the pinned one was rendered")?;
    for expected in [
        "app greeter:",
        &format!("{CHART} {VERSION} from {repo}"),
        &format!("pins digest {}", first.manifest),
        &format!("digest is {}", second.manifest),
        &second.archive,
        "update helm.digest",
    ] {
        ensure!(error.contains(expected), "{expected:?} not in: {error}");
    }

    // Nothing published.
    let publisher = Publisher::new(2)?;
    let error = publish(&publisher, &tree)?
        .err()
        .context("published a chart that is not the pinned one")?;
    ensure!(error.contains(&second.manifest), "{error}");
    ensure!(
        !publisher.pointer_path("stable").exists(),
        "a pointer was written"
    );
    ensure!(
        std::fs::read_dir(publisher.store())?.next().is_none(),
        "the store is not empty"
    );
    Ok(())
}

#[tokio::test]
async fn a_registry_that_is_down_is_a_clear_error_and_nothing_is_published() -> anyhow::Result<()> {
    let mut registry = OciRegistry::start().await?;
    let pushed = push(&registry, "hello")?;
    let repo = registry.oci_url("charts");
    let tree = fleet(&repo, &pushed.manifest, true)?;
    registry.stop();

    let error = build(&tree)?
        .err()
        .context("built with the registry down")?;
    for expected in [
        &format!("app greeter: helm pull {CHART} {VERSION} from {repo}:"),
        "connection refused",
    ] {
        ensure!(error.contains(expected), "{expected:?} not in: {error}");
    }
    let publisher = Publisher::new(3)?;
    publish(&publisher, &tree)?
        .err()
        .context("published with the registry down")?;
    ensure!(
        std::fs::read_dir(publisher.store())?.next().is_none(),
        "the store is not empty"
    );
    Ok(())
}

#[tokio::test]
async fn plain_http_is_said_in_fleet_yaml_and_allowed_for_a_registry_on_loopback_only()
-> anyhow::Result<()> {
    let registry = OciRegistry::start().await?;
    let pushed = push(&registry, "hello")?;

    // Without plainHttp, helm speaks HTTPS to the plain-HTTP registry: refused, saying what to write.
    let error = build(&fleet(
        &registry.oci_url("charts"),
        &pushed.manifest,
        false,
    )?)?
    .err()
    .context("pulled over plain HTTP without being told to")?;
    for expected in [
        "app greeter: helm pull",
        "server gave HTTP response to HTTPS client",
        "set helm.plainHttp: true",
    ] {
        ensure!(error.contains(expected), "{expected:?} not in: {error}");
    }

    // plainHttp for a registry elsewhere is refused before helm runs (the fleet tree may not downgrade it).
    let error = build(&fleet(
        "oci://registry.example.com/charts",
        &pushed.manifest,
        true,
    )?)?
    .err()
    .context("plain HTTP to a remote registry")?;
    ensure!(
        error.contains(
            "app greeter: checking helm.plainHttp: \"oci://registry.example.com/charts\""
        ) && error.contains("loopback"),
        "{error}"
    );
    Ok(())
}
