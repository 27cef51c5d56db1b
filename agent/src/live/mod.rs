//! Live state: one [`watch`] per applied kind (filtered by the fleet's label) keeps every managed object in a
//! cache, and sends each change to the engine's loop as the object's key; [`health`] judges an object from
//! its status. The engine reads the cache for health (status, `dependsOn`), the healer for drift, prune for
//! its `windvane.io/prune` annotation; nothing here writes to the cluster.

pub mod health;
pub mod watch;
