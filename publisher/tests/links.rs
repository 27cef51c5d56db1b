//! The agent and the source server do not link the publisher: they verify and apply (or serve) what was
//! published and never read a fleet tree or run Helm or kustomize. Read from the workspace's dependency graph
//! (`cargo metadata`), following normal and build dependencies (what goes into a binary), so that adding the
//! publisher to either, directly or through another workspace crate, fails this test.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// Workspace package name → the names of the packages it declares as normal or build dependencies. Only the
/// workspace's own packages can reach the publisher (a path dependency), so their declared dependencies are
/// the whole question; `--no-deps` needs neither the registry nor the network.
fn link_graph() -> HashMap<String, Vec<String>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
    let mut graph = HashMap::new();
    for package in metadata["packages"].as_array().expect("packages") {
        let linked = package["dependencies"]
            .as_array()
            .expect("dependencies")
            .iter()
            .filter(|dep| matches!(dep["kind"].as_str(), None | Some("build")))
            .map(|dep| dep["name"].as_str().expect("a name").to_owned())
            .collect();
        graph.insert(package["name"].as_str().expect("a name").to_owned(), linked);
    }
    graph
}

/// Every package `root` links, directly or not.
fn linked_by(graph: &HashMap<String, Vec<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut next = vec![root.to_owned()];
    while let Some(package) = next.pop() {
        for dep in graph.get(&package).into_iter().flatten() {
            if seen.insert(dep.clone()) {
                next.push(dep.clone());
            }
        }
    }
    seen
}

#[test]
fn the_agent_and_the_server_do_not_link_the_publisher() {
    let graph = link_graph();
    // The check sees the publisher where it is linked: by the command line.
    assert!(linked_by(&graph, "windvane-cli").contains("windvane-publisher"));
    for binary in ["windvane-agent", "windvane-source-server"] {
        let linked = linked_by(&graph, binary);
        assert!(linked.contains("windvane-shared"), "{binary}: {linked:?}");
        assert!(
            !linked.contains("windvane-publisher"),
            "{binary} links windvane-publisher (the fleet-tree reader and the build-time engines)"
        );
    }
}
