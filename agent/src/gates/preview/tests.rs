use serde_json::{Value, json};
use windvane_shared::decide::desired::cluster_share_into;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::Bundle;
use windvane_shared::wire::heartbeat::ChangeSummary;

use super::change_summary;
use crate::apply::desired::Desired;
use crate::apply::inventory::{Inventory, InventoryEntry, ObjectKey};

fn config_map(name: &str, namespace: Option<&str>, mode: &str) -> Value {
    let mut metadata = json!({"name": name});
    if let Some(namespace) = namespace {
        metadata["namespace"] = json!(namespace);
    }
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": {"mode": mode}})
}

/// A bundle of apps, each `(name, prune, app namespace, objects)`.
fn bundle(apps: &[(&str, bool, Option<&str>, Vec<Value>)]) -> Bundle {
    let apps: Vec<Value> = apps
        .iter()
        .map(|(name, prune, namespace, objects)| {
            let manifests: Vec<Value> = objects
                .iter()
                .enumerate()
                .map(|(document, object)| json!({"file": format!("{name}/all.yaml"), "document": document, "object": object}))
                .collect();
            let mut app = json!({"name": name, "policy": {"prune": prune}, "manifests": manifests});
            if let Some(namespace) = namespace {
                app["namespace"] = json!(namespace);
            }
            app
        })
        .collect();
    serde_json::from_value(
        json!({"apiVersion": "windvane.io/bundle/v1", "fleet": "acme", "apps": apps}),
    )
    .expect("bundle")
}

fn identity() -> ClusterIdentity {
    ClusterIdentity {
        name: "eu-1".to_owned(),
        labels: Default::default(),
    }
}

/// The inventory a complete sync of `bundle` leaves: every object applied, namespaced ones without a
/// namespace placed in their app's (or `default`).
fn applied(bundle: Bundle) -> Inventory {
    let mut inventory = Inventory::default();
    for share in cluster_share_into(bundle, &identity(), Desired::of) {
        for mut object in share.objects.expect("renders") {
            if object.id.namespace.is_none() {
                let namespace = object
                    .default_namespace
                    .clone()
                    .unwrap_or("default".to_owned());
                object.set_namespace(&namespace);
            }
            let entry = InventoryEntry {
                app: object.app.clone(),
                api_version: object.id.api_version.clone(),
                kind: object.id.kind.clone(),
                namespace: object.id.namespace.clone(),
                name: object.id.name.clone(),
                prune: object.prune,
                applied_hash: object.body_hash(),
                owned_digest: None,
                orphaned: false,
                done: None,
            };
            inventory.entries.insert(ObjectKey::of(&object.id), entry);
        }
    }
    inventory
}

fn release_one() -> Bundle {
    bundle(&[
        (
            "web",
            true,
            Some("web"),
            vec![
                config_map("settings", None, "live"),
                config_map("flags", Some("shared"), "on"),
                config_map("legacy", None, "old"),
            ],
        ),
        (
            "tools",
            false,
            None,
            vec![config_map("kept", Some("tools"), "x")],
        ),
    ])
}

#[test]
fn the_release_already_applied_changes_nothing() {
    let inventory = applied(release_one());
    assert_eq!(
        change_summary(&inventory, release_one(), &identity()),
        ChangeSummary::default()
    );
}

#[test]
fn counts_what_would_be_created_updated_and_pruned() {
    let inventory = applied(release_one());
    let next = bundle(&[
        (
            "web",
            true,
            Some("web"),
            vec![
                // Unchanged, although it names no namespace: it is where the app's namespace put it.
                config_map("settings", None, "live"),
                config_map("flags", Some("shared"), "off"),
                config_map("new", None, "fresh"),
                // "legacy" left an app that prunes.
            ],
        ),
        // "kept" left an app that does not prune: orphaned, not pruned.
        ("tools", false, None, vec![]),
    ]);
    assert_eq!(
        change_summary(&inventory, next, &identity()),
        ChangeSummary {
            create: 1,
            update: 1,
            prune: 1
        }
    );
}

#[test]
fn an_app_that_does_not_render_prunes_nothing() {
    let inventory = applied(release_one());
    let broken = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "namespace": "web"}, "data": {"mode": "${values.missing}"}});
    let next = bundle(&[
        ("web", true, Some("web"), vec![broken]),
        (
            "tools",
            false,
            None,
            vec![config_map("kept", Some("tools"), "x")],
        ),
    ]);
    assert_eq!(
        change_summary(&inventory, next, &identity()),
        ChangeSummary::default()
    );
}
