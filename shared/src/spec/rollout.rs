//! The rollout plan a release carries: its waves (selector, percent, soak, gate), the publisher's signed halt
//! control and the approval policy. Types only: `fleet.yaml`'s `rollout:` section is read into them by the
//! publisher's fleet-tree reader, they travel in the bundle and the signed channel pointer
//! ([`crate::format::release::ReleasePointer::rollout`]), and the decisions over them (which wave a cluster is
//! in, when it opens, whether it may take a release) are in [`crate::decide::rollout`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::spec::selector::LabelSelector;

/// The rollout plan of a release: ordered waves, and the publisher's signed controls (halt).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rollout {
    pub waves: Vec<Wave>,
    /// Set by `windvane rollout halt`: no further cluster takes this release; those that did keep it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub halted: bool,
    /// Incremented by each halt or resume of the same serial, so that an older control is never taken
    /// over a newer one (a store replaying the pointer from before a halt).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub control: u64,
    /// Two-person approval: no cluster applies the release before this many approver keys (not the
    /// publisher's) have signed it ([`crate::decide::approval`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalPolicy>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One wave: the clusters its selector matches (all when empty) whose [`bucket`] falls below `percent`, and
/// not in an earlier wave; how long it soaks before the next wave may open; and whether the next waves wait
/// for it to be healthy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Wave {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "LabelSelector::is_empty")]
    pub selector: LabelSelector,
    /// 1 to 100 (cumulative over the hash space: a later wave with a larger percent takes the next slice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<u32>,
    /// Time between this wave opening and the next one opening, at least.
    #[serde(
        default,
        with = "crate::text::duration::text",
        skip_serializing_if = "Duration::is_zero"
    )]
    pub soak: Duration,
    #[serde(default, skip_serializing_if = "Gate::is_none")]
    pub gate: Gate,
}

/// What the waves after this one wait for besides time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gate {
    /// Time only.
    #[default]
    None,
    /// Every cluster of this wave Synced (applied and healthy) on the release, as the server reports.
    Healthy,
}

impl Gate {
    fn is_none(&self) -> bool {
        *self == Gate::None
    }
}

impl Wave {
    /// `name`, or `wave N` (1-based).
    pub fn label(&self, index: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("wave {}", index + 1))
    }
}

/// The longest soak one wave may have: `fleet.yaml` refuses more, and a pointer read without verification
/// (the server's view) is clamped to it, so that no sum of soaks can overflow.
pub const MAX_SOAK: Duration = Duration::from_secs(365 * 24 * 3600);

/// The release's approval policy, signed in its rollout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApprovalPolicy {
    /// How many distinct approver keys (not the publisher's) must sign before a cluster applies it; ≥ 1.
    pub threshold: u32,
}
