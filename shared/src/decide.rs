//! Layer 5: the decisions over a verified release, as pure functions: a cluster's wave and whether it may take
//! the release now (rollout), approvals that count (approval), `${…}` variables and rendering an app for a
//! cluster (variables, render), and the desired objects with Windvane's labels and settings (desired).

pub mod approval;
pub mod desired;
pub mod render;
pub mod rollout;
pub mod variables;
