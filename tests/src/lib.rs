//! Test harness for Windvane's end-to-end tests and benchmarks: real Kubernetes control planes
//! (`localkube`), fleet fixtures and the real agent (`fleet`), a static store server that can be broken on
//! purpose (`store_server`), a TCP proxy that can blackhole traffic (`proxy`), and Windvane's own
//! binaries as child processes (`process`).

pub mod fleet;
pub mod localkube;
pub mod process;
pub mod proxy;
pub mod server_support;
pub mod store_server;
