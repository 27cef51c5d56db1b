//! The rollout views the server hands out, built at most once per [`FRESH_FOR`] per channel and served as
//! cached bytes with strong ETags. Every agent held by a `gate: healthy` wave reads its channel's view every
//! few seconds (`agent/src/wave.rs`): at 10,000 agents, building it from the database per request would be
//! thousands of O(fleet) builds a second. Here one request per channel and interval builds it (the others
//! wait for that one: no stampede when it goes stale), the rest take the cached bytes, and a client that
//! sends the ETag it holds gets `304`.
//!
//! An entry is built from the channel's pointer (its ETag, from the file cache, is part of the key: a publish,
//! halt or resume is seen at once) and the database's clusters; [`Built`] carries the view (for the page),
//! the full JSON and the summary JSON ([`windvane_shared::decide::rollout::summary`], what agents ask for). A view
//! at most [`FRESH_FOR`] old can only delay a wave: an agent opens no wave before its signed time, and a
//! cluster a stale view does not yet show done holds the gate a little longer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::header::HeaderValue;
use windvane_shared::crypto::digest::sha256_hex;
use windvane_shared::decide::rollout::{RolloutView, SUMMARY_LISTED, summary};

/// How long a built view is served before the next request builds it again. A waiting agent reads every
/// `min(poll, 5 s)`, so this adds at most a second to a wave's opening.
pub const FRESH_FOR: Duration = Duration::from_secs(1);

/// One JSON representation of a view and its strong ETag.
#[derive(Debug)]
pub struct Encoded {
    pub body: Bytes,
    pub etag: HeaderValue,
}

impl Encoded {
    fn of<T: serde::Serialize>(value: &T) -> Encoded {
        let body = Bytes::from(serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec()));
        // Content-derived, so that replicas behind one load balancer agree on it.
        let tag = format!("\"{}\"", &sha256_hex(&body)[..32]);
        Encoded {
            etag: HeaderValue::from_str(&tag).unwrap_or(HeaderValue::from_static("\"\"")),
            body,
        }
    }
}

/// A channel's view as built once: the view, its full JSON, and the gate summary's JSON.
#[derive(Debug)]
pub struct Built {
    /// The ETag of the pointer it was built from.
    pointer: HeaderValue,
    at: Instant,
    pub view: RolloutView,
    pub full: Encoded,
    pub summary: Encoded,
}

impl Built {
    pub fn new(pointer: HeaderValue, view: RolloutView, at: Instant) -> Built {
        let full = Encoded::of(&view);
        let summary = Encoded::of(&summary(&view, SUMMARY_LISTED));
        Built {
            pointer,
            at,
            view,
            full,
            summary,
        }
    }

    /// Whether this may be served for the pointer `pointer` at `now`. Pure.
    pub fn fresh(&self, pointer: &HeaderValue, now: Instant) -> bool {
        self.pointer == *pointer && now.saturating_duration_since(self.at) < FRESH_FOR
    }
}

/// A channel's slot: the latest build, and a lock that only the request building it holds.
#[derive(Debug, Default)]
struct Slot {
    latest: Mutex<Option<Arc<Built>>>,
    building: tokio::sync::Mutex<()>,
}

impl Slot {
    fn fresh(&self, pointer: &HeaderValue, now: Instant) -> Option<Arc<Built>> {
        self.latest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .filter(|b| b.fresh(pointer, now))
            .cloned()
    }
}

/// The cached views, by channel (only channels with a pointer in the store reach it).
#[derive(Debug, Default)]
pub struct RolloutCache {
    slots: Mutex<HashMap<String, Arc<Slot>>>,
}

impl RolloutCache {
    /// The channel's view for `pointer`: the cached one while fresh, else the one `build` makes (one build
    /// at a time per channel; requests that arrive meanwhile take its result).
    pub async fn get<F, Fut, E>(
        &self,
        channel: &str,
        pointer: &HeaderValue,
        build: F,
    ) -> Result<Arc<Built>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<RolloutView, E>>,
    {
        let slot = Arc::clone(
            self.slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(channel.to_owned())
                .or_default(),
        );
        if let Some(built) = slot.fresh(pointer, Instant::now()) {
            return Ok(built);
        }
        let _building = slot.building.lock().await;
        if let Some(built) = slot.fresh(pointer, Instant::now()) {
            return Ok(built);
        }
        let started = Instant::now();
        let view = build().await?;
        let built = Arc::new(Built::new(pointer.clone(), view, started));
        *slot.latest.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&built));
        Ok(built)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn view(serial: u64) -> RolloutView {
        serde_json::from_value(serde_json::json!({
            "channel": "prod", "serial": serial, "issuedAt": "2026-12-04T10:00:00Z",
            "halted": false, "complete": false, "waves": []
        }))
        .expect("view")
    }

    #[tokio::test]
    async fn a_view_is_built_once_while_fresh_and_again_for_a_new_pointer() {
        let cache = RolloutCache::default();
        let builds = AtomicUsize::new(0);
        let build = |serial| {
            builds.fetch_add(1, Ordering::SeqCst);
            async move { Ok::<_, ()>(view(serial)) }
        };
        let one = HeaderValue::from_static("\"p1\"");
        let first = cache.get("prod", &one, || build(1)).await.expect("built");
        let again = cache.get("prod", &one, || build(1)).await.expect("cached");
        assert_eq!(builds.load(Ordering::SeqCst), 1);
        assert_eq!(first.full.etag, again.full.etag);
        let two = HeaderValue::from_static("\"p2\"");
        let newer = cache.get("prod", &two, || build(2)).await.expect("rebuilt");
        assert_eq!(builds.load(Ordering::SeqCst), 2);
        assert_eq!(newer.view.serial, 2);
        assert_ne!(newer.full.etag, first.full.etag);
        cache.get("other", &two, || build(2)).await.expect("built");
        assert_eq!(builds.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn an_entry_goes_stale_after_its_interval_or_with_another_pointer() {
        let at = Instant::now();
        let pointer = HeaderValue::from_static("\"p1\"");
        let built = Built::new(pointer.clone(), view(1), at);
        assert!(built.fresh(&pointer, at + FRESH_FOR / 2));
        assert!(!built.fresh(&pointer, at + FRESH_FOR));
        assert!(!built.fresh(&HeaderValue::from_static("\"p2\""), at));
        // The ETag follows the content only.
        assert_eq!(
            Built::new(pointer.clone(), view(1), at + FRESH_FOR)
                .full
                .etag,
            built.full.etag
        );
    }
}
