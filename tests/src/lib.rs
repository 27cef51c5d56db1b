//! Test harness for Windvane's integration and end-to-end tests and benchmarks: real Kubernetes control
//! planes (`localkube`); the real `windvane-server` under test, started one way for the server tests and
//! the fleet tests (`server`), with a simulated signing agent (`heartbeat_agent`), HTTP helpers (`http`)
//! and a throwaway PostgreSQL (`postgres`); fleet fixtures and the real agent (`fleet`); a static store
//! server that can be broken on purpose (`store_server`); the fleet as the API and the page show it
//! (`views`); installs from the shipped manifests and charts on a real node (`install`); a TCP proxy that can
//! blackhole traffic (`proxy`); a real OCI registry for charts (`registry`); age identity Secrets and the search for
//! secret values in clear (`secrets`); Windvane's own binaries as child processes (`process`) and what
//! `/proc` says of their CPU and memory (`procfs`); and polling
//! with deadlines (`poll`).

pub mod fleet;
pub mod haproxy;
pub mod heartbeat_agent;
pub mod http;
pub mod install;
pub mod localkube;
pub mod poll;
pub mod postgres;
pub mod process;
pub mod procfs;
pub mod proxy;
pub mod registry;
pub mod s3;
pub mod secrets;
pub mod server;
pub mod store_server;
pub mod views;
pub mod webhook;
