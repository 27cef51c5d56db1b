//! What replacing one bundle by another changes, as lines for a person to read before a release is signed
//! (`windvane rollback` prints them). Pure: two bundles in, lines out. Objects are compared per app by
//! identity (`kind namespace/name`), over the app's own manifests and every rendered variant.

use std::collections::BTreeMap;

use windvane_shared::format::bundle::{App, Bundle, ObjectRef};

/// Most objects listed per app; the rest are counted.
const MAX_LISTED: usize = 20;

/// Each object of `app` by identity, with its JSON (more than one when variants differ).
fn objects(app: &App) -> BTreeMap<String, Vec<String>> {
    let variants = app.rendered.iter().flat_map(|r| &r.variants);
    let manifests = app
        .manifests
        .iter()
        .chain(variants.flat_map(|v| &v.manifests));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for manifest in manifests {
        let id = ObjectRef::of(&manifest.object).map_or_else(
            || format!("{} document {}", manifest.file, manifest.document),
            |r| r.to_string(),
        );
        out.entry(id).or_default().push(manifest.object.to_string());
    }
    for texts in out.values_mut() {
        texts.sort();
    }
    out
}

/// The changes from `from` to `to`: apps added, removed and changed, with the objects added (`+`), removed
/// (`-`) and changed (`~`) in each, and whether the rollout plan differs.
pub fn bundle_changes(from: &Bundle, to: &Bundle) -> Vec<String> {
    let before: BTreeMap<&str, &App> = from.apps.iter().map(|a| (a.name.as_str(), a)).collect();
    let after: BTreeMap<&str, &App> = to.apps.iter().map(|a| (a.name.as_str(), a)).collect();
    let mut lines = Vec::new();
    let mut unchanged = 0;
    let names: std::collections::BTreeSet<&str> =
        before.keys().chain(after.keys()).copied().collect();
    for name in names {
        match (before.get(name), after.get(name)) {
            (Some(app), None) => lines.push(format!(
                "- app {name} ({} objects removed)",
                app.object_count()
            )),
            (None, Some(app)) => lines.push(format!(
                "+ app {name} ({} objects added)",
                app.object_count()
            )),
            (Some(old), Some(new)) if old == new => unchanged += 1,
            (Some(old), Some(new)) => lines.extend(app_changes(name, old, new)),
            (None, None) => {}
        }
    }
    if from.rollout != to.rollout {
        lines.push("~ the rollout plan differs (the target's own plan is signed)".to_owned());
    }
    if unchanged > 0 {
        lines.push(format!("{unchanged} app(s) unchanged"));
    }
    if lines.is_empty() {
        lines.push("no change".to_owned());
    }
    lines
}

fn app_changes(name: &str, old: &App, new: &App) -> Vec<String> {
    let (before, after) = (objects(old), objects(new));
    let mut changes: Vec<String> = Vec::new();
    for (id, texts) in &before {
        match after.get(id) {
            None => changes.push(format!("- {id}")),
            Some(other) if other != texts => changes.push(format!("~ {id}")),
            Some(_) => {}
        }
    }
    changes.extend(
        after
            .keys()
            .filter(|id| !before.contains_key(*id))
            .map(|id| format!("+ {id}")),
    );
    let count = |sign: char| changes.iter().filter(|c| c.starts_with(sign)).count();
    let mut lines = vec![format!(
        "~ app {name}: {} added, {} removed, {} changed{}",
        count('+'),
        count('-'),
        count('~'),
        if changes.is_empty() {
            " (settings differ)"
        } else {
            ""
        }
    )];
    let listed = changes.len().min(MAX_LISTED);
    lines.extend(changes[..listed].iter().map(|c| format!("    {c}")));
    if changes.len() > listed {
        lines.push(format!("    … and {} more", changes.len() - listed));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle(apps: serde_json::Value) -> Bundle {
        serde_json::from_value(serde_json::json!({
            "apiVersion": windvane_shared::format::bundle::BUNDLE_API_VERSION, "fleet": "acme", "apps": apps
        }))
        .expect("bundle")
    }

    fn config_map(name: &str, greeting: &str) -> serde_json::Value {
        serde_json::json!({"file": "web.yaml", "document": 0, "object": {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "web"}, "data": {"greeting": greeting}
        }})
    }

    #[test]
    fn changes_name_apps_and_objects_added_removed_and_changed() {
        let from = bundle(serde_json::json!([
            {"name": "web", "manifests": [config_map("a", "hi"), config_map("b", "x")]},
            {"name": "old", "manifests": [config_map("o", "x")]},
            {"name": "same", "manifests": [config_map("s", "x")]},
        ]));
        let to = bundle(serde_json::json!([
            {"name": "web", "manifests": [config_map("a", "hello"), config_map("c", "x")]},
            {"name": "new", "manifests": [config_map("n", "x")]},
            {"name": "same", "manifests": [config_map("s", "x")]},
        ]));
        let lines = bundle_changes(&from, &to);
        assert_eq!(
            lines,
            [
                "+ app new (1 objects added)",
                "- app old (1 objects removed)",
                "~ app web: 1 added, 1 removed, 1 changed",
                "    ~ ConfigMap web/a",
                "    - ConfigMap web/b",
                "    + ConfigMap web/c",
                "1 app(s) unchanged",
            ],
            "{lines:#?}"
        );
        assert_eq!(bundle_changes(&from, &from), ["3 app(s) unchanged"]);
    }
}
