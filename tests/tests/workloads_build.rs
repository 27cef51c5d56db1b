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
use windvane_shared::yaml::{Yaml11, YamlLimits, read_documents};
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
