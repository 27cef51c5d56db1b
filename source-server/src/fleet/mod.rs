//! Stage 4, the fleet view: what people and tools read about the fleet. Everything is computed at read time
//! from what the database holds (so every replica shows the same fleet) and the clock: each cluster's state
//! ([`status`], Unknown once silent past its grace period), the rows and roll-up ([`view`]), then rendered as
//! the page ([`page`], auto-escaping templates), the JSON API and `/metrics` (`read`, [`metrics`]), and per
//! channel as the rollout view (`rollout`). Data comes from [`crate::db`] and the store's pointers; it goes
//! out through [`crate::http`] to browsers, `windvane status`, scrapers and waiting agents.

pub mod metrics;
pub mod page;
pub(crate) mod read;
pub(crate) mod rollout;
pub mod status;
pub mod view;
