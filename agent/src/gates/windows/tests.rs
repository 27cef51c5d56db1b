use std::collections::BTreeMap;

use jiff::Timestamp;
use serde_json::{Value, json};
use windvane_shared::format::bundle::Bundle;
use windvane_shared::spec::selector::Labels;

use super::*;

fn at(text: &str) -> Timestamp {
    text.parse().expect("timestamp")
}

/// Deny 10:00–11:00 UTC every day; `heal` as given.
fn deny_ten_to_eleven(heal: &str) -> Value {
    json!({"kind": "deny", "schedule": "0 10 * * *", "duration": "1h", "timeZone": "UTC", "heal": heal})
}

/// A bundle of apps `(name, data value, windows)`, each one ConfigMap.
fn bundle(apps: &[(&str, &str, Vec<Value>)]) -> Bundle {
    let apps: Vec<Value> = apps
        .iter()
        .map(|(name, mode, windows)| {
            let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "default"}, "data": {"mode": mode}});
            json!({"name": name, "windows": windows,
                "manifests": [{"file": format!("{name}.yaml"), "document": 0, "object": object}]})
        })
        .collect();
    serde_json::from_value(
        json!({"apiVersion": "windvane.io/bundle/v1", "fleet": "acme", "apps": apps}),
    )
    .expect("bundle")
}

fn names(apps: &[AppWindows]) -> Vec<&str> {
    apps.iter().map(|a| a.app.as_str()).collect()
}

#[test]
fn only_the_apps_a_release_changes_bring_their_windows() {
    let labels = Labels::default();
    let one = bundle(&[
        ("payments", "1", vec![deny_ten_to_eleven("heal")]),
        ("search", "1", vec![deny_ten_to_eleven("heal")]),
        ("tools", "1", vec![]),
    ]);
    let two = bundle(&[
        ("payments", "2", vec![deny_ten_to_eleven("heal")]),
        ("search", "1", vec![deny_ten_to_eleven("heal")]),
        ("tools", "2", vec![]),
    ]);
    let enforced = app_digests(&one, &labels);
    // Apps without windows can never hold a release: they are not digested.
    assert_eq!(
        enforced.keys().map(String::as_str).collect::<Vec<_>>(),
        ["payments", "search"]
    );
    assert_eq!(
        names(&changed_app_windows(&enforced, &two, &labels)),
        ["payments"]
    );
    assert!(changed_app_windows(&enforced, &one, &labels).is_empty());
    // Before any release, every app with windows is new.
    assert_eq!(
        names(&changed_app_windows(&BTreeMap::new(), &two, &labels)),
        ["payments", "search"]
    );
}

#[test]
fn a_deny_window_holds_the_release_until_it_ends() {
    let labels = Labels::default();
    let two = bundle(&[("payments", "2", vec![deny_ten_to_eleven("heal")])]);
    let apps = changed_app_windows(&BTreeMap::new(), &two, &labels);
    let (message, look_again) = window_wait(&apps, at("2026-12-05T10:30:00Z")).expect("held");
    assert!(
        message.starts_with("Pending (maintenance window): app payments: deny window"),
        "{message}"
    );
    assert_eq!(look_again, Some(at("2026-12-05T11:00:00Z")));
    assert_eq!(window_wait(&apps, at("2026-12-05T11:00:00Z")), None);
    assert_eq!(window_wait(&apps, at("2026-12-05T09:59:59Z")), None);
}

#[test]
fn two_held_apps_are_looked_at_again_when_the_later_window_ends() {
    let later =
        json!({"kind": "deny", "schedule": "30 10 * * *", "duration": "1h", "timeZone": "UTC"});
    let two = bundle(&[
        ("payments", "2", vec![deny_ten_to_eleven("heal")]),
        ("search", "2", vec![later]),
    ]);
    let apps = changed_app_windows(&BTreeMap::new(), &two, &Labels::default());
    let (message, look_again) = window_wait(&apps, at("2026-12-05T10:45:00Z")).expect("held");
    assert!(
        message.contains("app payments") && message.contains("app search"),
        "{message}"
    );
    assert_eq!(look_again, Some(at("2026-12-05T11:30:00Z")));
}

#[test]
fn a_report_deny_window_turns_healing_off_for_its_app_only_while_it_lasts() {
    let two = bundle(&[
        ("payments", "2", vec![deny_ten_to_eleven("report")]),
        ("search", "2", vec![deny_ten_to_eleven("heal")]),
    ]);
    let labels = Labels::default();
    let (inside, change) = report_only_apps(&two, &labels, at("2026-12-05T10:30:00Z"));
    assert_eq!(inside.into_iter().collect::<Vec<_>>(), ["payments"]);
    assert_eq!(change, Some(at("2026-12-05T11:00:00Z")));
    let (outside, change) = report_only_apps(&two, &labels, at("2026-12-05T12:00:00Z"));
    assert!(outside.is_empty());
    assert_eq!(change, Some(at("2026-12-06T10:00:00Z")));
}
