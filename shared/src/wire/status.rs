//! The status vocabulary that agents report and the server rolls up: one state per object, app and cluster,
//! ordered worst first, and the pure functions that combine them. Agents compute it from what they applied
//! and watched; the server adds `Unknown` and `NeverSeen` for clusters it has not heard from (see the
//! server's status module), which are never derived from these.

use serde::{Deserialize, Serialize};

/// A cluster's, app's or object's state as its agent sees it, worst first: `Ord` puts the worst first, so
/// the worst of several is their minimum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SyncState {
    /// Cannot apply, or refuses the source.
    Failed,
    /// Applied, but unhealthy.
    Degraded,
    /// Another manager keeps taking a field back; Windvane has stopped fighting for now.
    Contested,
    /// Drift not yet reverted, or reported only (selfHeal false).
    OutOfSync,
    /// An operator holds the object (`windvane.io/hold-until`).
    Held,
    /// Applied and still rolling out.
    Progressing,
    /// Applied, healthy, and as the release says.
    Synced,
}

impl SyncState {
    /// Every state, worst first.
    pub const ALL: [SyncState; 7] = [
        SyncState::Failed,
        SyncState::Degraded,
        SyncState::Contested,
        SyncState::OutOfSync,
        SyncState::Held,
        SyncState::Progressing,
        SyncState::Synced,
    ];

    /// The name used in metrics labels, the API and the page.
    pub fn as_str(self) -> &'static str {
        match self {
            SyncState::Failed => "Failed",
            SyncState::Degraded => "Degraded",
            SyncState::Contested => "Contested",
            SyncState::OutOfSync => "OutOfSync",
            SyncState::Held => "Held",
            SyncState::Progressing => "Progressing",
            SyncState::Synced => "Synced",
        }
    }

    /// The worst of `states`; `Synced` when there are none (nothing to be out of sync with).
    pub fn worst(states: impl IntoIterator<Item = SyncState>) -> SyncState {
        states.into_iter().min().unwrap_or(SyncState::Synced)
    }
}

impl std::fmt::Display for SyncState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worst_follows_the_design_order() {
        use SyncState::*;
        assert_eq!(SyncState::worst([Synced, Progressing, Held]), Held);
        assert_eq!(SyncState::worst([Synced, OutOfSync, Contested]), Contested);
        assert_eq!(SyncState::worst([Degraded, Failed]), Failed);
        assert_eq!(SyncState::worst([]), Synced);
        let mut sorted = SyncState::ALL;
        sorted.sort();
        assert_eq!(sorted, SyncState::ALL);
    }
}
