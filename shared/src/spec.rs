//! Layer 2: what a fleet declares, carried in the signed bundle: label selectors, the rollout plan (waves, halt,
//! approval policy) and maintenance windows, each with its own pure meaning (a selector matches labels; a window
//! is open at an instant it is given). Leaves beside `wire`: they use only the text codecs.

pub mod rollout;
pub mod selector;
pub mod window;
