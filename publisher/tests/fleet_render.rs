//! From a fleet tree on disk to what one cluster gets: load, select, render.

use std::fs;

use serde_json::json;
use windvane_publisher::source::load_fleet_dir;
use windvane_shared::decide::desired::{DesiredObject, all_or_first_error, cluster_share};
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::BundleLimits;
use windvane_shared::spec::selector::{LabelSelector, parse_label_assignment};

#[test]
fn each_cluster_gets_its_own_rendering() {
    let dir = tempfile::tempdir().expect("temp dir");
    let root = dir.path();
    fs::write(
        root.join("fleet.yaml"),
        "fleet: acme\napps:\n  - name: monitoring\n    path: apps/monitoring\n    selector: {matchLabels: {env: prod}}\n    \
         values: {retention: 15d, replicas: 2}\n    customizations:\n      - selector: {matchLabels: {region: eu}}\n        \
         values: {retention: 30d}\n  - name: debug\n    path: apps/debug\n    selector: {matchLabels: {env: dev}}\n",
    )
    .expect("write");
    fs::create_dir_all(root.join("apps/monitoring")).expect("mkdir");
    fs::create_dir_all(root.join("apps/debug")).expect("mkdir");
    fs::write(
        root.join("apps/monitoring/prometheus.yaml"),
        "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: prometheus-${cluster.name}\n  namespace: monitoring\n\
         spec:\n  replicas: ${values.replicas}\n  template:\n    spec:\n      containers:\n        - name: prometheus\n          \
         args: [\"--storage.tsdb.retention.time=${values.retention}\", \"--label=${cluster.labels.topology.kubernetes.io/zone}\"]\n",
    )
    .expect("write");
    fs::write(
        root.join("apps/debug/cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: debug}\n",
    )
    .expect("write");
    let bundle = load_fleet_dir(root, BundleLimits::default()).unwrap_or_else(|e| panic!("{e}"));

    let cluster = |name: &str, labels: &[&str]| ClusterIdentity {
        name: name.to_owned(),
        labels: labels
            .iter()
            .map(|l| parse_label_assignment(l).unwrap_or_else(|e| panic!("{e}")))
            .collect(),
    };
    let eu = cluster(
        "eu-1",
        &["env=prod", "region=eu", "topology.kubernetes.io/zone=eu-1a"],
    );
    let rendered = render(&bundle, &eu).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rendered.len(), 1);
    let object = &rendered[0];
    assert_eq!(
        object.id.to_string(),
        "StatefulSet monitoring/prometheus-eu-1"
    );
    assert_eq!(object.body["spec"]["replicas"], json!(2));
    assert_eq!(
        object.body["spec"]["template"]["spec"]["containers"][0]["args"],
        json!(["--storage.tsdb.retention.time=30d", "--label=eu-1a"])
    );

    // A cluster without the zone label: an error naming the variable, not an empty string.
    let us = cluster("us-1", &["env=prod", "region=us"]);
    let message = render(&bundle, &us).unwrap_err().to_string();
    assert!(
        message.contains("${cluster.labels.topology.kubernetes.io/zone}"),
        "{message}"
    );
    assert!(
        message.contains("/spec/template/spec/containers/0/args/1"),
        "{message}"
    );

    let dev = cluster("dev-1", &["env=dev"]);
    let rendered = render(&bundle, &dev).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        rendered.iter().map(|o| o.app.as_str()).collect::<Vec<_>>(),
        vec!["debug"]
    );

    // The fleet page filters clusters with the same selectors.
    let filter =
        LabelSelector::parse("env=prod,region notin (us)").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        filter.matches(&eu.labels) && !filter.matches(&us.labels) && !filter.matches(&dev.labels)
    );
}

fn render(
    bundle: &windvane_shared::format::bundle::Bundle,
    cluster: &ClusterIdentity,
) -> windvane_shared::Result<Vec<DesiredObject>> {
    all_or_first_error(cluster_share(bundle, cluster))
}
