//! What a release held back (awaiting approval or its rollout wave) would change on this cluster, for the
//! heartbeat while it waits: the release rendered for this cluster, as the sync would render it, compared
//! with the inventory of what Windvane last applied here. It comes from the held release and the engine's
//! inventory and goes into the pending report (`changes`), which the fleet page shows beside `Awaiting
//! approval`. Pure.
//!
//! SOPS objects are not opened before the release is taken (a release no one approved yet is not decrypted):
//! one already applied counts as unchanged, a new one as created. Drift is not counted: an object that was
//! changed on the cluster but whose desired body did not change between releases is no change of the
//! release. An app that does not render is left out, and so are its prunes (the sync would hold them too).

use std::collections::BTreeSet;

use windvane_shared::decide::desired::cluster_share_into;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::Bundle;
use windvane_shared::format::sops::Keyring;
use windvane_shared::wire::heartbeat::ChangeSummary;

use crate::apply::desired::Desired;
use crate::apply::inventory::{Inventory, ObjectKey};
use crate::apply::plan::DEFAULT_NAMESPACE;

/// How many objects applying `bundle` would create, update and prune, against `inventory`.
pub fn change_summary(
    inventory: &Inventory,
    mut bundle: Bundle,
    identity: &ClusterIdentity,
) -> ChangeSummary {
    let sealed = crate::apply::secrets::open_selected(&mut bundle, identity, &Keyring::default());
    let mut summary = ChangeSummary::default();
    let mut kept = BTreeSet::new();
    let mut unrendered = BTreeSet::new();
    for (object, _) in sealed {
        let (key, _) = placed(inventory, object);
        if !is_applied(inventory, &key) {
            summary.create += 1;
        }
        kept.insert(key);
    }
    for share in cluster_share_into(bundle, identity, Desired::of) {
        let Ok(objects) = share.objects else {
            unrendered.insert(share.app);
            continue;
        };
        for object in objects {
            let (key, hash) = placed(inventory, object);
            match inventory.entries.get(&key).filter(|e| !e.orphaned) {
                None => summary.create += 1,
                Some(entry) if entry.applied_hash != hash => summary.update += 1,
                Some(_) => {}
            }
            kept.insert(key);
        }
    }
    let pruned = inventory
        .managed()
        .filter(|e| e.prune && !unrendered.contains(&e.app) && !kept.contains(&e.key()))
        .count();
    summary.prune = u32::try_from(pruned).unwrap_or(u32::MAX);
    summary
}

fn is_applied(inventory: &Inventory, key: &ObjectKey) -> bool {
    inventory.entries.get(key).is_some_and(|e| !e.orphaned)
}

/// The object's key and body hash as the apply would record them. Whether a kind is namespaced is
/// discovery's to say; without asking, an object that names no namespace is taken to be where the inventory
/// has it (namespaced in its default namespace, or cluster-scoped), and new ones as namespaced.
fn placed(inventory: &Inventory, mut object: Desired) -> (ObjectKey, String) {
    let key = ObjectKey::of(&object.id);
    if key.namespace.is_some() || is_applied(inventory, &key) {
        let hash = object.body_hash();
        return (key, hash);
    }
    let namespace = object
        .default_namespace
        .clone()
        .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
    object.set_namespace(&namespace);
    (ObjectKey::of(&object.id), object.body_hash())
}

#[cfg(test)]
mod tests;
