//! The inventory — every object Windvane applied on this cluster, by app, with the policy it was applied under
//! — and the prune decision made from it. The inventory is persisted in the cluster ([`crate::kube::state`]) so
//! that a restarted agent still knows what it owns; the decision is pure and made only from the previous
//! inventory, the new release and how its apply went.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use windvane_shared::format::bundle::ObjectRef;

/// An object's identity across API versions: group, kind, namespace, name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ObjectKey {
    pub group: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
}

impl ObjectKey {
    /// The key of an object reference.
    pub fn of(id: &ObjectRef) -> Self {
        Self {
            group: id.group().to_owned(),
            kind: id.kind.clone(),
            namespace: id.namespace.clone(),
            name: id.name.clone(),
        }
    }
}

/// One object Windvane applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryEntry {
    pub app: String,
    pub api_version: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    /// Whether the object may be pruned when it leaves the release (app policy and annotation, at apply time).
    pub prune: bool,
    /// SHA-256 of the body last applied: an unchanged body with an intact owned-field set needs no write.
    pub applied_hash: String,
    /// Digest of the fields Windvane owned after that apply ([`crate::heal::drift::Baseline::digest`]). After a
    /// restart, a live object owning the same fields is known intact and is not written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_digest: Option<String>,
    /// Left the release but was not pruned (prune off or disabled): reported until someone removes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub orphaned: bool,
    /// A run-once object that finished for the body `applied_hash` ([`crate::apply::run_once`]): gone from the
    /// cluster, it is not applied again until a release changes its body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done: Option<crate::apply::run_once::Finished>,
}

impl InventoryEntry {
    /// The object reference to address the object with.
    pub fn object_ref(&self) -> ObjectRef {
        ObjectRef {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }

    /// The version-independent key.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::of(&self.object_ref())
    }
}

/// Everything applied, and the release serial that last applied completely.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inventory {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_serial: Option<u64>,
    #[serde(with = "entries_as_list")]
    pub entries: BTreeMap<ObjectKey, InventoryEntry>,
}

/// The entries are stored as a list (JSON object keys must be strings); the key is derived from each entry.
mod entries_as_list {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::{InventoryEntry, ObjectKey};

    pub fn serialize<S: Serializer>(
        entries: &BTreeMap<ObjectKey, InventoryEntry>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(entries.values())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<ObjectKey, InventoryEntry>, D::Error> {
        let list = Vec::<InventoryEntry>::deserialize(deserializer)?;
        Ok(list.into_iter().map(|entry| (entry.key(), entry)).collect())
    }
}

impl Inventory {
    /// Entries that are still part of the release (not orphaned).
    pub fn managed(&self) -> impl Iterator<Item = &InventoryEntry> {
        self.entries.values().filter(|e| !e.orphaned)
    }
}

/// How an apply of a release went, as far as pruning cares.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// Apps of the release that did not apply completely, each with why ([`incomplete_apps`]). Their prunes
    /// wait; every other app's go ahead.
    pub incomplete: BTreeMap<String, String>,
    /// The release holds no object at all for this cluster.
    pub empty: bool,
    /// The signed pointer allows an empty release to remove everything.
    pub allow_empty: bool,
}

/// The apps that did not apply completely, with why, for [`ReleaseOutcome::incomplete`]: from every
/// object's app and whether it applied, and the apps that failed to render (all their objects are missing
/// from the release, so none of them may be taken as removed).
pub fn incomplete_apps<'a>(
    objects: impl IntoIterator<Item = (&'a str, bool)>,
    unrendered: impl IntoIterator<Item = &'a str>,
) -> BTreeMap<String, String> {
    let mut failed: BTreeMap<&str, usize> = BTreeMap::new();
    for (app, applied) in objects {
        if !applied {
            *failed.entry(app).or_default() += 1;
        }
    }
    let mut incomplete: BTreeMap<String, String> = failed
        .into_iter()
        .map(|(app, n)| {
            let objects = if n == 1 { "object" } else { "objects" };
            (app.to_owned(), format!("{n} {objects} failed to apply"))
        })
        .collect();
    for app in unrendered {
        incomplete.insert(app.to_owned(), "the app failed to render".to_owned());
    }
    incomplete
}

/// What to do with objects that left the release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrunePlan {
    /// Objects to delete (background propagation).
    pub delete: Vec<InventoryEntry>,
    /// Objects to keep and report as orphaned (their app does not prune, or they are marked disabled).
    pub orphan: Vec<InventoryEntry>,
    /// Objects that would be deleted but wait: they stay in the inventory, still managed.
    pub postponed: Vec<InventoryEntry>,
    /// Apps whose prunes wait for their own complete apply, each with the message for the status
    /// ("prune of app a postponed: 1 object failed to apply").
    pub postponed_apps: BTreeMap<String, String>,
    /// Why nothing at all is deleted this time (an empty release, the deletion budget).
    pub held_back: Option<String>,
}

impl PrunePlan {
    /// Every reason a prune waits, for the status: release-wide first, then per app.
    pub fn reasons(&self) -> impl Iterator<Item = &String> {
        self.held_back.iter().chain(self.postponed_apps.values())
    }
}

/// Decides what leaves the cluster. Rules: only objects that left the release; only those applied with
/// prune on; only once their own app applied completely (one failing app never holds another's prunes
/// back); never from an empty release unless it allows it; never more than `budget_fraction` of the
/// managed inventory at once (rounded up, so one object can always go).
pub fn plan_prune(
    previous: &Inventory,
    desired: &BTreeSet<ObjectKey>,
    outcome: &ReleaseOutcome,
    budget_fraction: f64,
) -> PrunePlan {
    let gone: Vec<&InventoryEntry> = previous
        .managed()
        .filter(|entry| !desired.contains(&entry.key()))
        .collect();
    let (to_delete, orphan): (Vec<&InventoryEntry>, Vec<&InventoryEntry>) =
        gone.into_iter().partition(|e| e.prune);
    let (waiting, ready): (Vec<&InventoryEntry>, Vec<&InventoryEntry>) = to_delete
        .into_iter()
        .partition(|e| outcome.incomplete.contains_key(&e.app));
    let mut plan = PrunePlan {
        orphan: orphan.into_iter().cloned().collect(),
        postponed: waiting.iter().map(|e| (*e).clone()).collect(),
        ..PrunePlan::default()
    };
    for entry in waiting {
        let why = &outcome.incomplete[&entry.app];
        plan.postponed_apps
            .entry(entry.app.clone())
            .or_insert_with(|| format!("prune of app {} postponed: {why}", entry.app));
    }
    if ready.is_empty() {
        return plan;
    }
    let managed = previous.managed().count();
    let budget = (budget_fraction * managed as f64).ceil() as usize;
    plan.held_back = if outcome.empty && !outcome.allow_empty {
        Some(format!(
            "the release is empty and does not allow it; refusing to prune {} objects",
            ready.len()
        ))
    } else if ready.len() > budget {
        Some(format!(
            "pruning {} of {managed} objects exceeds the deletion budget of {budget} ({:.0}%); refusing",
            ready.len(),
            budget_fraction * 100.0
        ))
    } else {
        None
    };
    if plan.held_back.is_none() {
        plan.delete = ready.into_iter().cloned().collect();
    } else {
        plan.postponed.extend(ready.into_iter().cloned());
    }
    plan
}

/// How one desired object's apply went, as the inventory records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Applied (written or found intact): its entry as of this apply. An entry without an owned-field
    /// digest (nothing was written) keeps the previous one.
    Yes(InventoryEntry),
    /// Failed or refused: a failing object is still ours, so its previous entry (if any) stays.
    No(ObjectKey),
}

/// What became of an object the prune plan said to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pruned {
    Gone,
    /// Still there (finalizers, graceful termination) or the delete failed: it stays, and is tried again.
    Pending,
    /// Its live object says `windvane.io/prune: disabled`: kept and reported as an orphan.
    Disabled,
}

/// The inventory after a sync of release `serial`: what applied, what the prune plan kept and what its
/// deletes left behind, and the orphans still around. The release counts as completely applied (its
/// serial recorded) only when `complete` (every object applied, every app rendered) and no prune waits.
pub fn next(
    previous: &Inventory,
    applied: impl IntoIterator<Item = Applied>,
    prune: &PrunePlan,
    pruned: &BTreeMap<ObjectKey, Pruned>,
    serial: u64,
    complete: bool,
) -> Inventory {
    // Collected first and built in one go: sorting a sync's thousand entries at once costs a fraction of
    // inserting them one by one, on the path between the last apply and the inventory's write.
    let mut entries: BTreeMap<ObjectKey, InventoryEntry> = applied
        .into_iter()
        .filter_map(|outcome| match outcome {
            Applied::Yes(mut entry) => {
                let key = entry.key();
                let before = previous.entries.get(&key);
                if entry.owned_digest.is_none() {
                    entry.owned_digest = before.and_then(|e| e.owned_digest.clone());
                }
                // A run-once object stays done for as long as its body is the one that finished.
                if entry.done.is_none() {
                    entry.done = before
                        .filter(|e| e.applied_hash == entry.applied_hash)
                        .and_then(|e| e.done);
                }
                Some((key, entry))
            }
            // A failing object is still ours: its previous entry stays.
            Applied::No(key) => previous.entries.get(&key).map(|entry| (key, entry.clone())),
        })
        .collect();
    let mut prunes_wait = !prune.postponed.is_empty();
    for entry in &prune.delete {
        match pruned.get(&entry.key()).copied().unwrap_or(Pruned::Pending) {
            Pruned::Gone => {}
            Pruned::Pending => {
                prunes_wait = true;
                entries.insert(entry.key(), entry.clone());
            }
            Pruned::Disabled => {
                entries.insert(entry.key(), orphaned(entry));
            }
        }
    }
    for entry in &prune.orphan {
        entries.insert(entry.key(), orphaned(entry));
    }
    // Objects that stay out of the release only because pruning waits remain managed; orphans stay reported
    // until their object is gone. (An orphan back in the release has its entry from this sync already: every
    // desired key that the previous inventory holds is in `entries` by now.)
    let kept = prune
        .postponed
        .iter()
        .chain(previous.entries.values().filter(|e| e.orphaned));
    for entry in kept {
        entries.entry(entry.key()).or_insert_with(|| entry.clone());
    }
    Inventory {
        complete_serial: if complete && !prunes_wait {
            Some(serial)
        } else {
            previous.complete_serial
        },
        entries,
    }
}

fn orphaned(entry: &InventoryEntry) -> InventoryEntry {
    InventoryEntry {
        orphaned: true,
        ..entry.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(app: &str, name: &str, prune: bool) -> InventoryEntry {
        InventoryEntry {
            app: app.into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            namespace: Some("ns".into()),
            name: name.into(),
            prune,
            applied_hash: String::new(),
            owned_digest: None,
            orphaned: false,
            done: None,
        }
    }

    fn inventory(entries: &[InventoryEntry]) -> Inventory {
        Inventory {
            complete_serial: Some(1),
            entries: entries.iter().map(|e| (e.key(), e.clone())).collect(),
        }
    }

    fn keys(entries: &[&InventoryEntry]) -> BTreeSet<ObjectKey> {
        entries.iter().map(|e| e.key()).collect()
    }

    const COMPLETE: ReleaseOutcome = ReleaseOutcome {
        incomplete: BTreeMap::new(),
        empty: false,
        allow_empty: false,
    };

    #[test]
    fn removed_objects_are_pruned_or_orphaned_by_policy() {
        let (a, b, c) = (
            entry("x", "a", true),
            entry("x", "b", true),
            entry("y", "c", false),
        );
        let plan = plan_prune(
            &inventory(&[a.clone(), b.clone(), c.clone()]),
            &keys(&[&a]),
            &COMPLETE,
            0.5,
        );
        assert_eq!(plan.delete, vec![b]);
        assert_eq!(plan.orphan, vec![c]);
        assert_eq!(plan.held_back, None);
    }

    #[test]
    fn an_incomplete_app_postpones_only_its_own_prunes() {
        // Inventory: app a has a1, a2; app b has b1, b2; app c (prune off) has c1. Each case removes some
        // objects from the release and names the apps that did not apply completely.
        let inv = [
            entry("a", "a1", true),
            entry("a", "a2", true),
            entry("b", "b1", true),
            entry("b", "b2", true),
            entry("c", "c1", false),
        ];
        let by_name = |names: &[&str]| -> Vec<InventoryEntry> {
            names
                .iter()
                .map(|n| inv.iter().find(|e| e.name == *n).unwrap().clone())
                .collect()
        };
        struct Case {
            kept: &'static [&'static str],
            incomplete: &'static [(&'static str, &'static str)],
            delete: &'static [&'static str],
            postponed: &'static [&'static str],
            orphan: &'static [&'static str],
            messages: &'static [&'static str],
        }
        let cases = [
            // Everything applied: both removed objects go.
            Case {
                kept: &["a1", "b1", "c1"],
                incomplete: &[],
                delete: &["a2", "b2"],
                postponed: &[],
                orphan: &[],
                messages: &[],
            },
            // One object of a failed: b's removed object still goes, a's waits.
            Case {
                kept: &["a1", "b1", "c1"],
                incomplete: &[("a", "1 object failed to apply")],
                delete: &["b2"],
                postponed: &["a2"],
                orphan: &[],
                messages: &["prune of app a postponed: 1 object failed to apply"],
            },
            // a failed to render (all its objects are missing): none of them is pruned.
            Case {
                kept: &["b1", "b2", "c1"],
                incomplete: &[("a", "the app failed to render")],
                delete: &[],
                postponed: &["a1", "a2"],
                orphan: &[],
                messages: &["prune of app a postponed: the app failed to render"],
            },
            // An app that failed but removed nothing postpones nothing; orphans are not postponed.
            Case {
                kept: &["a1", "a2", "b1"],
                incomplete: &[
                    ("a", "2 objects failed to apply"),
                    ("c", "1 object failed to apply"),
                ],
                delete: &["b2"],
                postponed: &[],
                orphan: &["c1"],
                messages: &[],
            },
        ];
        for (i, case) in cases.iter().enumerate() {
            let outcome = ReleaseOutcome {
                incomplete: case
                    .incomplete
                    .iter()
                    .map(|(a, m)| ((*a).to_owned(), (*m).to_owned()))
                    .collect(),
                ..COMPLETE
            };
            let kept: BTreeSet<ObjectKey> = by_name(case.kept).iter().map(|e| e.key()).collect();
            let plan = plan_prune(&inventory(&inv), &kept, &outcome, 1.0);
            assert_eq!(plan.delete, by_name(case.delete), "case {i}: delete");
            assert_eq!(
                plan.postponed,
                by_name(case.postponed),
                "case {i}: postponed"
            );
            assert_eq!(plan.orphan, by_name(case.orphan), "case {i}: orphan");
            assert_eq!(plan.held_back, None, "case {i}");
            assert_eq!(
                plan.reasons().map(String::as_str).collect::<Vec<_>>(),
                case.messages,
                "case {i}: messages"
            );
        }
    }

    #[test]
    fn incomplete_apps_count_failures_and_render_errors() {
        let objects = [
            ("a", true),
            ("a", false),
            ("b", true),
            ("c", false),
            ("c", false),
        ];
        let incomplete = incomplete_apps(objects, ["d"]);
        assert_eq!(
            incomplete.into_iter().collect::<Vec<_>>(),
            vec![
                ("a".to_owned(), "1 object failed to apply".to_owned()),
                ("c".to_owned(), "2 objects failed to apply".to_owned()),
                ("d".to_owned(), "the app failed to render".to_owned()),
            ]
        );
        assert!(incomplete_apps([("a", true)], []).is_empty());
    }

    #[test]
    fn the_budget_counts_only_what_is_ready_and_holds_it_all_back() {
        // Four of eight objects removed; app a failed, so only b's two are ready: within a budget of 2.
        let inv: Vec<InventoryEntry> = (0..4)
            .flat_map(|i| {
                [
                    entry("a", &format!("a{i}"), true),
                    entry("b", &format!("b{i}"), true),
                ]
            })
            .collect();
        let kept: BTreeSet<ObjectKey> = inv
            .iter()
            .filter(|e| e.name.ends_with('0') || e.name.ends_with('1'))
            .map(InventoryEntry::key)
            .collect();
        let a_failed = ReleaseOutcome {
            incomplete: [("a".to_owned(), "1 object failed to apply".to_owned())].into(),
            ..COMPLETE
        };
        let plan = plan_prune(&inventory(&inv), &kept, &a_failed, 0.25);
        assert_eq!(plan.delete.len(), 2);
        assert!(plan.delete.iter().all(|e| e.app == "b"));
        assert_eq!(plan.postponed.len(), 2);
        // Everything complete: four ready exceed the budget of 2, and all four stay, managed.
        let plan = plan_prune(&inventory(&inv), &kept, &COMPLETE, 0.25);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.postponed.len(), 4);
        assert!(plan.held_back.unwrap().contains("deletion budget of 2"));
    }

    #[test]
    fn an_empty_release_prunes_only_when_it_allows_it() {
        let a = entry("x", "a", true);
        let empty = ReleaseOutcome {
            empty: true,
            ..COMPLETE
        };
        let plan = plan_prune(
            &inventory(std::slice::from_ref(&a)),
            &BTreeSet::new(),
            &empty,
            1.0,
        );
        assert!(plan.delete.is_empty() && plan.held_back.unwrap().contains("empty"));
        let allowed = ReleaseOutcome {
            allow_empty: true,
            ..empty
        };
        let plan = plan_prune(
            &inventory(std::slice::from_ref(&a)),
            &BTreeSet::new(),
            &allowed,
            1.0,
        );
        assert_eq!(plan.delete, vec![a]);
    }

    #[test]
    fn the_deletion_budget_caps_one_release() {
        let all: Vec<InventoryEntry> = (0..10)
            .map(|i| entry("x", &format!("o{i}"), true))
            .collect();
        let keep_four: BTreeSet<ObjectKey> = all[..4].iter().map(InventoryEntry::key).collect();
        let plan = plan_prune(&inventory(&all), &keep_four, &COMPLETE, 0.5);
        assert!(plan.delete.is_empty());
        assert!(plan.held_back.unwrap().contains("deletion budget of 5"));
        let keep_five: BTreeSet<ObjectKey> = all[..5].iter().map(InventoryEntry::key).collect();
        assert_eq!(
            plan_prune(&inventory(&all), &keep_five, &COMPLETE, 0.5)
                .delete
                .len(),
            5
        );
        // One object of one can always go: the budget rounds up.
        let one = [entry("x", "only", true)];
        assert_eq!(
            plan_prune(
                &inventory(&one),
                &BTreeSet::new(),
                &ReleaseOutcome {
                    allow_empty: true,
                    empty: true,
                    ..COMPLETE
                },
                0.5
            )
            .delete
            .len(),
            1
        );
    }

    #[test]
    fn the_inventory_round_trips_through_json() {
        let inventory = inventory(&[entry("x", "a", true), entry("y", "b", false)]);
        let json = serde_json::to_string(&inventory).unwrap();
        assert_eq!(serde_json::from_str::<Inventory>(&json).unwrap(), inventory);
    }

    #[test]
    fn a_run_once_object_stays_done_only_while_its_body_is_the_one_that_finished() {
        let done = InventoryEntry {
            applied_hash: "h1".into(),
            done: Some(crate::apply::run_once::Finished::Succeeded),
            ..entry("x", "certgen", true)
        };
        let previous = inventory(std::slice::from_ref(&done));
        let same = InventoryEntry {
            applied_hash: "h1".into(),
            ..entry("x", "certgen", true)
        };
        let after = next(
            &previous,
            vec![Applied::Yes(same)],
            &PrunePlan::default(),
            &BTreeMap::new(),
            2,
            true,
        );
        assert_eq!(
            after.entries[&done.key()].done,
            done.done,
            "left alone: still done"
        );
        let changed = InventoryEntry {
            applied_hash: "h2".into(),
            ..entry("x", "certgen", true)
        };
        let after = next(
            &previous,
            vec![Applied::Yes(changed)],
            &PrunePlan::default(),
            &BTreeMap::new(),
            2,
            true,
        );
        assert_eq!(
            after.entries[&done.key()].done,
            None,
            "a new body runs again"
        );
    }

    #[test]
    fn orphans_are_not_reconsidered() {
        let mut a = entry("x", "a", true);
        a.orphaned = true;
        let plan = plan_prune(&inventory(&[a]), &BTreeSet::new(), &COMPLETE, 1.0);
        assert_eq!(plan, PrunePlan::default());
    }

    #[test]
    fn the_next_inventory_keeps_what_is_still_ours_and_drops_what_is_gone() {
        let kept = entry("x", "kept", true);
        let failing = InventoryEntry {
            owned_digest: Some("before".into()),
            ..entry("x", "failing", true)
        };
        let intact = InventoryEntry {
            owned_digest: Some("owned".into()),
            ..entry("x", "intact", true)
        };
        let (gone, pending, disabled) = (
            entry("x", "gone", true),
            entry("x", "pending", true),
            entry("x", "disabled", true),
        );
        let (orphan, old_orphan) = (
            entry("y", "orphan", false),
            InventoryEntry {
                orphaned: true,
                ..entry("y", "old-orphan", false)
            },
        );
        let previous = inventory(&[
            failing.clone(),
            intact.clone(),
            gone.clone(),
            pending.clone(),
            disabled.clone(),
            orphan.clone(),
            old_orphan.clone(),
        ]);
        let plan = PrunePlan {
            delete: vec![gone.clone(), pending.clone(), disabled.clone()],
            orphan: vec![orphan.clone()],
            ..PrunePlan::default()
        };
        let applied = vec![
            Applied::Yes(kept.clone()),
            Applied::Yes(entry("x", "intact", true)),
            Applied::No(failing.key()),
            Applied::No(entry("x", "never-applied", true).key()),
        ];
        let pruned = BTreeMap::from([
            (gone.key(), Pruned::Gone),
            (pending.key(), Pruned::Pending),
            (disabled.key(), Pruned::Disabled),
        ]);
        let next = next(&previous, applied, &plan, &pruned, 7, true);
        let names: Vec<(&str, bool)> = next
            .entries
            .values()
            .map(|e| (e.name.as_str(), e.orphaned))
            .collect();
        assert_eq!(
            names,
            vec![
                ("disabled", true),
                ("failing", false),
                ("intact", false),
                ("kept", false),
                ("old-orphan", true),
                ("orphan", true),
                ("pending", false),
            ]
        );
        // Found intact (nothing written): the digest of the last write stays; a failing object keeps its entry.
        assert_eq!(
            next.entries[&intact.key()].owned_digest.as_deref(),
            Some("owned")
        );
        assert_eq!(next.entries[&failing.key()], failing);
        // A prune still pending: the release is not complete yet.
        assert_eq!(next.complete_serial, Some(1));
    }

    #[test]
    fn a_release_is_complete_only_when_it_applied_and_no_prune_waits() {
        let a = entry("x", "a", true);
        let previous = inventory(std::slice::from_ref(&a));
        let none = BTreeMap::new();
        let plan = PrunePlan::default();
        let applied = || vec![Applied::Yes(a.clone())];
        assert_eq!(
            next(&previous, applied(), &plan, &none, 9, true).complete_serial,
            Some(9)
        );
        assert_eq!(
            next(&previous, applied(), &plan, &none, 9, false).complete_serial,
            Some(1)
        );
        let postponed = PrunePlan {
            postponed: vec![entry("x", "b", true)],
            ..PrunePlan::default()
        };
        let waiting = next(&previous, applied(), &postponed, &none, 9, true);
        assert_eq!(waiting.complete_serial, Some(1));
        assert!(waiting.entries.contains_key(&entry("x", "b", true).key()));
    }
}
