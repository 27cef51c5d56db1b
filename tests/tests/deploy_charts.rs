//! The Helm charts `deploy/charts/windvane-agent` and `deploy/charts/windvane-server` install what the
//! kustomize manifests install (issue 45, item 5). Both are rendered from the same files — the charts read
//! `deploy/agent/base` and `deploy/source-server` through links under their `files/` — and this suite holds
//! them to it: the real helm renders each chart with its default values and the real kustomize builds the
//! base, and the objects must be equal, one by one. The values an operator sets change what they name and
//! nothing else (checked on a rendering with every value set). The install with `helm install --wait` on a
//! real node is in `realnode_install.rs`.

use std::collections::BTreeMap;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use windvane_shared::text::yaml::{YamlLimits, documents_to_json};
use windvane_tests::install::{run, tool, workspace_dir};

/// Objects by (kind, namespace, name), with the agent's configuration file read as data: the chart writes it
/// from the values (as YAML without the base's comments), so it is compared by what it says.
fn objects(yaml: &str, source: &str) -> Result<BTreeMap<String, Value>> {
    let mut objects = BTreeMap::new();
    for (_, mut object) in documents_to_json(yaml, source, YamlLimits::default())? {
        if object.is_null() {
            continue;
        }
        if let Some(config) = object["data"]["agent.yaml"].as_str() {
            let parsed = documents_to_json(config, "agent.yaml", YamlLimits::default())?;
            object["data"]["agent.yaml"] = parsed
                .into_iter()
                .next()
                .map(|(_, v)| v)
                .unwrap_or_default();
        }
        let key = format!(
            "{} {}/{}",
            object["kind"].as_str().unwrap_or_default(),
            object["metadata"]["namespace"].as_str().unwrap_or_default(),
            object["metadata"]["name"].as_str().unwrap_or_default()
        );
        ensure!(
            objects.insert(key.clone(), object).is_none(),
            "{source}: {key} twice"
        );
    }
    Ok(objects)
}

/// `helm template` of the chart `name` into `namespace` with `args`, as objects.
fn helm_template(name: &str, namespace: &str, args: &[&str]) -> Result<BTreeMap<String, Value>> {
    let chart = workspace_dir().join("deploy/charts").join(name);
    let chart = chart.display().to_string();
    let mut full = vec!["template", name, &chart, "--namespace", namespace];
    full.extend(args);
    objects(
        &run(&tool("helm")?, &full)?,
        &format!("helm template {name}"),
    )
}

fn kustomize_build(dir: &str) -> Result<BTreeMap<String, Value>> {
    let path = workspace_dir().join(dir).display().to_string();
    objects(
        &run(&tool("kustomize")?, &["build", &path])?,
        &format!("kustomize build {dir}"),
    )
}

/// Fails naming every object that differs, is missing or is extra.
fn same(chart: &BTreeMap<String, Value>, base: &BTreeMap<String, Value>, what: &str) -> Result<()> {
    let mut differences = Vec::new();
    for (key, object) in base {
        match chart.get(key) {
            None => differences.push(format!("{key}: not in the chart")),
            Some(rendered) if rendered != object => differences.push(format!(
                "{key}:\n  kustomize: {object}\n  helm:      {rendered}"
            )),
            Some(_) => {}
        }
    }
    for key in chart.keys().filter(|k| !base.contains_key(*k)) {
        differences.push(format!("{key}: only in the chart"));
    }
    ensure!(
        differences.is_empty(),
        "{what}:\n{}",
        differences.join("\n")
    );
    Ok(())
}

#[test]
fn the_charts_render_exactly_the_kustomize_manifests_by_default() -> Result<()> {
    let agent = helm_template(
        "windvane-agent",
        "windvane-system",
        &["--set", "namespace.create=true"],
    )?;
    ensure!(
        agent.len() >= 10,
        "the agent chart rendered {} objects",
        agent.len()
    );
    same(
        &agent,
        &kustomize_build("deploy/agent")?,
        "windvane-agent chart vs deploy/agent",
    )?;
    let server = helm_template(
        "windvane-server",
        "windvane-server",
        &["--set", "namespace.create=true"],
    )?;
    same(
        &server,
        &kustomize_build("deploy/source-server")?,
        "windvane-server chart vs deploy/source-server",
    )
}

#[test]
fn the_narrow_rbac_value_renders_what_the_narrow_rbac_component_does() -> Result<()> {
    let chart = helm_template(
        "windvane-agent",
        "windvane-system",
        &[
            "--set",
            "namespace.create=true",
            "--set",
            "rbac.narrow=true",
        ],
    )?;
    // The component on the base, as an overlay would use it.
    let scratch = tempfile::tempdir()?;
    let base = workspace_dir().join("deploy/agent");
    std::fs::write(
        scratch.path().join("kustomization.yaml"),
        format!(
            "resources: [{0}/base]\ncomponents: [{0}/components/narrow-rbac]\n",
            // kustomize refuses absolute paths: relative from the scratch directory.
            format_args!(
                "{}{}",
                "../".repeat(scratch.path().components().count() - 1),
                base.display().to_string().trim_start_matches('/')
            )
        ),
    )?;
    let path = scratch.path().display().to_string();
    let built = objects(&run(&tool("kustomize")?, &["build", &path])?, "narrow-rbac")?;
    same(&chart, &built, "rbac.narrow=true vs components/narrow-rbac")
}

#[test]
fn an_operators_values_change_what_they_name() -> Result<()> {
    let scratch = tempfile::tempdir()?;
    let values = scratch.path().join("values.yaml");
    std::fs::write(
        &values,
        "cluster: {name: prod-us, labels: {env: prod, tier: edge}}\n\
         source: https://releases.acme.test/fleet\nchannel: beta\nfleet: acme\nserver: https://windvane.acme.test\n\
         releaseKeys: {release.pub: \"PEM\"}\n\
         registrationToken: {existingSecret: fleet-token, key: value}\n\
         config: {pollInterval: 10s}\n\
         image: {repository: registry.acme.test/windvane-agent, tag: 9.9.9}\n\
         resources: {limits: {memory: 256Mi}}\n\
         tolerations: [{key: dedicated, operator: Exists}]\n\
         commonLabels: {team: platform}\n",
    )?;
    let values = values.display().to_string();
    let chart = helm_template("windvane-agent", "agents", &["-f", &values])?;
    let default = helm_template("windvane-agent", "agents", &[])?;
    ensure!(
        !chart.contains_key("Namespace /agents"),
        "no Namespace unless asked"
    );
    ensure!(
        !chart.contains_key("Secret agents/windvane-registration-token"),
        "an existing Secret replaces the chart's"
    );
    let config = &chart["ConfigMap agents/windvane-agent-config"]["data"]["agent.yaml"];
    assert_eq!(config["cluster"], "prod-us");
    assert_eq!(config["labels"], json!({"env": "prod", "tier": "edge"}));
    assert_eq!(config["source"], "https://releases.acme.test/fleet");
    assert_eq!(config["channel"], "beta");
    assert_eq!(config["server"], "https://windvane.acme.test");
    assert_eq!(config["pollInterval"], "10s");
    assert_eq!(
        config["trustedKeys"],
        json!(["/etc/windvane/trusted-keys/release.pub"])
    );
    let base_config = &default["ConfigMap agents/windvane-agent-config"]["data"]["agent.yaml"];
    assert_eq!(
        config["holdCap"], base_config["holdCap"],
        "the rest is the base's"
    );
    assert_eq!(
        chart["ConfigMap agents/windvane-trusted-keys"]["data"],
        json!({"release.pub": "PEM"})
    );
    let daemonset = &chart["DaemonSet agents/windvane-agent"];
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"],
        "registry.acme.test/windvane-agent:9.9.9"
    );
    assert_eq!(
        pod["containers"][0]["resources"],
        json!({"limits": {"memory": "256Mi"}})
    );
    assert_eq!(
        pod["tolerations"],
        json!([{"key": "dedicated", "operator": "Exists"}])
    );
    let token = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == "registration-token"))
        .context("the token volume")?;
    assert_eq!(token["secret"]["secretName"], "fleet-token");
    assert_eq!(
        token["secret"]["items"],
        json!([{"key": "value", "path": "token"}])
    );
    assert_eq!(daemonset["metadata"]["labels"]["team"], "platform");
    assert_eq!(daemonset["metadata"]["namespace"], "agents");
    let binding = &chart["RoleBinding agents/windvane-agent"];
    assert_eq!(binding["subjects"][0]["namespace"], "agents");
    // Everything the values do not name is as by default.
    for (key, object) in &default {
        if !chart.contains_key(key) {
            continue;
        }
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let named = [
            "windvane-agent-config",
            "windvane-trusted-keys",
            "windvane-agent",
        ];
        if !named.contains(&name) {
            let mut rendered = chart[key].clone();
            rendered["metadata"]["labels"]
                .as_object_mut()
                .map(|l| l.remove("team"));
            assert_eq!(&rendered, object, "{key}");
        }
    }
    Ok(())
}
