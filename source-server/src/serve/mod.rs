//! Stage 2, serving the store: what agents fetch. Channel pointers, bundles and approvals are read from the
//! static store under `--root` (written there by `windvane publish`) through an in-memory `files` cache with
//! strong ETags; a pointer `GET` with `Prefer: wait=N` is held until a publish changes it (`long_poll`); the
//! rollout views that waiting agents read every few seconds are built at most once a second per channel
//! (`rollout_cache`, built by `crate::fleet::rollout`). Responses go back to the agents through
//! [`crate::http`]; nothing here writes the store or the database.

pub(crate) mod files;
pub(crate) mod handlers;
pub(crate) mod long_poll;
pub(crate) mod rollout_cache;
