//! What holds a verified release back on this cluster. The engine asks [`pending::Gates`] for the release's
//! [`wave::GatePlan`] (its rollout wave, the approvals it needs, the maintenance [`windows`] of the apps it
//! changes): without one the release is taken at once; with one it is held in memory while tasks watch the
//! signed schedule ([`wave::run`]), the server's rollout view ([`wave::watch_server`]) and the store's
//! approval file ([`approval::watch_store`]). Each event of the gate comes back to the engine's loop as a
//! [`pending::GateStep`]: a report of why it waits (with the [`preview`] of what it would change here, for the
//! status and the heartbeat), or the release to take. Meanwhile the last known good is enforced and healed.

pub mod approval;
pub mod pending;
pub mod preview;
pub mod wave;
pub mod windows;
