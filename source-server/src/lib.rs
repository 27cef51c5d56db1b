//! Windvane's source server and release tooling. The library holds what the two binaries share:
//! [`store`] (the static store's layout, atomic publishing, reading a store from a directory or a URL),
//! [`server`] (the source server daemon) and [`error`]. The binaries are `windvane` (release engineers and
//! SREs) and `windvane-server` (the daemon).

pub mod error;
pub mod server;
pub mod store;

pub use error::{Error, Result};
