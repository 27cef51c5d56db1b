//! The bound on open connections, so that clients that connect and then stay silent (or trickle their
//! request) cannot take every file descriptor and lock everyone else out.
//!
//! The accept loop admits each new connection into a [`Connections`] table. While the table is full, the
//! oldest connection with no request in progress (an idle keep-alive connection, or a client still sending
//! its request line and headers) — or only holding a long poll ([`Busy::hold_poll`]) — makes room: an idle
//! one is told to close, a held poll to answer and close ([`crate::serve::long_poll`]); so anonymous polls cannot
//! keep a heartbeat out, and a fresh connection is not evicted in favour of polls held since long before.
//! When every connection is busy with another request, the newcomer is closed at once. Busy slots free
//! themselves: hyper's header-read timeout and the handlers' body timeout bound how long a request can take
//! to arrive. The limit follows the process's open-file limit
//! (read from `/proc/self/limits`), keeping an eighth of it for the database, the store and outgoing
//! connections; raise the open-file limit (e.g. systemd's `LimitNOFILE`) to allow more clients.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

/// The limit used when the open-file limit cannot be read.
const FALLBACK_OPEN_FILES: u64 = 1024;

/// The connection limit for this process: its soft open-file limit minus a reserve of an eighth (at least 32).
pub fn default_limit() -> usize {
    let open_files = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|text| soft_open_files(&text))
        .unwrap_or(FALLBACK_OPEN_FILES);
    limit_for(open_files)
}

fn limit_for(open_files: u64) -> usize {
    let reserve = (open_files / 8).max(32);
    usize::try_from(open_files.saturating_sub(reserve).max(16)).unwrap_or(usize::MAX)
}

/// The soft "Max open files" of a `/proc/<pid>/limits` text (`unlimited` reads as `u64::MAX`).
fn soft_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line
        .trim_start_matches("Max open files")
        .split_whitespace()
        .next()?;
    if soft == "unlimited" {
        return Some(u64::MAX);
    }
    soft.parse().ok()
}

/// The table of open connections.
#[derive(Debug)]
pub struct Connections {
    limit: usize,
    table: Mutex<Table>,
    /// Signalled whenever a connection leaves the table.
    left: Notify,
}

#[derive(Debug, Default)]
struct Table {
    next_id: u64,
    /// By id, so in order of age.
    open: BTreeMap<u64, Slot>,
}

#[derive(Debug)]
struct Slot {
    busy: Busy,
    /// Taken when the connection is told to close.
    close: Option<oneshot::Sender<()>>,
}

impl Slot {
    fn live(&self) -> bool {
        self.close.is_some()
    }
}

/// One admitted connection: count its requests through [`Admitted::busy`], close it when `closed` fires, and
/// drop it when the connection has ended.
#[derive(Debug)]
pub struct Admitted {
    id: u64,
    busy: Busy,
    /// Fires when the table needs this connection's slot.
    pub closed: oneshot::Receiver<()>,
    connections: Arc<Connections>,
}

impl Admitted {
    /// The request counter, for the connection's service.
    pub fn busy(&self) -> Busy {
        self.busy.clone()
    }
}

/// Counts the requests in progress on one connection (at most one with HTTP/1.1), and knows whether that
/// request only holds a long poll.
#[derive(Debug, Clone, Default)]
pub struct Busy(Arc<BusyState>);

#[derive(Debug, Default)]
struct BusyState {
    requests: AtomicUsize,
    /// Set while the request holds a long poll: the signal that answers it now.
    poll: Mutex<Option<oneshot::Sender<()>>>,
}

impl Busy {
    /// Marks a request in progress until the returned guard is dropped.
    pub fn request(&self) -> RequestGuard {
        self.0.requests.fetch_add(1, Ordering::Relaxed);
        RequestGuard(self.clone())
    }

    fn idle(&self) -> bool {
        self.0.requests.load(Ordering::Relaxed) == 0
    }

    fn poll(&self) -> std::sync::MutexGuard<'_, Option<oneshot::Sender<()>>> {
        self.0.poll.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the request as holding a long poll until the guard is dropped; the guard's `evicted` fires when
    /// the table needs this connection's slot.
    pub fn hold_poll(&self) -> HeldPollGuard {
        let (answer, evicted) = oneshot::channel();
        *self.poll() = Some(answer);
        HeldPollGuard {
            busy: self.clone(),
            evicted,
        }
    }

    fn holding_poll(&self) -> bool {
        self.poll().is_some()
    }

    /// Tells the held poll to answer now; false when it no longer holds.
    fn evict_poll(&self) -> bool {
        self.poll()
            .take()
            .is_some_and(|answer| answer.send(()).is_ok())
    }
}

/// A long poll held on a connection (see [`Busy::hold_poll`]).
#[derive(Debug)]
pub struct HeldPollGuard {
    busy: Busy,
    /// Fires when the connection table needs the slot: answer the poll and close the connection.
    pub evicted: oneshot::Receiver<()>,
}

impl Drop for HeldPollGuard {
    fn drop(&mut self) {
        self.busy.poll().take();
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.connections.lock().open.remove(&self.id);
        self.connections.left.notify_one();
    }
}

/// A request in progress on a connection (see [`Busy::request`]).
#[derive(Debug)]
pub struct RequestGuard(Busy);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.0.requests.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Which connection made room for a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evicted {
    /// An idle connection, told to close.
    Idle,
    /// A connection holding a long poll, told to answer it and close.
    HeldPoll,
}

/// What [`Connections::admit`] decided.
#[derive(Debug)]
pub enum Admission {
    /// Admitted; `evicted` says which connection, if any, was told to make room.
    Admitted {
        connection: Admitted,
        evicted: Option<Evicted>,
    },
    /// Every connection is busy with a request other than a held poll: close the new one.
    Full,
}

impl Connections {
    pub fn new(limit: usize) -> Arc<Connections> {
        Arc::new(Connections {
            limit: limit.max(1),
            table: Mutex::default(),
            left: Notify::new(),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a new connection, making room when the table is full: the oldest connection that is idle or
    /// only holds a long poll is told to close (a held poll is answered first).
    pub fn admit(self: &Arc<Self>) -> Admission {
        let mut table = self.lock();
        let live = table.open.values().filter(|s| s.live()).count();
        let mut evicted = None;
        if live >= self.limit {
            let oldest = table
                .open
                .values_mut()
                .find(|s| s.live() && (s.busy.idle() || s.busy.holding_poll()));
            let Some(slot) = oldest else {
                return Admission::Full;
            };
            let close = slot.close.take();
            if slot.busy.evict_poll() {
                // The poll answers with `Connection: close`; the connection ends once the answer is out.
                evicted = Some(Evicted::HeldPoll);
            } else if let Some(close) = close {
                let _ = close.send(());
                evicted = Some(Evicted::Idle);
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        let busy = Busy::default();
        let (close, closed) = oneshot::channel();
        table.open.insert(
            id,
            Slot {
                busy: busy.clone(),
                close: Some(close),
            },
        );
        Admission::Admitted {
            connection: Admitted {
                id,
                busy,
                closed,
                connections: Arc::clone(self),
            },
            evicted,
        }
    }

    /// Waits (at most `patience`) until the connections told to close have closed, so that their descriptors
    /// are free again before the next one is accepted: without it, a burst of new connections would pile up
    /// closing ones faster than they close.
    pub async fn wait_for_room(&self, patience: std::time::Duration) {
        let _ = tokio::time::timeout(patience, async {
            while self.open() > self.limit {
                self.left.notified().await;
            }
        })
        .await;
    }

    /// Connections currently open (including those told to close that have not finished yet).
    fn open(&self) -> usize {
        self.lock().open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admitted(admission: Admission) -> (Admitted, bool) {
        match admission {
            Admission::Admitted {
                connection,
                evicted,
            } => (connection, evicted.is_some()),
            Admission::Full => panic!("refused"),
        }
    }

    #[test]
    fn a_held_poll_makes_room_when_it_is_the_oldest_evictable_connection() {
        let table = Connections::new(2);
        let (first, _) = admitted(table.admit());
        let (second, _) = admitted(table.admit());
        let _first_request = first.busy().request();
        let _second_request = second.busy().request();
        let mut held = first.busy().hold_poll();
        let mut also_held = second.busy().hold_poll();
        // Both hold polls: the oldest is answered, not refused, and the newcomer is admitted.
        match table.admit() {
            Admission::Admitted {
                connection,
                evicted: Some(Evicted::HeldPoll),
            } => drop(connection),
            other => panic!("{other:?}"),
        }
        assert_eq!(held.evicted.try_recv(), Ok(()));
        assert!(also_held.evicted.try_recv().is_err());
        // A poll that stopped holding (answered) is busy like any request until it ends: with it and another
        // busy request live, there is no room.
        drop(also_held);
        let (third, _) = admitted(table.admit());
        let _third_request = third.busy().request();
        assert!(matches!(table.admit(), Admission::Full));
        drop(held);
    }

    #[test]
    fn a_fresh_idle_connection_outlives_polls_held_since_before_it() {
        let table = Connections::new(2);
        let (poller, _) = admitted(table.admit());
        let _request = poller.busy().request();
        let mut held = poller.busy().hold_poll();
        let (mut fresh, _) = admitted(table.admit());
        let (_newcomer, evicted) = admitted(table.admit());
        assert!(evicted);
        assert_eq!(held.evicted.try_recv(), Ok(()), "the older held poll went");
        assert!(
            fresh.closed.try_recv().is_err(),
            "the fresh connection stays"
        );
    }

    #[test]
    fn the_oldest_idle_connection_makes_room_and_busy_ones_are_kept() {
        let table = Connections::new(2);
        let (mut first, evicted) = admitted(table.admit());
        assert!(!evicted);
        let (mut second, _) = admitted(table.admit());
        let first_request = first.busy().request();

        // Full: the first is busy, so the second (idle) is told to close.
        let (third, evicted) = admitted(table.admit());
        assert!(evicted);
        assert_eq!(second.closed.try_recv(), Ok(()));
        assert!(first.closed.try_recv().is_err());
        drop(second);
        assert_eq!(table.open(), 2);

        // Full and everything busy: the newcomer is refused.
        let _third_request = third.busy().request();
        assert!(matches!(table.admit(), Admission::Full));

        // A finished request makes its connection idle, hence closable, again.
        drop(first_request);
        let (_fourth, evicted) = admitted(table.admit());
        assert!(evicted);
        assert_eq!(first.closed.try_recv(), Ok(()));
        drop(first);
        drop(third);
        assert_eq!(table.open(), 1);
    }

    #[test]
    fn the_limit_follows_the_open_file_limit() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(soft_open_files(limits), Some(1024));
        assert_eq!(
            soft_open_files(
                "Max open files            unlimited            unlimited            files"
            ),
            Some(u64::MAX)
        );
        assert_eq!(soft_open_files("nothing here"), None);
        assert_eq!(limit_for(1024), 896);
        assert_eq!(limit_for(256), 224);
        assert_eq!(limit_for(40), 16);
        assert_eq!(limit_for(20_000), 17_500);
    }
}
