//! Real workloads at build time: files and charts as widely used projects publish them, read as kubectl and
//! Helm read them (issue 43).
//!
//! - YAML: Windvane's reader against the real Go reader kubectl and Helm use (`sigs.k8s.io/yaml` over go-yaml
//!   v2, built as target/tools/yaml2json by tests/tools/build.sh), on a generated corpus of the forms YAML 1.1
//!   and 1.2 read differently; and `windvane build` warning about them (naming file and line), `--strict`
//!   refusing them, in plain files and in Helm's output.
//! - Substitution: only well-formed Windvane variables are substituted; dashboards' `${cluster}` stay text.
//! - Charts: a folder with `Chart.yaml` is a chart without `helm:`; dependencies in `charts/` (unpacked and
//!   `.tgz`, one disabled by `condition:`); `.Capabilities.APIVersions.Has` for the chart's own CRDs.
//!
//! Everything runs the real `windvane` binary and the real `helm`; the fixtures are our own.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use anyhow::{Context, ensure};
use serde_json::Value;
use windvane_shared::text::yaml::{Yaml11, YamlLimits, read_documents};
use windvane_tests::fleet::FleetTree;
use windvane_tests::process::binary;

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

// ---------------------------------------------------------------------------------------------------------
// The differential test: Windvane's YAML reader and kubectl's, on the same inputs.

/// Plain scalars whose reading depends on the YAML version or on the reader: every combination of a sign, a
/// prefix, digits and a suffix, the words of YAML 1.1's boolean and null tables in their case forms, floats,
/// timestamps and base-60 forms.
fn ambiguous_scalars() -> Vec<String> {
    let mut scalars = Vec::new();
    let signs = ["", "+", "-"];
    let prefixes = ["", "0", "00", "0x", "0X", "0o", "0O", "0b", "0B"];
    let digits = [
        "0",
        "1",
        "7",
        "8",
        "9",
        "10",
        "644",
        "1f",
        "FF",
        "101",
        "1_000",
        "1_",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551615",
        "18446744073709551616",
    ];
    let suffixes = ["", ".5", ".", "e3", "e-2", "E+2", ":30", "_"];
    for sign in signs {
        for prefix in prefixes {
            for digit in digits {
                for suffix in suffixes {
                    scalars.push(format!("{sign}{prefix}{digit}{suffix}"));
                }
            }
        }
    }
    let words = [
        "y", "Y", "yes", "Yes", "YES", "yEs", "n", "N", "no", "No", "NO", "nO", "on", "On", "ON",
        "oN", "off", "Off", "OFF", "oFF", "true", "True", "TRUE", "tRUE", "false", "False",
        "FALSE", "fALSE", "null", "Null", "NULL", "nULL", "~", "none", "nil",
    ];
    let others = [
        ".5",
        ".5e3",
        ".5E-3",
        "._5",
        ".e3",
        ".",
        "..5",
        ".inf",
        ".Inf",
        ".INF",
        "+.inf",
        "-.Inf",
        ".nan",
        ".NaN",
        ".NAN",
        "1e400",
        "-1e400",
        "1e-400",
        ".5e999",
        "0b-101",
        "0b+1",
        "0x_1f",
        "1__0",
        "_1_000",
        "1_0.5",
        "09",
        "08.5",
        "2001-12-14",
        "2001-12-14t21:59:43.10-05:00",
        "2001-12-14 21:59:43.10",
        "1:30",
        "190:20:30",
        "-1:30",
        "1:30.5",
        "12:345",
        "8080:80",
        "1.2.3",
        "0.5.1",
        "v1",
        "1Gi",
        "1000m",
        "0.1",
        "1.0",
        "3.",
        "+1.5",
        "-0",
        "+0",
        "0644.5",
        "1e6",
        "1.5e6",
        "0.0001",
        "0.00001",
    ];
    scalars.extend(words.iter().map(|w| (*w).to_owned()));
    scalars.extend(others.iter().map(|w| (*w).to_owned()));
    scalars
}

/// Documents that place each scalar as a value, as a key, in a flow sequence and under each core tag, and
/// documents with merge keys.
fn corpus() -> Vec<String> {
    let mut documents = Vec::new();
    for scalar in ambiguous_scalars() {
        documents.push(format!("v: {scalar}\n"));
        documents.push(format!("{scalar}: v\n"));
        documents.push(format!("list: [{scalar}, x]\n"));
        for tag in ["!!int", "!!float", "!!bool", "!!null", "!!str"] {
            documents.push(format!("v: {tag} {scalar}\n"));
        }
        documents.push(format!("v: !!int \"{scalar}\"\n"));
    }
    documents.extend(
        [
            "b: &b {a: 1, c: 2}\nx:\n  <<: *b\n  c: 3\n",
            "b: &b {a: 1}\nx:\n  a: 0\n  <<: *b\n",
            "p: &p {a: 1}\nq: &q {a: 2, b: 2}\nx:\n  <<: [*p, *q]\n",
            "p: &p {a: 1}\nq: &q {a: 2, b: 2}\nx:\n  <<: [*q, *p]\n  b: 3\n",
            "x:\n  <<: {a: 1}\n  b: 2\n",
            "x:\n  <<: {a: 1}\n  <<: {a: 2}\n",
            "x:\n  '<<': {a: 1}\n",
            "x:\n  \"<<\": 1\n",
            "x:\n  <<: 1\n",
            "x:\n  <<: [{a: 1}, 2]\n",
            "x:\n  <<: ~\n",
            "<<: {kind: ConfigMap}\napiVersion: v1\n",
            "d: &d\n  <<: {a: 1}\n  b: 2\ne:\n  <<: *d\n  c: 3\n",
            "s: &s [1, 2]\nx:\n  <<: *s\n",
            "list:\n  - <<\n  - a\n",
            "v: <<\n",
        ]
        .iter()
        .map(|d| (*d).to_owned()),
    );
    documents
}

/// Runs target/tools/yaml2json on `documents`: each one's JSON, or `None` where the Go reader refused it.
fn kubectl_reading(documents: &[String]) -> anyhow::Result<Vec<Option<Value>>> {
    let mut child = Command::new(tool("yaml2json")?)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let input = documents.join("\0");
    let mut stdin = child.stdin.take().context("stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    ensure!(output.status.success(), "yaml2json failed");
    let lines: Vec<Value> = String::from_utf8(output.stdout)?
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    ensure!(
        lines.len() == documents.len(),
        "yaml2json answered {} of {}",
        lines.len(),
        documents.len()
    );
    Ok(lines
        .into_iter()
        .map(|line| line.get("json").cloned())
        .collect())
}

/// Equal as JSON values, numbers compared by value (Go writes `1e+20` where serde writes `100000000000000000000.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                (Some(x), Some(y), _, _) => x == y,
                (_, _, Some(x), Some(y)) => x == y,
                _ => x.as_f64() == y.as_f64(),
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn windvane_reads_yaml_exactly_as_kubectl_and_helm_do() -> anyhow::Result<()> {
    let documents = corpus();
    let theirs = kubectl_reading(&documents)?;
    let mut mismatches = Vec::new();
    let mut compared = 0;
    for (document, kubectl) in documents.iter().zip(&theirs) {
        let ours = read_documents(document, "corpus.yaml", YamlLimits::default(), Yaml11::Read);
        match (&ours, kubectl) {
            (Ok(read), Some(expected)) => {
                let value = read
                    .documents
                    .first()
                    .map_or(Value::Null, |(_, v)| v.clone());
                if same(&value, expected) {
                    compared += 1;
                } else {
                    mismatches.push(format!(
                        "{document:?}: kubectl {expected}, windvane {value}"
                    ));
                }
            }
            (Err(_), None) => compared += 1,
            (Err(error), Some(expected)) => {
                mismatches.push(format!(
                    "{document:?}: kubectl {expected}, windvane refused: {error}"
                ));
            }
            (Ok(read), None) => {
                mismatches.push(format!(
                    "{document:?}: kubectl refused, windvane read {:?}",
                    read.documents
                ));
            }
        }
    }
    ensure!(
        mismatches.is_empty(),
        "{} of {} documents read differently:\n{}",
        mismatches.len(),
        documents.len(),
        mismatches
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    ensure!(compared > 20_000, "only {compared} documents compared");
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------
// `windvane build` on trees shaped like published files and charts.

/// Runs the real `windvane` with the real engines.
fn windvane(args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(binary("windvane")?)
        .args(args)
        .env("WINDVANE_HELM", tool("helm")?)
        .env_remove("WINDVANE_STRICT")
        .output()?)
}

/// `windvane build` of `tree` (with `extra` flags): the bundle and standard error, or the error's text.
fn build(tree: &FleetTree, extra: &[&str]) -> anyhow::Result<Result<(Value, String), String>> {
    // Its own directory: every test of this file builds at once, and a shared `../bundle.json`
    // (the parent of each tree is the same temp root) made two builds race on one file.
    let out_dir = tempfile::TempDir::new()?;
    let out = out_dir.path().join("bundle.json");
    let source = tree.path().display().to_string();
    let output_path = out.display().to_string();
    let mut args = vec!["build", source.as_str(), "-o", output_path.as_str()];
    args.extend_from_slice(extra);
    let output = windvane(&args)?;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    if !output.status.success() {
        return Ok(Err(stderr));
    }
    let bundle = serde_json::from_slice(&std::fs::read(&out)?)?;
    Ok(Ok((bundle, stderr)))
}

/// Every object of an app of a bundle (every variant of an engine's), by kind and name.
fn objects<'b>(bundle: &'b Value, app: &str) -> Vec<&'b Value> {
    let Some(app) = bundle["apps"]
        .as_array()
        .and_then(|apps| apps.iter().find(|a| a["name"] == app))
    else {
        return Vec::new();
    };
    let plain = app["manifests"].as_array().into_iter().flatten();
    let rendered = app["rendered"]["variants"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|variant| variant["manifests"].as_array().into_iter().flatten());
    plain
        .chain(rendered)
        .map(|manifest| &manifest["object"])
        .collect()
}

fn object<'b>(bundle: &'b Value, app: &str, kind: &str, name: &str) -> anyhow::Result<&'b Value> {
    objects(bundle, app)
        .into_iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .with_context(|| format!("app {app} has no {kind} {name}"))
}

const YAML11_FLEET: &str = "\
fleet: acme
apps:
  - name: files
    path: apps/files
    namespace: files
  - name: chart
    path: charts/mounts
    namespace: mounts
";

/// A plain install file with what published files hold: an octal mode, yes/on booleans, a merge key and an
/// underscored number.
const YAML11_FILE: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: agent
spec:
  replicas: 1
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec:
      containers:
        - &container
          name: agent
          image: example.invalid/agent:1
          securityContext: {readOnlyRootFilesystem: yes, privileged: off}
          env:
            - {name: LIMIT, value: \"1_000\"}
        - <<: *container
          name: sidecar
      terminationGracePeriodSeconds: 1_000
      volumes:
        - name: config
          configMap: {name: agent, defaultMode: 0644}
";

/// A chart with no `helm:` in fleet.yaml, whose own output has YAML 1.1 forms no chart user can change.
const MOUNTS_CHART: &[(&str, &str)] = &[
    (
        "charts/mounts/Chart.yaml",
        "apiVersion: v2\nname: mounts\nversion: 0.1.0\n",
    ),
    ("charts/mounts/values.yaml", "mode: \"0600\"\n"),
    (
        "charts/mounts/templates/pod.yaml",
        "apiVersion: v1
kind: Pod
metadata:
  name: {{ .Release.Name }}-pod
spec:
  automountServiceAccountToken: on
  containers: [{name: c, image: example.invalid/c:1}]
  volumes:
    - name: secret
      secret: {secretName: s, defaultMode: {{ .Values.mode }}}
",
    ),
];

/// Issue 43: YAML 1.1 forms in plain files and in Helm's output are read as kubectl reads them, with a
/// warning naming file and line; `--strict` refuses them. A folder with a Chart.yaml and no `helm:` is a chart.
#[test]
fn build_reads_yaml11_as_kubectl_does_and_strict_refuses() -> anyhow::Result<()> {
    let tree = FleetTree::new()?;
    tree.write("fleet.yaml", YAML11_FLEET)?;
    tree.write("apps/files/agent.yaml", YAML11_FILE)?;
    for (path, text) in MOUNTS_CHART {
        tree.write(path, text)?;
    }
    let (bundle, stderr) = build(&tree, &[])?.map_err(anyhow::Error::msg)?;
    let deployment = object(&bundle, "files", "Deployment", "agent")?;
    let pod_spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod_spec["volumes"][0]["configMap"]["defaultMode"], 420);
    assert_eq!(pod_spec["terminationGracePeriodSeconds"], 1000);
    let main = &pod_spec["containers"][0];
    assert_eq!(
        main["securityContext"],
        serde_json::json!({"readOnlyRootFilesystem": true, "privileged": false})
    );
    let sidecar = &pod_spec["containers"][1];
    assert_eq!(sidecar["name"], "sidecar");
    assert_eq!(
        sidecar["image"], "example.invalid/agent:1",
        "the merge key brought the container in"
    );
    assert_eq!(
        main["env"][0]["value"], "1_000",
        "a quoted scalar stays text"
    );
    // The chart, recognised by its Chart.yaml, rendered by helm; its output read as kubectl reads it.
    let pod = object(&bundle, "chart", "Pod", "chart-pod")?;
    assert_eq!(pod["spec"]["volumes"][0]["secret"]["defaultMode"], 384);
    assert_eq!(pod["spec"]["automountServiceAccountToken"], true);
    for expected in [
        "warning: apps/files/agent.yaml:15:53: \"yes\"",
        "warning: apps/files/agent.yaml:15:70: \"off\"",
        "warning: apps/files/agent.yaml:18:11: \"<<\"",
        "warning: apps/files/agent.yaml:20:38: \"1_000\"",
        "warning: apps/files/agent.yaml:23:49: \"0644\"",
        // Lines count in the template's rendered document, as helm printed it.
        "warning: charts/mounts (helm): mounts/templates/pod.yaml:11:44: \"0600\"",
    ] {
        assert!(
            stderr.contains(expected),
            "{expected:?} missing in:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("read 420, a YAML 1.2 reader 644"),
        "{stderr}"
    );
    let refused = build(&tree, &["--strict"])?
        .err()
        .context("--strict built the tree")?;
    assert!(
        refused
            .contains("apps/files/agent.yaml:15:53: \"yes\" reads differently in YAML 1.1 and 1.2"),
        "{refused}"
    );
    Ok(())
}

/// Issue 43: a monitoring stack's dashboards keep Grafana's `${cluster}`, `${namespace}`,
/// `${__data.fields.X}` and `${datasource}`, in an app that declares no values; `windvane build` names the
/// apps whose manifests hold Windvane variables; a near miss is an error with a suggestion.
#[test]
fn only_windvane_variables_are_substituted() -> anyhow::Result<()> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: dashboards\n    path: apps/dashboards\n    namespace: monitoring\n  \
         - name: web\n    path: apps/web\n    namespace: web\n    values: {replicas: 2}\n",
    )?;
    let dashboard = "apiVersion: v1
kind: ConfigMap
metadata: {name: cluster-overview}
data:
  overview.json: |
    {\"templating\": {\"list\": [{\"name\": \"cluster\"}, {\"name\": \"namespace\"}]},
     \"panels\": [{\"datasource\": \"${datasource}\",
       \"targets\": [{\"expr\": \"sum(up{cluster=\\\"${cluster}\\\", namespace=~\\\"${namespace}\\\"})\"}],
       \"links\": [{\"url\": \"/d/pods?var-pod=${__data.fields.pod}&var-cluster=${cluster:text}\"}]}]}
  run.sh: 'exec agent --home ${HOME} --match ${1}'
";
    tree.write("apps/dashboards/overview.yaml", dashboard)?;
    tree.write(
        "apps/web/deploy.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\ndata:\n  cluster: ${cluster.name}\n  \
         replicas: \"${values.replicas}\"\n",
    )?;
    let (bundle, stderr) = build(&tree, &[])?.map_err(anyhow::Error::msg)?;
    assert!(
        stderr.contains("variables: substituted per cluster in app(s) web\n"),
        "{stderr}"
    );
    // What a cluster gets: the dashboard exactly as written.
    let source = tree.path().display().to_string();
    let output = windvane(&["render", &source, "--cluster", "eu-1"])?;
    ensure!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rendered = String::from_utf8(output.stdout)?;
    let written =
        object(&bundle, "dashboards", "ConfigMap", "cluster-overview")?["data"]["overview.json"]
            .as_str()
            .context("overview.json")?
            .to_owned();
    assert!(
        written.contains("cluster=\\\"${cluster}\\\"") && written.contains("${__data.fields.pod}")
    );
    let rendered_docs =
        windvane_shared::text::yaml::documents_to_json(&rendered, "render", YamlLimits::default())?;
    let rendered_dashboard = rendered_docs
        .iter()
        .map(|(_, v)| v)
        .find(|v| v["metadata"]["name"] == "cluster-overview")
        .context("the dashboard is rendered")?;
    assert_eq!(rendered_dashboard["data"]["overview.json"], written);
    assert_eq!(
        rendered_dashboard["data"]["run.sh"],
        "exec agent --home ${HOME} --match ${1}"
    );
    assert!(rendered.contains("cluster: eu-1"), "{rendered}");
    // Near misses stay errors, with a suggestion.
    for (text, hint) in [
        ("${cluster.nmae}", "did you mean ${cluster.name}?"),
        ("\"${values.replcas}\"", "did you mean ${values.replicas}?"),
    ] {
        tree.write(
            "apps/web/deploy.yaml",
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: web}}\ndata:\n  x: {text}\n"
            ),
        )?;
        let refused = build(&tree, &[])?.err().context("a near miss built")?;
        assert!(refused.contains(hint), "{refused}");
    }
    Ok(())
}

/// A chart with dependencies as `helm dependency build` leaves them: one unpacked in charts/, one packed as a
/// .tgz, one disabled by its `condition:`.
#[test]
fn chart_dependencies_in_charts_folder_render_and_a_disabled_one_does_not() -> anyhow::Result<()> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: stack\n    path: charts/stack\n    namespace: stack\n",
    )?;
    tree.write(
        "charts/stack/Chart.yaml",
        "apiVersion: v2\nname: stack\nversion: 1.0.0\ndependencies:\n  - {name: alpha, version: 0.1.0, repository: \"\"}\n  \
         - {name: beta, version: 0.2.0, repository: \"\"}\n  - {name: gamma, version: 0.3.0, repository: \"\", condition: gamma.enabled}\n",
    )?;
    tree.write(
        "charts/stack/values.yaml",
        "gamma: {enabled: false}\nbeta: {greeting: from-parent}\n",
    )?;
    tree.write(
        "charts/stack/templates/own.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: stack-own}\n",
    )?;
    for (name, version) in [("alpha", "0.1.0"), ("beta", "0.2.0"), ("gamma", "0.3.0")] {
        let dir = if name == "beta" {
            "packing/beta".to_owned()
        } else {
            format!("charts/stack/charts/{name}")
        };
        tree.write(
            &format!("{dir}/Chart.yaml"),
            &format!("apiVersion: v2\nname: {name}\nversion: {version}\n"),
        )?;
        tree.write(&format!("{dir}/values.yaml"), "greeting: own\n")?;
        tree.write(
            &format!("{dir}/templates/cm.yaml"),
            &format!("apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}}}\ndata: {{greeting: {{{{ .Values.greeting }}}}}}\n"),
        )?;
    }
    let packed = Command::new(tool("helm")?)
        .args([
            "package",
            "packing/beta",
            "--destination",
            "charts/stack/charts",
        ])
        .current_dir(tree.path())
        .output()?;
    ensure!(
        packed.status.success(),
        "{}",
        String::from_utf8_lossy(&packed.stderr)
    );
    std::fs::remove_dir_all(tree.path().join("packing"))?;
    ensure!(
        tree.path()
            .join("charts/stack/charts/beta-0.2.0.tgz")
            .is_file()
    );
    let (bundle, _) = build(&tree, &[])?.map_err(anyhow::Error::msg)?;
    let mut names: Vec<String> = objects(&bundle, "stack")
        .iter()
        .map(|o| {
            o["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["alpha", "beta", "stack-own"]);
    assert_eq!(
        object(&bundle, "stack", "ConfigMap", "beta")?["data"]["greeting"],
        "from-parent"
    );
    Ok(())
}

/// A chart that installs a CRD and renders a resource of it only when `.Capabilities.APIVersions.Has` it:
/// built as it will be once its CRD exists, and the same on every build.
#[test]
fn a_chart_that_asks_for_its_own_crds_renders_them_the_same_every_time() -> anyhow::Result<()> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        "fleet: acme\napps:\n  - name: widgets\n    path: charts/widgets\n    namespace: widgets\n",
    )?;
    tree.write(
        "charts/widgets/Chart.yaml",
        "apiVersion: v2\nname: widgets\nversion: 0.1.0\n",
    )?;
    tree.write(
        "charts/widgets/crds/widgets.yaml",
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  scope: Namespaced
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
",
    )?;
    tree.write(
        "charts/widgets/templates/default.yaml",
        "{{- if .Capabilities.APIVersions.Has \"example.com/v1/Widget\" }}
apiVersion: example.com/v1
kind: Widget
metadata: {name: default}
{{- end }}
{{- if .Capabilities.APIVersions.Has \"example.com/v1\" }}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: widgets-enabled}
{{- end }}
",
    )?;
    let (first, _) = build(&tree, &[])?.map_err(anyhow::Error::msg)?;
    object(&first, "widgets", "Widget", "default")?;
    object(&first, "widgets", "ConfigMap", "widgets-enabled")?;
    for _ in 0..2 {
        let (again, _) = build(&tree, &[])?.map_err(anyhow::Error::msg)?;
        assert_eq!(
            again, first,
            "the same chart built again gives another bundle"
        );
    }
    Ok(())
}
