//! Recovery of recorded runs: the verified view rollback and promote plan from
//! ([`recorded`]), and cleaning up what a run left behind ([`cleanup`]).
//!
//! Nothing here trusts a capsule before it verifies: a recorded run is opened for rollback or
//! promote only when it is sealed and every artifact matches its seal, and every recorded path is
//! confined below the recorded root before any plan is made from it. Cleanup also acts on
//! unsealed runs (agentdiff may have been killed mid-run), so it trusts no recorded pid: the
//! backend checks each identity before signalling.

pub mod cleanup;
pub mod orphans;
pub mod recorded;

pub use cleanup::{CleanupError, CleanupResult, RecordedProcesses};
pub use recorded::{RecordedError, RecordedRun, RecordedTree};
