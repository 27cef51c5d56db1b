//! Layer 2: the wire types agents, the source server and the command line exchange (sync state, heartbeat and
//! enrolment, the fleet API). Leaves: they use only the error type.

pub mod fleet_api;
pub mod heartbeat;
pub mod status;
