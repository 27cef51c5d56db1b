use std::collections::{BTreeMap, BTreeSet};

use super::Readiness::{NotReady, Ready};
use super::*;

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| (*n).to_owned()).collect()
}

fn deps(pairs: &[(&str, &[&str])]) -> Dependencies {
    pairs
        .iter()
        .map(|(app, on)| {
            (
                (*app).to_owned(),
                on.iter().map(|d| (*d).to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn apps_without_dependencies_all_go_in_the_first_batch() {
    let batch = next_batch(
        &set(&["a", "b", "c"]),
        &Dependencies::new(),
        &BTreeMap::new(),
    );
    assert_eq!(batch.apply, set(&["a", "b", "c"]));
    assert!(batch.waiting.is_empty());
}

#[test]
fn a_dependent_goes_after_its_dependency_is_ready() {
    let dependencies = deps(&[("web", &["db"]), ("jobs", &["web", "db"])]);
    let first = next_batch(
        &set(&["db", "web", "jobs", "tools"]),
        &dependencies,
        &BTreeMap::new(),
    );
    assert_eq!(first.apply, set(&["db", "tools"]));
    assert!(first.waiting.is_empty());

    let mut judged = BTreeMap::from([("db".to_owned(), Ready), ("tools".to_owned(), Ready)]);
    let second = next_batch(&set(&["web", "jobs"]), &dependencies, &judged);
    assert_eq!(second.apply, set(&["web"]));

    judged.insert("web".to_owned(), Ready);
    let third = next_batch(&set(&["jobs"]), &dependencies, &judged);
    assert_eq!(third.apply, set(&["jobs"]));
}

#[test]
fn a_dependency_not_ready_or_not_here_makes_its_dependents_wait() {
    let dependencies = deps(&[("web", &["db"]), ("jobs", &["web"]), ("api", &["cache"])]);
    let judged = BTreeMap::from([(
        "db".to_owned(),
        NotReady("Deployment db/db is not healthy: 0 of 1 ready".to_owned()),
    )]);
    let batch = next_batch(&set(&["web", "jobs", "api"]), &dependencies, &judged);
    assert!(batch.apply.is_empty());
    assert_eq!(
        batch.waiting["web"],
        "waits for app db: Deployment db/db is not healthy: 0 of 1 ready"
    );
    assert!(batch.waiting["api"].contains("waits for app cache, which this cluster does not get"));
    // jobs waits on web, which waits: nothing can go, so it waits too.
    assert_eq!(batch.waiting["jobs"], "waits for app web, which waits too");
}

#[test]
fn a_cycle_waits_instead_of_looping() {
    let dependencies = deps(&[("a", &["b"]), ("b", &["a"])]);
    let batch = next_batch(&set(&["a", "b"]), &dependencies, &BTreeMap::new());
    assert!(batch.apply.is_empty());
    assert_eq!(batch.waiting.len(), 2);
    assert!(batch.waiting["a"].contains("cycle"));
}

#[test]
fn an_app_is_ready_only_when_every_object_applied_and_is_healthy() {
    // Test shorthand: `Ok(())` ready, `Err(why)` not.
    let readiness = |r: Result<(), &str>| r.map_or_else(|why| NotReady(why.to_owned()), |()| Ready);
    let object = |applied: Result<(), &str>, health: Option<Result<(), &str>>| ObjectReadiness {
        display: "ConfigMap db/x".to_owned(),
        applied: readiness(applied),
        health: health.map(readiness),
    };
    assert_eq!(app_readiness(&[object(Ok(()), Some(Ok(())))]), Ready);
    assert_eq!(app_readiness(&[]), Ready);
    assert_eq!(
        app_readiness(&[object(Ok(()), Some(Ok(()))), object(Err("forbidden"), None)]),
        NotReady("ConfigMap db/x did not apply: forbidden".to_owned())
    );
    assert_eq!(
        app_readiness(&[object(Ok(()), None)]),
        NotReady("ConfigMap db/x is not observed yet".to_owned())
    );
    assert_eq!(
        app_readiness(&[object(Ok(()), Some(Err("0 of 1 ready")))]),
        NotReady("ConfigMap db/x is not healthy: 0 of 1 ready".to_owned())
    );
}
