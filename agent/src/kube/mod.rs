//! The Kubernetes plumbing every stage talks to the API server through: the [`client`] (kube's service
//! stack with Nagle off), the [`cluster`] (discovery of kinds, server-side apply, deletion, reads — each error
//! naming the object), the agent's persisted [`state`] (last known good release and inventory, in Secrets of
//! its namespace) and [`leader`] election on a Lease. Thin on purpose: nothing here decides what to write.

pub mod client;
pub mod cluster;
pub mod leader;
pub mod state;
