//! A dated probe record that a run's evidence may cite: a control may be labelled verified when a
//! probe for the same backend, the same settings digest and the same host showed it holding,
//! within a stated maximum age.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use agentdiff_backend_api::citation::{Citation, HostId};
use agentdiff_backend_api::{BackendOptions, Boundary};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ProbeResult, Verdict};

#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("could not read probe records from {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("probe records in {path} are not a list of records: {source}")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("could not identify this host: {0}")]
    Host(#[source] crate::host::HostError),
    #[error("could not serialise the backend settings: {0}")]
    Settings(#[source] serde_json::Error),
    #[error("could not read the settings file {path} an option names: {source}")]
    SettingsFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The host this process runs on, and its boot.
pub fn current_host() -> Result<HostId, RecordError> {
    let boot_id = crate::host::boot_id().map_err(RecordError::Host)?;
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    Ok(HostId { hostname, boot_id })
}

/// `sha256:<hex>` of the backend id, its options, and the content of every regular file an option
/// names (a settings file edited after the probe must not inherit the probe's verdict).
pub fn settings_digest(backend: &str, options: &BackendOptions) -> Result<String, RecordError> {
    let json = serde_json::to_vec(options).map_err(RecordError::Settings)?;
    let mut h = Sha256::new();
    h.update(b"agentdiff-probe-settings-v2\0");
    h.update(backend.as_bytes());
    h.update(b"\0");
    h.update(&json);
    for key in options.keys() {
        for value in options.get_all(key) {
            let path = std::path::Path::new(value);
            let is_file = std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() <= 1 << 20);
            if is_file {
                let content = std::fs::read(path).map_err(|source| RecordError::SettingsFile {
                    path: value.clone(),
                    source,
                })?;
                h.update(b"\0file\0");
                h.update(value.as_bytes());
                h.update(b"\0");
                h.update(Sha256::digest(&content));
            }
        }
    }
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
            host: current_host()?,
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

/// Read the records `agentdiff doctor --probe --record FILE` wrote (a JSON array).
pub fn read_records(path: &std::path::Path) -> Result<Vec<ProbeRecord>, RecordError> {
    let shown = || path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| RecordError::Read {
        path: shown(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| RecordError::Parse {
        path: shown(),
        source,
    })
}

/// The newest record that vouches for `boundary` for this backend, settings and host, within
/// `max_age`, as a citation for the run's evidence. `None` means the control stays at its
/// declared level.
pub fn cite(
    records: &[ProbeRecord],
    backend: &str,
    options: &BackendOptions,
    boundary: Boundary,
    max_age: Duration,
) -> Option<Citation> {
    let digest = settings_digest(backend, options).ok()?;
    let host = current_host().ok()?;
    let now = now_unix();
    records
        .iter()
        .filter(|r| r.vouches_for(backend, &digest, &host, boundary, max_age, now))
        .max_by_key(|r| r.made_at_unix)
        .map(|r| Citation {
            boundary,
            backend: r.backend.clone(),
            settings_digest: r.settings_digest.clone(),
            host: r.host.clone(),
            probed_at_unix: r.made_at_unix,
            max_age_seconds: max_age.as_secs(),
            summary: r
                .results
                .iter()
                .find(|x| x.boundary == Some(boundary))
                .map(|x| x.summary.clone())
                .unwrap_or_default(),
        })
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
    fn cite_picks_a_fresh_matching_record_and_nothing_else() {
        let options = BackendOptions::new();
        let mut fresh = record(Verdict::Verified);
        fresh.settings_digest = settings_digest("srt", &options).unwrap();
        fresh.host = current_host().unwrap();
        fresh.made_at_unix = now_unix() - 10;
        let mut stale = fresh.clone();
        stale.made_at_unix = now_unix() - 10_000;
        let hour = Duration::from_secs(3600);
        let c = cite(
            &[stale.clone(), fresh.clone()],
            "srt",
            &options,
            Boundary::FilesystemWrites,
            hour,
        )
        .unwrap();
        assert_eq!(c.probed_at_unix, fresh.made_at_unix);
        assert_eq!(c.max_age_seconds, 3600);
        assert!(cite(&[stale], "srt", &options, Boundary::FilesystemWrites, hour).is_none());
        let mut other = BackendOptions::new();
        other.push("srt-settings", "/other.json");
        assert!(cite(
            &[fresh.clone()],
            "srt",
            &other,
            Boundary::FilesystemWrites,
            hour
        )
        .is_none());
        // Round trip through the file doctor writes.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("records.json");
        std::fs::write(&path, serde_json::to_string(&vec![fresh.clone()]).unwrap()).unwrap();
        assert_eq!(read_records(&path).unwrap(), vec![fresh]);
        assert!(read_records(&dir.path().join("missing.json")).is_err());
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
