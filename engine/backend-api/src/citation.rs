//! What a run's evidence cites when a recorded probe (`agentdiff doctor --probe --record FILE`)
//! vouched for one of its backend's controls. The conformance crate makes citations; the
//! transaction stores them in `result.json` (`runtime.verified_controls`); reports read them typed.
//!
//! Not defended: probe record files are plain JSON, not authenticated; whoever can write the
//! file named by `--probe-records` can make a citation (docs/conformance.md).

use serde::{Deserialize, Serialize};

use super::Boundary;

/// The host and boot a probe ran on: a probe from another host or an earlier boot does not vouch
/// for this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostId {
    pub hostname: String,
    pub boot_id: String,
}

/// A probe record's facts, cited for one boundary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Citation {
    pub boundary: Boundary,
    pub backend: String,
    pub settings_digest: String,
    pub host: HostId,
    /// When the probe ran, in seconds since the Unix epoch.
    pub probed_at_unix: u64,
    pub max_age_seconds: u64,
    pub summary: String,
}

impl Citation {
    /// How long before `now_unix` the probe ran, in whole minutes; `None` when the record is
    /// dated after `now_unix` (a clock moved back, or a hand-written record).
    pub fn age_minutes(&self, now_unix: u64) -> Option<u64> {
        now_unix
            .checked_sub(self.probed_at_unix)
            .map(|seconds| seconds / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_age_is_unknown_for_a_record_dated_in_the_future() {
        let c = Citation {
            boundary: Boundary::Network,
            backend: "b".into(),
            settings_digest: "d".into(),
            host: HostId {
                hostname: "h".into(),
                boot_id: "x".into(),
            },
            probed_at_unix: 1_000,
            max_age_seconds: 60,
            summary: String::new(),
        };
        assert_eq!(c.age_minutes(1_000 + 125), Some(2));
        assert_eq!(c.age_minutes(999), None);
        assert_eq!(c.age_minutes(0), None);
    }
}
