//! The order of apps that name others in `dependsOn`: an app is applied only once every app it depends on is
//! applied and healthy on this cluster. The dependencies come from the signed bundle (checked at build time
//! to name existing apps without a cycle; a cycle or a missing app found here anyway makes its apps wait);
//! the sync ([`crate::engine`]) applies the apps in batches from [`next_batch`], judges each applied app with
//! [`app_readiness`], and reports the apps left waiting as Progressing, naming what they wait for. Pure.

use std::collections::{BTreeMap, BTreeSet};

/// Each app's `dependsOn`, for the apps of this cluster's share that name any.
pub type Dependencies = BTreeMap<String, Vec<String>>;

/// Whether an app (or one of its objects) is applied and healthy, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    NotReady(String),
}

/// What to do with the apps not applied yet in this sync.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Every dependency is ready: apply these now.
    pub apply: BTreeSet<String>,
    /// These cannot be applied in this sync, each with what it waits for.
    pub waiting: BTreeMap<String, String>,
}

/// The next apps to apply among `remaining`, given the apps `judged` so far in this sync. An app waits for
/// good when a dependency is not ready, is not part of this cluster's share, or when nothing can go (a
/// cycle); it is neither applied nor waiting while its dependencies are still to be applied.
pub fn next_batch(
    remaining: &BTreeSet<String>,
    dependencies: &Dependencies,
    judged: &BTreeMap<String, Readiness>,
) -> Batch {
    let mut batch = Batch::default();
    let mut undecided = Vec::new();
    for app in remaining {
        let needs = dependencies.get(app).map(Vec::as_slice).unwrap_or_default();
        match blocker(needs, remaining, judged) {
            Blocker::None => {
                batch.apply.insert(app.clone());
            }
            Blocker::Waits(why) => {
                batch.waiting.insert(app.clone(), why);
            }
            Blocker::NotYet(first) => undecided.push((app.clone(), first)),
        }
    }
    if batch.apply.is_empty() {
        settle_undecided(&mut batch, undecided, dependencies);
    }
    batch
}

/// Nothing can be applied, so the apps still undecided never will be in this sync: each waits for a
/// dependency that waits, or is in a cycle (which the build would have refused).
fn settle_undecided(
    batch: &mut Batch,
    mut undecided: Vec<(String, String)>,
    dependencies: &Dependencies,
) {
    loop {
        let before = undecided.len();
        undecided.retain(|(app, _)| {
            let needs = dependencies.get(app).map(Vec::as_slice).unwrap_or_default();
            let Some(waiting) = needs.iter().find(|d| batch.waiting.contains_key(*d)) else {
                return true;
            };
            let why = format!("waits for app {waiting}, which waits too");
            batch.waiting.insert(app.clone(), why);
            false
        });
        if undecided.len() == before {
            break;
        }
    }
    for (app, first) in undecided {
        let why = format!("waits for app {first} (a dependency cycle)");
        batch.waiting.insert(app, why);
    }
}

enum Blocker {
    None,
    Waits(String),
    /// A dependency still to be applied in this sync.
    NotYet(String),
}

fn blocker(
    needs: &[String],
    remaining: &BTreeSet<String>,
    judged: &BTreeMap<String, Readiness>,
) -> Blocker {
    let mut not_yet = None;
    for dependency in needs {
        match judged.get(dependency) {
            Some(Readiness::Ready) => {}
            Some(Readiness::NotReady(why)) => {
                return Blocker::Waits(format!("waits for app {dependency}: {why}"));
            }
            None if remaining.contains(dependency) => {
                not_yet.get_or_insert_with(|| dependency.clone());
            }
            None => {
                return Blocker::Waits(format!(
                    "waits for app {dependency}, which this cluster does not get (its selector)"
                ));
            }
        }
    }
    not_yet.map_or(Blocker::None, Blocker::NotYet)
}

/// One object of an applied app as the readiness judge sees it: its name, whether it applied, and its live
/// health (`None`: not observed yet; `Some(NotReady)`: Progressing or Degraded, with why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectReadiness {
    pub display: String,
    pub applied: Readiness,
    pub health: Option<Readiness>,
}

/// An app is ready when every one of its objects applied and is healthy; otherwise why not, naming the
/// first object that is not.
pub fn app_readiness(objects: &[ObjectReadiness]) -> Readiness {
    for object in objects {
        if let Readiness::NotReady(why) = &object.applied {
            return Readiness::NotReady(format!("{} did not apply: {why}", object.display));
        }
        match &object.health {
            None => return Readiness::NotReady(format!("{} is not observed yet", object.display)),
            Some(Readiness::NotReady(why)) => {
                return Readiness::NotReady(format!("{} is not healthy: {why}", object.display));
            }
            Some(Readiness::Ready) => {}
        }
    }
    Readiness::Ready
}

#[cfg(test)]
mod tests;
