//! Shared process helpers for backends: identities, descendant tracking, identity-checked cleanup,
//! listening-socket snapshots.

use serde::{Deserialize, Serialize};

/// A process identity that survives pid reuse: pid + start time (clock ticks since boot, from
/// `/proc/PID/stat` field 22) + boot id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time_ticks: u64,
    pub boot_id: String,
}
