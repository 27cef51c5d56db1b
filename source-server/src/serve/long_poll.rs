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
//!
//! A held poll keeps its connection busy, and a connection busy with a request is not closed to make room
//! ([`crate::http::conns`]), so anyone could take every connection slot with polls, no token needed, and
//! heartbeats would be refused. So: one client address holds at most `--max-held-polls-per-client` at once
//! ([`HeldPolls`]; its oldest is answered to make room for a new one), and a held poll marks its connection
//! as one the connection table may reclaim ([`crate::http::conns::Busy::hold_poll`]): when the table is full, the
//! oldest connection that is idle or only holds a poll makes room for the newcomer. An evicted poll is
//! answered as the end of its wait would be, but without `Preference-Applied` and with `Connection: close`:
//! the agent takes the store for one that does not hold polls and polls again on its interval (so many
//! agents behind one address do not chase each other out), and the slot is freed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::header::HeaderValue;
use tokio::sync::{oneshot, watch};

use crate::http::App;
use crate::http::conns::{Busy, HeldPollGuard};
use crate::http::route;
use crate::serve::files::{self, FileCache};

/// The longest a client may ask a poll to be held; longer waits are cut to this.
pub const MAX_WAIT: Duration = Duration::from_secs(120);
/// Default of `--max-held-polls-per-client`: agents behind one address (a NAT, or a load balancer not named
/// in `--trusted-proxy`) beyond this many poll on their interval instead of being held.
pub const DEFAULT_MAX_HELD_PER_CLIENT: usize = 256;

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
    /// The polls being held, by client address.
    pub held: HeldPolls,
}

impl PointerWatch {
    /// No poll held yet; at most `per_client` at once for one client address.
    pub fn new(per_client: usize) -> Self {
        PointerWatch {
            channels: Mutex::default(),
            closing: watch::Sender::new(false),
            held: HeldPolls::new(per_client),
        }
    }

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

/// How a held poll ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HoldEnd {
    /// The pointer changed, the wait is over, the server stops, or the poll was not held at all.
    Answered,
    /// Answered early to make room for another poll or connection ([`HeldPolls`]).
    Evicted,
}

/// Holds a poll of `client` on `connection` while the channel's pointer still matches the client's
/// `If-None-Match`, at most `wait`, or until it is evicted (for another poll of the client, or for the slot).
pub(super) async fn hold(
    app: &Arc<App>,
    channel: &str,
    if_none_match: &[u8],
    wait: Duration,
    (client, connection): (IpAddr, Option<&Busy>),
) -> HoldEnd {
    let unchanged = |etags: &Option<Etags>| {
        etags.as_ref().is_some_and(|[plain, gzip]| {
            route::if_none_match(if_none_match, &[plain.as_bytes(), gzip.as_bytes()])
        })
    };
    let mut closing = app.pointer_watch.closing.subscribe();
    if *closing.borrow_and_update() {
        return HoldEnd::Answered;
    }
    let mut changes = app.pointer_watch.subscribe(app, channel);
    if !unchanged(&current_etags(&app.files, channel)) {
        return HoldEnd::Answered;
    }
    let deadline = tokio::time::Instant::now() + wait;
    let (mut ticket, evicted) = app.pointer_watch.held.admit(client);
    if evicted {
        app.metrics.held_poll_evicted("per_client");
        tracing::debug!(%client, "too many polls held for this address: answered its oldest");
    }
    let _held = Held::count(&app.metrics.held_polls);
    let mut slot = connection.map(Busy::hold_poll);
    while unchanged(&changes.borrow_and_update()) {
        tokio::select! {
            changed = tokio::time::timeout_at(deadline, changes.changed()) => match changed {
                Ok(Ok(())) => {}
                // The wait is over, or the watcher is gone: answer with whatever the pointer is now.
                Ok(Err(_)) | Err(_) => return HoldEnd::Answered,
            },
            // Shutting down (or the sender is gone with the server): answer now.
            _ = closing.changed() => return HoldEnd::Answered,
            _ = &mut ticket.evicted => return HoldEnd::Evicted,
            () = slot_needed(slot.as_mut()) => return HoldEnd::Evicted,
        }
    }
    HoldEnd::Answered
}

/// Completes when the connection table wants the held poll's slot; never without a connection to watch.
async fn slot_needed(slot: Option<&mut HeldPollGuard>) {
    let answered = match slot {
        Some(slot) => (&mut slot.evicted).await.is_ok(),
        None => false,
    };
    if !answered {
        std::future::pending::<()>().await;
    }
}

/// The polls being held, oldest first, with their client addresses: at most `per_client` per address.
#[derive(Debug)]
pub struct HeldPolls {
    per_client: usize,
    table: Mutex<HeldTable>,
}

#[derive(Debug, Default)]
struct HeldTable {
    next_id: u64,
    /// By id, so oldest first: the client and the signal that answers the poll now.
    all: BTreeMap<u64, (IpAddr, oneshot::Sender<()>)>,
    /// The ids of each client's held polls.
    by_client: HashMap<IpAddr, BTreeSet<u64>>,
}

impl HeldTable {
    /// Removes a held poll; its signal, if it was still there.
    fn remove(&mut self, id: u64) -> Option<oneshot::Sender<()>> {
        let (client, evict) = self.all.remove(&id)?;
        if let Some(ids) = self.by_client.get_mut(&client) {
            ids.remove(&id);
            if ids.is_empty() {
                self.by_client.remove(&client);
            }
        }
        Some(evict)
    }
}

/// One held poll's place in [`HeldPolls`]; `evicted` fires when it is to be answered now. Dropping it (the
/// poll was answered, or its client went away) frees the place.
#[derive(Debug)]
pub struct HeldTicket<'a> {
    id: u64,
    polls: &'a HeldPolls,
    pub evicted: oneshot::Receiver<()>,
}

impl Drop for HeldTicket<'_> {
    fn drop(&mut self) {
        self.polls.lock().remove(self.id);
    }
}

impl HeldPolls {
    /// At most `per_client` (at least 1) held polls per client address.
    pub fn new(per_client: usize) -> Self {
        HeldPolls {
            per_client: per_client.max(1),
            table: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HeldTable> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a poll of `client`; true when its oldest held poll was answered to make room.
    pub fn admit(&self, client: IpAddr) -> (HeldTicket<'_>, bool) {
        let mut table = self.lock();
        let oldest = table
            .by_client
            .get(&client)
            .filter(|ids| ids.len() >= self.per_client)
            .and_then(|ids| ids.first().copied());
        let evicted = oldest
            .and_then(|id| table.remove(id))
            .is_some_and(|evict| evict.send(()).is_ok());
        let id = table.next_id;
        table.next_id += 1;
        let (evict, receiver) = oneshot::channel();
        table.all.insert(id, (client, evict));
        table.by_client.entry(client).or_default().insert(id);
        let ticket = HeldTicket {
            id,
            polls: self,
            evicted: receiver,
        };
        (ticket, evicted)
    }

    /// Polls held now for `client`.
    #[cfg(test)]
    fn held_for(&self, client: IpAddr) -> usize {
        self.lock().by_client.get(&client).map_or(0, BTreeSet::len)
    }
}

/// One held poll in `windvane_held_polls`, for as long as it lives (also when the client goes away and
/// the request is dropped mid-wait).
struct Held<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl<'a> Held<'a> {
    fn count(gauge: &'a prometheus_client::metrics::gauge::Gauge) -> Self {
        gauge.inc();
        Held(gauge)
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_holds_at_most_its_share_and_the_oldest_makes_room() {
        let polls = HeldPolls::new(2);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let (mut first, evicted) = polls.admit(a);
        assert!(!evicted);
        let (mut second, _) = polls.admit(a);
        let (mut other, _) = polls.admit(b);
        let (mut third, evicted) = polls.admit(a);
        assert!(evicted, "a's third poll answers its first");
        assert_eq!(first.evicted.try_recv(), Ok(()));
        assert!(second.evicted.try_recv().is_err());
        assert!(third.evicted.try_recv().is_err());
        assert!(other.evicted.try_recv().is_err(), "b is not a's business");
        assert_eq!(polls.held_for(a), 2);
        drop(first);
        assert_eq!(polls.held_for(a), 2, "the evicted one left when evicted");

        drop(second);
        drop(other);
        assert_eq!(polls.held_for(b), 0);
        assert_eq!(polls.held_for(a), 1);
        drop(third);
        assert_eq!(polls.held_for(a), 0);
    }

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
