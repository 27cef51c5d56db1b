//! Reporting: the agent's [`status`] (a pure function of what the stages told it: the source, each object's
//! outcome and health, drift), published on a watch channel that the [`heartbeat`] task signs and sends to the
//! source server and the [`admin`] server serves (`/readyz`, `/status`, `/metrics`); the [`metrics`] are
//! recorded by the engine and the healer. The engine's side is [`reporting::Reporting`]: the status sender, the
//! metrics and what was last published from them.

pub mod admin;
pub mod heartbeat;
pub mod metrics;
pub mod replica;
pub mod reporting;
pub mod status;
