//! Recovery of recorded runs: the verified view rollback and promote plan from
//! ([`recorded`]).
//!
//! Nothing here trusts a capsule before it verifies: a recorded run is opened only when it is
//! sealed and every artifact matches its seal, and every recorded path is confined below the
//! recorded root before any plan is made from it.

pub mod recorded;

pub use recorded::{RecordedError, RecordedRun, RecordedTree};
