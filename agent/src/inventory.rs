//! The inventory — every object Windvane applied on this cluster, by app, with the policy it was applied
//! under — and the prune decision made from it. The inventory is persisted in the cluster (see `state`) so
//! that a restarted agent still knows what it owns; the decision is pure and made only from the previous
//! inventory, the new release and how its apply went.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use windvane_shared::bundle::ObjectRef;

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
    /// Digest of the fields Windvane owned after that apply ([`crate::drift::Baseline::digest`]). After a
    /// restart, a live object owning the same fields is known intact and is not written again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_digest: Option<String>,
    /// Left the release but was not pruned (prune off or disabled): reported until someone removes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub orphaned: bool,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseOutcome {
    /// Every object of the release applied without error.
    pub apply_complete: bool,
    /// The release holds no object at all for this cluster.
    pub empty: bool,
    /// The signed pointer allows an empty release to remove everything.
    pub allow_empty: bool,
}

/// What to do with objects that left the release.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrunePlan {
    /// Objects to delete (background propagation).
    pub delete: Vec<InventoryEntry>,
    /// Objects to keep and report as orphaned (their app does not prune, or they are marked disabled).
    pub orphan: Vec<InventoryEntry>,
    /// Why nothing is deleted this time although some objects would be; they stay in the inventory.
    pub held_back: Option<String>,
}

/// Decides what leaves the cluster. Rules: only objects that left the release; only those applied with
/// prune on; only after a complete apply; never from an empty release unless it allows it; never more than
/// `budget_fraction` of the managed inventory at once (rounded up, so one object can always go).
pub fn plan_prune(
    previous: &Inventory,
    desired: &BTreeSet<ObjectKey>,
    outcome: ReleaseOutcome,
    budget_fraction: f64,
) -> PrunePlan {
    let gone: Vec<&InventoryEntry> = previous
        .managed()
        .filter(|entry| !desired.contains(&entry.key()))
        .collect();
    let (to_delete, orphan): (Vec<&InventoryEntry>, Vec<&InventoryEntry>) =
        gone.into_iter().partition(|e| e.prune);
    let mut plan = PrunePlan {
        orphan: orphan.into_iter().cloned().collect(),
        ..PrunePlan::default()
    };
    if to_delete.is_empty() {
        return plan;
    }
    let managed = previous.managed().count();
    let budget = (budget_fraction * managed as f64).ceil() as usize;
    plan.held_back = if !outcome.apply_complete {
        Some("the release did not apply completely; pruning waits for a complete apply".to_owned())
    } else if outcome.empty && !outcome.allow_empty {
        Some(format!(
            "the release is empty and does not allow it; refusing to prune {} objects",
            to_delete.len()
        ))
    } else if to_delete.len() > budget {
        Some(format!(
            "pruning {} of {managed} objects exceeds the deletion budget of {budget} ({:.0}%); refusing",
            to_delete.len(),
            budget_fraction * 100.0
        ))
    } else {
        None
    };
    if plan.held_back.is_none() {
        plan.delete = to_delete.into_iter().cloned().collect();
    }
    plan
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
        apply_complete: true,
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
            COMPLETE,
            0.5,
        );
        assert_eq!(plan.delete, vec![b]);
        assert_eq!(plan.orphan, vec![c]);
        assert_eq!(plan.held_back, None);
    }

    #[test]
    fn nothing_is_pruned_after_an_incomplete_apply() {
        let (a, b) = (entry("x", "a", true), entry("x", "b", true));
        let outcome = ReleaseOutcome {
            apply_complete: false,
            ..COMPLETE
        };
        let plan = plan_prune(&inventory(&[a.clone(), b]), &keys(&[&a]), outcome, 0.5);
        assert!(plan.delete.is_empty());
        assert!(plan.held_back.unwrap().contains("did not apply completely"));
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
            empty,
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
            allowed,
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
        let plan = plan_prune(&inventory(&all), &keep_four, COMPLETE, 0.5);
        assert!(plan.delete.is_empty());
        assert!(plan.held_back.unwrap().contains("deletion budget of 5"));
        let keep_five: BTreeSet<ObjectKey> = all[..5].iter().map(InventoryEntry::key).collect();
        assert_eq!(
            plan_prune(&inventory(&all), &keep_five, COMPLETE, 0.5)
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
                ReleaseOutcome {
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
    fn orphans_are_not_reconsidered() {
        let mut a = entry("x", "a", true);
        a.orphaned = true;
        let plan = plan_prune(&inventory(&[a]), &BTreeSet::new(), COMPLETE, 1.0);
        assert_eq!(plan, PrunePlan::default());
    }
}
