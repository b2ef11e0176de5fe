//! A dated probe record that a run's evidence may cite: a control may be labelled verified when a
//! probe for the same backend, the same settings digest and the same host showed it holding,
//! within a stated maximum age.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentdiff_engine::backend::{BackendOptions, Boundary};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ProbeResult, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("could not identify this host: {0}")]
    Host(String),
    #[error("could not serialise the backend settings: {0}")]
    Settings(String),
}

/// Which host (and boot) a probe ran on. A reboot can change kernel settings and installed
/// components, so a probe from an earlier boot does not vouch for this one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostId {
    pub hostname: String,
    pub boot_id: String,
}

impl HostId {
    pub fn current() -> Result<Self, RecordError> {
        let boot_id = crate::host::boot_id().map_err(|e| RecordError::Host(e.to_string()))?;
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_default();
        Ok(Self { hostname, boot_id })
    }
}

/// `sha256:<hex>` of the backend id and its options (the settings a probe ran with).
pub fn settings_digest(backend: &str, options: &BackendOptions) -> Result<String, RecordError> {
    let json = serde_json::to_vec(options).map_err(|e| RecordError::Settings(e.to_string()))?;
    let mut h = Sha256::new();
    h.update(b"agentdiff-probe-settings-v1\0");
    h.update(backend.as_bytes());
    h.update(b"\0");
    h.update(&json);
    Ok(format!("sha256:{}", hex::encode(h.finalize())))
}

/// Probe results for one backend, settings digest and host, with when they were made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeRecord {
    pub backend: String,
    pub settings_digest: String,
    pub host: HostId,
    /// Seconds since the Unix epoch.
    pub made_at_unix: u64,
    pub results: Vec<ProbeResult>,
}

impl ProbeRecord {
    pub fn new(
        backend: &str,
        options: &BackendOptions,
        results: Vec<ProbeResult>,
    ) -> Result<Self, RecordError> {
        Ok(Self {
            backend: backend.to_string(),
            settings_digest: settings_digest(backend, options)?,
            host: HostId::current()?,
            made_at_unix: now_unix(),
            results,
        })
    }

    /// Whether this record lets a run label `boundary` verified: same backend, same settings
    /// digest, same host and boot, made no longer than `max_age` before `now_unix`, and the
    /// boundary's probe said `verified`. A record dated in the future vouches for nothing.
    pub fn vouches_for(
        &self,
        backend: &str,
        settings_digest: &str,
        host: &HostId,
        boundary: Boundary,
        max_age: Duration,
        now_unix: u64,
    ) -> bool {
        self.backend == backend
            && self.settings_digest == settings_digest
            && &self.host == host
            && self.made_at_unix <= now_unix
            && now_unix - self.made_at_unix <= max_age.as_secs()
            && self
                .results
                .iter()
                .any(|r| r.boundary == Some(boundary) && r.verdict == Verdict::Verified)
    }
}

pub fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probes::ProbeKind;

    fn record(verdict: Verdict) -> ProbeRecord {
        ProbeRecord {
            backend: "srt".into(),
            settings_digest: "sha256:aa".into(),
            host: HostId {
                hostname: "h".into(),
                boot_id: "b".into(),
            },
            made_at_unix: 1000,
            results: vec![ProbeResult {
                probe: ProbeKind::OutsideWrite,
                boundary: Some(Boundary::FilesystemWrites),
                verdict,
                summary: String::new(),
                evidence: serde_json::Value::Null,
            }],
        }
    }

    #[test]
    fn vouches_only_for_same_backend_settings_host_and_age() {
        let r = record(Verdict::Verified);
        let host = r.host.clone();
        let fs = Boundary::FilesystemWrites;
        let hour = Duration::from_secs(3600);
        assert!(r.vouches_for("srt", "sha256:aa", &host, fs, hour, 1500));
        assert!(!r.vouches_for("local", "sha256:aa", &host, fs, hour, 1500));
        assert!(!r.vouches_for("srt", "sha256:bb", &host, fs, hour, 1500));
        let other = HostId {
            boot_id: "c".into(),
            ..host.clone()
        };
        assert!(!r.vouches_for("srt", "sha256:aa", &other, fs, hour, 1500));
        assert!(!r.vouches_for("srt", "sha256:aa", &host, fs, hour, 1000 + 3601));
        assert!(
            !r.vouches_for("srt", "sha256:aa", &host, fs, hour, 999),
            "future record"
        );
        assert!(!r.vouches_for("srt", "sha256:aa", &host, Boundary::Network, hour, 1500));
        assert!(!record(Verdict::NotEnforced).vouches_for(
            "srt",
            "sha256:aa",
            &host,
            fs,
            hour,
            1500
        ));
    }

    #[test]
    fn settings_digest_depends_on_backend_and_options() {
        let mut o = BackendOptions::new();
        let a = settings_digest("srt", &o).unwrap();
        o.push("settings", "/x.json");
        let b = settings_digest("srt", &o).unwrap();
        assert_ne!(a, b);
        assert_ne!(a, settings_digest("local", &BackendOptions::new()).unwrap());
        assert!(a.starts_with("sha256:"));
    }
}
