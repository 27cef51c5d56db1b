//! Maintenance windows on the agent: which apps of a new release have windows that may hold it, what to
//! report while they do, and which apps only report drift right now. The windows come from the signed
//! bundle (`windows:` of each app, [`windvane_shared::spec::window`], which judges them); the gate
//! ([`crate::gates::wave::run`]) holds a release until every app it changes is inside its windows, and the sync
//! ([`crate::engine`]) turns healing off for the apps in a `heal: report` deny window. Pure.
//!
//! A release is one unit on a cluster (one serial applied, one inventory): a window of any app the release
//! changes holds the whole release for this cluster; apps the release leaves as they were never hold it.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::format::bundle::Bundle;
use windvane_shared::spec::selector::Labels;
use windvane_shared::spec::window::{self, HealInWindow, Window, WindowDecision};

/// The windows of one app that a new release changes.
#[derive(Debug, Clone, PartialEq)]
pub struct AppWindows {
    pub app: String,
    pub windows: Vec<Window>,
}

/// Each app of this cluster's share that has windows, by name, to the digest of its definition in the
/// bundle (its manifests, values, policy, windows): two releases change an app when its digests differ. Only
/// those apps, since only their windows can hold a release: an app that gains windows is new to this map,
/// hence changed, as it should be. Digesting every app would serialize the whole release again on each
/// acceptance, on the first sync's path.
pub fn app_digests(bundle: &Bundle, labels: &Labels) -> BTreeMap<String, String> {
    bundle
        .apps
        .iter()
        .filter(|app| !app.windows.is_empty() && app.selector.matches(labels))
        .map(|app| {
            let json = serde_json::to_vec(app).unwrap_or_default();
            (app.name.clone(), sha256_hex(&json))
        })
        .collect()
}

/// The windows of the apps of `bundle` (this cluster's share) that differ from `enforced` (the digests of
/// the release applied now; empty before the first).
pub fn changed_app_windows(
    enforced: &BTreeMap<String, String>,
    bundle: &Bundle,
    labels: &Labels,
) -> Vec<AppWindows> {
    let digests = app_digests(bundle, labels);
    bundle
        .apps
        .iter()
        .filter(|app| !app.windows.is_empty())
        .filter(|app| {
            digests
                .get(&app.name)
                .is_some_and(|d| enforced.get(&app.name) != Some(d))
        })
        .map(|app| AppWindows {
            app: app.name.clone(),
            windows: app.windows.clone(),
        })
        .collect()
}

/// Why the release waits for a window at `now`, and when to look again; `None` when every app it changes is
/// inside its windows.
pub fn window_wait(apps: &[AppWindows], now: Timestamp) -> Option<(String, Option<Timestamp>)> {
    let mut reasons = Vec::new();
    let mut look_again: Option<Timestamp> = None;
    let mut never = false;
    for app in apps {
        if let WindowDecision::Closed { reason, reopens_at } = window::decide(&app.windows, now) {
            reasons.push(format!("app {}: {reason}", app.app));
            match reopens_at {
                // The release can go only once all of them are open: look again at the latest.
                Some(at) => look_again = Some(look_again.map_or(at, |t| t.max(at))),
                None => never = true,
            }
        }
    }
    if reasons.is_empty() {
        return None;
    }
    let message = format!("Pending (maintenance window): {}", reasons.join("; "));
    Some((message, if never { None } else { look_again }))
}

/// The apps of this cluster's share in a deny window that says `heal: report` at `now`, and the next time
/// that may change (for the engine to sync again then).
pub fn report_only_apps(
    bundle: &Bundle,
    labels: &Labels,
    now: Timestamp,
) -> (BTreeSet<String>, Option<Timestamp>) {
    let mut apps = BTreeSet::new();
    let mut next: Option<Timestamp> = None;
    for app in bundle
        .apps
        .iter()
        .filter(|app| app.selector.matches(labels))
        .filter(|app| app.windows.iter().any(|w| w.heal == HealInWindow::Report))
    {
        if !window::heals(&app.windows, now) {
            apps.insert(app.name.clone());
        }
        if let Some(change) = window::next_change(&app.windows, now) {
            next = Some(next.map_or(change, |n| n.min(change)));
        }
    }
    (apps, next)
}

#[cfg(test)]
mod tests;
