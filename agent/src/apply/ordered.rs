//! Applying a sync's objects in the order the apps' `dependsOn` asks for: batch by batch
//! ([`crate::apply::depends::next_batch`]), each app once the apps it depends on applied and are healthy on the
//! cluster (their health as the API server returned them, then as the watches see them). The apps that
//! cannot go are not sent and come back as [`Outcome::Waiting`]; the sync asks to be run again soon
//! ([`crate::engine`]'s recheck), so that they follow once their dependencies are healthy. A release without
//! `dependsOn` is applied in one go, as before. The engine passes the applies in ([`apply_ordered`]'s
//! `apply`) and the live cache the health is read from.

use std::collections::{BTreeMap, BTreeSet};

use tracing::info;
use windvane_shared::decide::render::ClusterIdentity;
use windvane_shared::format::bundle::Bundle;

use crate::apply::depends::{Dependencies, ObjectReadiness, Readiness, app_readiness, next_batch};
use crate::apply::desired::Desired;
use crate::apply::{ApplyReport, ObjectResult, Outcome, result};
use crate::live::health::Health;
use crate::live::watch::LiveCache;

/// The apps of this cluster's share and what they depend on, read from the bundle before it is rendered.
#[derive(Debug, Clone, Default)]
pub struct AppOrder {
    selected: BTreeSet<String>,
    dependencies: Dependencies,
}

impl AppOrder {
    pub fn of(bundle: &Bundle, identity: &ClusterIdentity) -> Self {
        let mut order = AppOrder::default();
        for app in bundle
            .apps
            .iter()
            .filter(|app| app.selector.matches(&identity.labels))
        {
            order.selected.insert(app.name.clone());
            if !app.depends_on.is_empty() {
                order
                    .dependencies
                    .insert(app.name.clone(), app.depends_on.clone());
            }
        }
        order
    }
}

/// Applies `desired` in dependency order, each batch with `apply`. `unready` names apps known not to be
/// ready whatever their apply does (they failed to render, or an object of theirs did not open), with why.
pub async fn apply_ordered(
    desired: Vec<Desired>,
    order: AppOrder,
    unready: &BTreeMap<String, String>,
    live: &LiveCache,
    apply: impl AsyncFn(Vec<Desired>) -> ApplyReport,
) -> ApplyReport {
    if order.dependencies.is_empty() {
        return apply(desired).await;
    }
    let mut by_app: BTreeMap<String, Vec<Desired>> = BTreeMap::new();
    for object in desired {
        by_app.entry(object.app.clone()).or_default().push(object);
    }
    let mut remaining = order.selected;
    let mut judged: BTreeMap<String, Readiness> = BTreeMap::new();
    let mut report = ApplyReport::default();
    loop {
        let batch = next_batch(&remaining, &order.dependencies, &judged);
        for (app, why) in batch.waiting {
            info!(%app, reason = %why, "app not applied yet (dependsOn)");
            remaining.remove(&app);
            let objects = by_app.remove(&app).unwrap_or_default();
            report.results.extend(
                objects
                    .into_iter()
                    .map(|o| result(o, Outcome::Waiting(why.clone()), None)),
            );
        }
        if batch.apply.is_empty() {
            return report;
        }
        let objects = batch
            .apply
            .iter()
            .flat_map(|app| by_app.remove(app).unwrap_or_default())
            .collect();
        let applied = apply(objects).await;
        for app in batch.apply {
            remaining.remove(&app);
            let readiness = match unready.get(&app) {
                Some(why) => Readiness::NotReady(why.clone()),
                None => app_readiness(&readiness_of(live, &app, &applied.results)),
            };
            judged.insert(app, readiness);
        }
        report.results.extend(applied.results);
    }
}

/// How each object of `app` in `results` stands, for [`app_readiness`].
fn readiness_of(live: &LiveCache, app: &str, results: &[ObjectResult]) -> Vec<ObjectReadiness> {
    results
        .iter()
        .filter(|r| r.object.app == app)
        .map(|r| {
            let id = &r.object.id;
            let applied = match &r.outcome {
                Outcome::Applied { .. } => Readiness::Ready,
                Outcome::Failed(why) | Outcome::Refused(why) | Outcome::Waiting(why) => {
                    Readiness::NotReady(why.clone())
                }
            };
            let health = live.health(&r.key()).map(|health| match health {
                Health::Healthy => Readiness::Ready,
                Health::Progressing(why) | Health::Degraded(why) => Readiness::NotReady(why),
            });
            ObjectReadiness {
                display: id.to_string(),
                applied,
                health,
            }
        })
        .collect()
}
