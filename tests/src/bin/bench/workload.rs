//! The objects the agent benchmarks manage: 1,000 objects across 10 namespaces — per namespace its
//! Namespace, 79 ConfigMaps of about 1 KB and 20 one-replica Deployments — written both as a Windvane fleet
//! tree (one app per namespace) and as plain manifests for `kubectl apply -f DIR`, identical but for the
//! namespace prefix and `${cluster.name}`, which the agent renders and kubectl gets already filled in.
//! Plus a small release (5 objects) for the agent's idle footprint, and a big release (about 5 MB of 250
//! objects, ten of them CustomResourceDefinitions of about 300 KB, as operators' install files carry) for
//! the agent's memory on large objects.

use std::fmt::Write as _;
use std::path::Path;

use windvane_publisher::source::load_fleet_dir;
use windvane_shared::decide::desired::cluster_share_into;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::BundleLimits;
use windvane_tests::fleet::FleetTree;

/// Namespaces of the large release.
pub const NAMESPACES: usize = 10;
/// ConfigMaps per namespace.
pub const CONFIG_MAPS: usize = 79;
/// Deployments per namespace.
pub const DEPLOYMENTS: usize = 20;
/// Objects of the large release: Namespaces, ConfigMaps and Deployments.
pub const OBJECTS: usize = NAMESPACES * (1 + CONFIG_MAPS + DEPLOYMENTS);

/// The fleet of the large release.
pub const FLEET: &str = "bench";
/// The cluster name the agent renders with (`<fleet>-cluster`, as the benchmark names agents' clusters).
pub const CLUSTER: &str = "bench-cluster";
/// Namespace prefix of the agent's objects.
pub const AGENT_PREFIX: &str = "wv";
/// Namespace prefix of kubectl's objects.
pub const KUBECTL_PREFIX: &str = "kc";
/// The ConfigMap entry the drift trials change.
pub const DRIFT_KEY: &str = "key-0";

/// The fleet of the small release.
pub const TINY_FLEET: &str = "tiny";
/// Objects of the small release.
pub const TINY_OBJECTS: usize = 5;

/// The fleet of the big release.
pub const BIG_FLEET: &str = "big";
/// Namespace of the big release's namespaced objects.
pub const BIG_NAMESPACE: &str = "big";
/// CustomResourceDefinitions of the big release.
pub const BIG_CRDS: usize = 10;
/// Properties in each CRD's schema: with their descriptions, about 300 KB per CRD.
const BIG_CRD_PROPERTIES: usize = 1_000;
/// ConfigMaps of the big release, about 10 KB each.
pub const BIG_CONFIG_MAPS: usize = 200;
/// Deployments of the big release.
pub const BIG_DEPLOYMENTS: usize = 39;
/// Objects of the big release: its Namespace, the CRDs, ConfigMaps and Deployments.
pub const BIG_OBJECTS: usize = 1 + BIG_CRDS + BIG_CONFIG_MAPS + BIG_DEPLOYMENTS;

/// The fleet and namespace prefix of the agent in a further round of the first-sync comparison:
/// `bench-r2` and `wv2` for round 2 (round 0 is the large release's own agent, [`FLEET`] and
/// [`AGENT_PREFIX`], which stays for the idle and drift sections).
pub fn sync_round(round: usize) -> (String, String) {
    (
        format!("{FLEET}-r{round}"),
        format!("{AGENT_PREFIX}{round}"),
    )
}

/// Namespace prefix of the bare in-process client's run `run` (`bare0`, `bare1`, …): one before the
/// agent's first round and one after each.
pub fn bare_prefix(run: usize) -> String {
    format!("bare{run}")
}

/// `prefix-07`.
pub fn namespace(prefix: &str, index: usize) -> String {
    format!("{prefix}-{index:02}")
}

/// `config-042`.
pub fn config_map_name(index: usize) -> String {
    format!("config-{index:03}")
}

/// The value of a ConfigMap entry as the release has it.
pub fn config_value(namespace_index: usize, config_map: usize, key: usize) -> String {
    // About 100 bytes per entry, distinct per object so no two bodies are alike.
    format!(
        "ns{namespace_index:02}-cm{config_map:03}-k{key}-{}",
        "v".repeat(84)
    )
}

/// The manifests of one namespace: its Namespace, ConfigMaps and Deployments, as one YAML stream.
/// `cluster` fills the `cluster` entry of every ConfigMap (`${cluster.name}` in a fleet tree).
fn namespace_manifests(prefix: &str, index: usize, cluster: &str) -> String {
    let ns = namespace(prefix, index);
    let mut out = String::new();
    let _ = write!(
        out,
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}\n  labels: {{team: team-{index:02}}}\n"
    );
    for cm in 0..CONFIG_MAPS {
        let _ = write!(
            out,
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
             labels: {{app.kubernetes.io/name: team-{index:02}, tier: backend}}\ndata:\n  cluster: {cluster}\n",
            name = config_map_name(cm)
        );
        for key in 0..8 {
            let _ = writeln!(out, "  key-{key}: {}", config_value(index, cm, key));
        }
    }
    for deployment in 0..DEPLOYMENTS {
        let name = format!("web-{deployment:02}");
        let _ = write!(
            out,
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: {ns}\n  \
             labels: {{app.kubernetes.io/name: {name}}}\nspec:\n  replicas: 1\n  \
             selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    \
             spec:\n      containers:\n        - name: web\n          image: registry.example.com/web:1.{deployment}\n          \
             ports: [{{containerPort: 8080}}]\n          resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}\n          \
             env: [{{name: TEAM, value: team-{index:02}}}]\n"
        );
    }
    out
}

/// The large release as a fleet tree: one app per namespace.
pub fn fleet_tree() -> anyhow::Result<FleetTree> {
    fleet_tree_for(FLEET, AGENT_PREFIX)
}

/// The large release as the fleet `fleet`, its namespaces named `prefix-NN`.
pub fn fleet_tree_for(fleet_name: &str, prefix: &str) -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    let mut fleet = format!("fleet: {fleet_name}\napps:\n");
    for index in 0..NAMESPACES {
        let _ = write!(
            fleet,
            "  - name: team-{index:02}\n    path: apps/team-{index:02}\n"
        );
        tree.write(
            &format!("apps/team-{index:02}/objects.yaml"),
            &namespace_manifests(prefix, index, "${cluster.name}"),
        )?;
    }
    tree.write("fleet.yaml", &fleet)?;
    Ok(tree)
}

/// Fleet name of the bare client's objects: their Windvane labels say `windvane.io/fleet: bare`, so no
/// agent of the benchmark watches them.
const BARE_FLEET: &str = "bare";

/// The large release in the namespaces `prefix-*` as the agent sends it, for an in-process client: rendered
/// for [`CLUSTER`] by the agent's own pipeline ([`cluster_share_into`], Windvane's labels included), so the
/// API server is asked to do the same work for both; the Namespaces first, then the rest.
pub fn rendered_objects(prefix: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let tree = fleet_tree_for(BARE_FLEET, prefix)?;
    let bundle = load_fleet_dir(tree.path(), BundleLimits::default())?;
    let cluster = ClusterIdentity {
        name: CLUSTER.to_owned(),
        labels: Default::default(),
    };
    let mut namespaces = Vec::new();
    let mut rest = Vec::new();
    for share in cluster_share_into(bundle, &cluster, |object| object.body) {
        for body in share.objects? {
            if body["kind"] == "Namespace" {
                namespaces.push(body);
            } else {
                rest.push(body);
            }
        }
    }
    namespaces.extend(rest);
    anyhow::ensure!(
        namespaces.len() == OBJECTS,
        "rendered {} objects, expected {OBJECTS}",
        namespaces.len()
    );
    Ok(namespaces)
}

/// The large release as plain manifests for kubectl, one file per namespace (its Namespace first, so
/// kubectl, which applies files in name order and objects in file order, creates it before its objects).
pub fn write_kubectl_manifests(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for index in 0..NAMESPACES {
        std::fs::write(
            dir.join(format!("{index:02}.yaml")),
            namespace_manifests(KUBECTL_PREFIX, index, CLUSTER),
        )?;
    }
    Ok(())
}

/// The small release: a Namespace, three ConfigMaps and a Deployment.
pub fn tiny_fleet_tree() -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        &format!("fleet: {TINY_FLEET}\napps:\n  - name: tiny\n    path: tiny\n"),
    )?;
    let mut manifests = "apiVersion: v1\nkind: Namespace\nmetadata: {name: tiny}\n".to_owned();
    for cm in 0..3 {
        let _ = write!(
            manifests,
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings-{cm}, namespace: tiny}}\n\
             data: {{mode: strict, cluster: '${{cluster.name}}'}}\n"
        );
    }
    manifests.push_str(
        "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: tiny}\nspec:\n  \
         replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    \
         spec:\n      containers: [{name: web, image: registry.example.com/web:1.0}]\n",
    );
    tree.write("tiny/objects.yaml", &manifests)?;
    Ok(tree)
}

/// One CustomResourceDefinition of about 300 KB: a structural schema of many documented string
/// properties, the shape that makes real operators' CRDs large.
fn big_crd(index: usize) -> String {
    let group = format!("g{index:02}.bench.example.com");
    let mut out = format!(
        "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  \
         name: widgets.{group}\nspec:\n  group: {group}\n  scope: Namespaced\n  names:\n    \
         plural: widgets\n    singular: widget\n    kind: Widget\n    listKind: WidgetList\n  versions:\n    \
         - name: v1\n      served: true\n      storage: true\n      schema:\n        openAPIV3Schema:\n          \
         type: object\n          properties:\n            spec:\n              type: object\n              \
         properties:\n"
    );
    for property in 0..BIG_CRD_PROPERTIES {
        let _ = write!(
            out,
            "                field{property:04}:\n                  type: string\n                  \
             description: \"Setting {property} of widget group {index}. {}\"\n",
            "It is documented at length, as generated API references are. ".repeat(3)
        );
    }
    out
}

/// The big release as a fleet tree: one app, its Namespace, CRDs, ConfigMaps and Deployments.
pub fn big_fleet_tree() -> anyhow::Result<FleetTree> {
    let tree = FleetTree::new()?;
    tree.write(
        "fleet.yaml",
        &format!("fleet: {BIG_FLEET}\napps:\n  - name: operator\n    path: operator\n"),
    )?;
    let ns = BIG_NAMESPACE;
    let mut manifests = format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n");
    for crd in 0..BIG_CRDS {
        let _ = write!(manifests, "---\n{}", big_crd(crd));
    }
    for cm in 0..BIG_CONFIG_MAPS {
        let _ = write!(
            manifests,
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {ns}}}\ndata:\n  \
             cluster: '${{cluster.name}}'\n",
            name = config_map_name(cm)
        );
        for key in 0..96 {
            let _ = writeln!(
                manifests,
                "  key-{key}: {}",
                config_value(cm % 100, cm, key)
            );
        }
    }
    for deployment in 0..BIG_DEPLOYMENTS {
        let name = format!("controller-{deployment:02}");
        let _ = write!(
            manifests,
            "---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  \
             replicas: 1\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    \
             metadata: {{labels: {{app: {name}}}}}\n    spec:\n      containers:\n        - name: manager\n          \
             image: registry.example.com/operator:2.{deployment}\n          \
             resources: {{requests: {{cpu: 10m, memory: 16Mi}}}}\n"
        );
    }
    tree.write("operator/objects.yaml", &manifests)?;
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_large_release_has_a_thousand_objects_in_ten_namespaces() -> anyhow::Result<()> {
        assert_eq!(OBJECTS, 1_000);
        let tree = fleet_tree()?;
        let bundle = load_fleet_dir(tree.path(), BundleLimits::default())?;
        let objects: usize = bundle.apps.iter().map(|a| a.manifests.len()).sum();
        assert_eq!((bundle.apps.len(), objects), (NAMESPACES, OBJECTS));
        let tiny = tiny_fleet_tree()?;
        let bundle = load_fleet_dir(tiny.path(), BundleLimits::default())?;
        assert_eq!(bundle.apps[0].manifests.len(), TINY_OBJECTS);
        Ok(())
    }

    #[test]
    fn the_bare_client_sends_what_the_agent_renders_namespaces_first() -> anyhow::Result<()> {
        let objects = rendered_objects("bare7")?;
        assert!(
            objects[..NAMESPACES]
                .iter()
                .all(|o| o["kind"] == "Namespace")
        );
        assert!(
            objects[NAMESPACES..]
                .iter()
                .all(|o| o["kind"] != "Namespace")
        );
        let config_map = objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap")
            .expect("a ConfigMap");
        assert_eq!(config_map["metadata"]["namespace"], "bare7-00");
        assert_eq!(config_map["data"]["cluster"], CLUSTER);
        let labels = &config_map["metadata"]["labels"];
        assert_eq!(
            labels[windvane_shared::decide::desired::FLEET_LABEL],
            BARE_FLEET
        );
        assert_eq!(
            labels[windvane_shared::decide::desired::APP_LABEL],
            "team-00"
        );
        Ok(())
    }

    #[test]
    fn the_big_release_is_about_five_megabytes_with_ten_large_crds() -> anyhow::Result<()> {
        let crd = big_crd(0);
        assert!(
            (250_000..350_000).contains(&crd.len()),
            "{} bytes",
            crd.len()
        );
        let tree = big_fleet_tree()?;
        let bundle = load_fleet_dir(tree.path(), BundleLimits::default())?;
        assert_eq!(bundle.apps[0].manifests.len(), BIG_OBJECTS);
        let size = bundle.to_json_bytes().len();
        assert!((4_500_000..6_000_000).contains(&size), "{size} bytes");
        Ok(())
    }
}
