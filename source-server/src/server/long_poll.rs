//! Long polls of channel pointers: a `GET` of a pointer with `If-None-Match` and `Prefer: wait=N` (RFC 7240)
//! whose pointer has not changed is held until it changes or the wait ends, so a publish reaches waiting
//! agents within [`files::REVALIDATE_AFTER`] instead of a poll interval. The answer carries
//! `Preference-Applied: wait=N`, which tells an agent that this store holds polls (a static host ignores
//! `Prefer` and never says so, and agents then poll on their interval).
//!
//! Where the data comes from: the store directory through the [`FileCache`]; `windvane publish` only writes
//! files, so one watcher task per channel that has waiters looks at its pointer every
//! [`files::REVALIDATE_AFTER`] and wakes them all through a `watch` channel — one `stat` per channel, however
//! many agents wait. A watcher ends with its last waiter. Woken agents then fetch the bundle, which the
//! server answers from memory (one cached copy, immutable), so a publish to many waiting agents costs one
//! read of the bundle from disk.
//!
//! On shutdown ([`PointerWatch::close`]) every held poll is answered at once with the pointer as it is, so a
//! stopping server does not wait a whole poll's length for its open requests to finish.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::header::HeaderValue;
use tokio::sync::watch;

use super::App;
use super::files::{self, FileCache};
use super::route;

/// The longest a client may ask a poll to be held; longer waits are cut to this.
pub const MAX_WAIT: Duration = Duration::from_secs(120);

/// The wait a `Prefer` header asks for (`wait=N` seconds among its preferences), clamped to [`MAX_WAIT`];
/// `None` when it asks for none or for zero. Pure.
pub fn requested_wait(prefer: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(prefer).ok()?;
    let seconds = text.split(',').find_map(|preference| {
        // A preference may carry parameters after ';'; only its own token=value counts.
        let token = preference.split(';').next()?.trim();
        let (name, value) = token.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("wait")
            .then(|| value.trim().trim_matches('"').parse::<u64>().ok())
            .flatten()
    })?;
    (seconds > 0).then(|| Duration::from_secs(seconds).min(MAX_WAIT))
}

/// A pointer version's ETags: identity and gzip (a client may hold either).
type Etags = [HeaderValue; 2];

/// The watchers of channels that have waiters: channel → the pointer's current ETags.
#[derive(Debug)]
pub struct PointerWatch {
    channels: Mutex<HashMap<String, watch::Sender<Option<Etags>>>>,
    /// True once the server shuts down: held polls are answered and no new one is held.
    closing: watch::Sender<bool>,
}

impl Default for PointerWatch {
    fn default() -> Self {
        PointerWatch {
            channels: Mutex::default(),
            closing: watch::Sender::new(false),
        }
    }
}

impl PointerWatch {
    /// The server is shutting down: every held poll is answered now, and later ones are not held.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// A receiver that changes whenever the channel's pointer does, starting the channel's watcher if none runs.
    fn subscribe(&self, app: &Arc<App>, channel: &str) -> watch::Receiver<Option<Etags>> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = channels.get(channel) {
            return sender.subscribe();
        }
        let current = current_etags(&app.files, channel);
        let (sender, receiver) = watch::channel(current);
        channels.insert(channel.to_owned(), sender.clone());
        tokio::spawn(watch_pointer(Arc::clone(app), channel.to_owned(), sender));
        receiver
    }

    /// Removes the channel's watcher if nobody waits; true when it did (the watcher then ends).
    fn retire_if_unused(&self, channel: &str) -> bool {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        let unused = channels
            .get(channel)
            .is_none_or(|sender| sender.receiver_count() == 0);
        if unused {
            channels.remove(channel);
        }
        unused
    }
}

fn current_etags(files: &FileCache, channel: &str) -> Option<Etags> {
    files
        .pointer(channel)
        .ok()
        .map(|file| [file.etag.clone(), file.gzip_etag.clone()])
}

/// Looks at the channel's pointer every [`files::REVALIDATE_AFTER`] while anyone waits on it.
async fn watch_pointer(app: Arc<App>, channel: String, sender: watch::Sender<Option<Etags>>) {
    loop {
        tokio::time::sleep(files::REVALIDATE_AFTER).await;
        if app.pointer_watch.retire_if_unused(&channel) {
            return;
        }
        let etag = current_etags(&app.files, &channel);
        sender.send_if_modified(|seen| {
            let changed = *seen != etag;
            if changed {
                seen.clone_from(&etag);
            }
            changed
        });
    }
}

/// Holds a poll while the channel's pointer still matches the client's `If-None-Match`, at most `wait`.
pub(super) async fn hold(app: &Arc<App>, channel: &str, if_none_match: &[u8], wait: Duration) {
    let unchanged = |etags: &Option<Etags>| {
        etags.as_ref().is_some_and(|[plain, gzip]| {
            route::if_none_match(if_none_match, &[plain.as_bytes(), gzip.as_bytes()])
        })
    };
    let mut closing = app.pointer_watch.closing.subscribe();
    if *closing.borrow_and_update() {
        return;
    }
    let mut changes = app.pointer_watch.subscribe(app, channel);
    if !unchanged(&current_etags(&app.files, channel)) {
        return;
    }
    let deadline = tokio::time::Instant::now() + wait;
    let _held = Held::count(&app.metrics.held_polls);
    while unchanged(&changes.borrow_and_update()) {
        tokio::select! {
            changed = tokio::time::timeout_at(deadline, changes.changed()) => match changed {
                Ok(Ok(())) => {}
                // The wait is over, or the watcher is gone: answer with whatever the pointer is now.
                Ok(Err(_)) | Err(_) => return,
            },
            // Shutting down (or the sender is gone with the server): answer now.
            _ = closing.changed() => return,
        }
    }
}

/// One held poll in `windvane_held_polls`, for as long as it lives (also when the client goes away and
/// the request is dropped mid-wait).
struct Held<'a>(&'a AtomicU64);

impl<'a> Held<'a> {
    fn count(gauge: &'a AtomicU64) -> Self {
        gauge.fetch_add(1, Ordering::Relaxed);
        Held(gauge)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_preference_is_read_and_clamped() {
        let wait = |header: &str| requested_wait(header.as_bytes());
        assert_eq!(wait("wait=30"), Some(Duration::from_secs(30)));
        assert_eq!(
            wait("respond-async, Wait = 5"),
            Some(Duration::from_secs(5))
        );
        assert_eq!(wait("wait=\"7\"; foo=bar"), Some(Duration::from_secs(7)));
        assert_eq!(wait("wait=86400"), Some(MAX_WAIT));
        assert_eq!(wait("wait=0"), None);
        assert_eq!(wait("wait=-1"), None);
        assert_eq!(wait("wait=soon"), None);
        assert_eq!(wait("return=minimal"), None);
        assert_eq!(requested_wait(&[0xff, b'=', b'1']), None);
    }
}
