//! The seal (integrity.json: SHA-256 of every transaction artifact plus the backup objects the run
//! references) and its verification.
//!
//! This is local tamper evidence, not authenticity (seed 000): a process able to rewrite the whole
//! capsule can also rewrite the manifest.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::atomic;
use super::capsule::{
    now_rfc3339_millis, to_pretty_json, Artifact, Capsule, RecoveryArtifact, MAX_ARTIFACT_BYTES,
};
use super::objects::{validate_object_id, ObjectStore};
use super::run_id::RunId;
use super::StoreError;
use crate::SCHEMA_VERSION;

pub const ALGORITHM: &str = "sha256";

/// Contents of integrity.json.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Integrity {
    pub schema_version: u32,
    pub algorithm: String,
    pub run_id: String,
    pub sealed_at: String,
    /// Artifact file name → lowercase hex SHA-256 of its bytes.
    pub artifacts: BTreeMap<String, String>,
    /// Backup objects the run references (sorted, deduplicated).
    pub objects: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub run_id: RunId,
    /// integrity.json exists.
    pub sealed: bool,
    /// Sealed and no problem found.
    pub ok: bool,
    pub problems: Vec<VerifyProblem>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyProblem {
    /// An artifact file name, a directory entry name, or `object <hex>`.
    pub subject: String,
    pub problem: String,
}

impl Capsule {
    /// Seals the run: records a final `sealing` event in events.jsonl, writes integrity.json with
    /// the SHA-256 of every transaction artifact present and the referenced backup objects, and
    /// once that is durable appends `sealed` to recovery-events.jsonl (outside the seal).
    /// After this only recovery artifacts may be written. Refuses to seal a directory holding
    /// anything other than transaction or recovery artifacts.
    pub fn seal(&self, referenced_objects: &[String]) -> Result<Integrity, StoreError> {
        if self.is_sealed() {
            return Err(StoreError::AlreadySealed {
                run_id: self.id().to_string(),
            });
        }
        for hex in referenced_objects {
            validate_object_id(hex)?;
        }
        let objects: Vec<String> = referenced_objects
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();

        // Check the directory before recording the seal event, so a refused seal leaves the
        // event log untouched.
        self.sealable_artifacts()?;
        // `sealing` is covered by the seal; `sealed` is logged only once integrity.json is
        // durable (below), so a log never claims a seal that a crash prevented.
        self.event("sealing", json!({ "objects": objects.len() }))?;

        let mut artifacts = BTreeMap::new();
        for artifact in self.sealable_artifacts()? {
            let name = artifact.file_name();
            let (hex, _) = atomic::hash_file(&self.dir().join(name))?;
            artifacts.insert(name.to_string(), hex);
        }
        let integrity = Integrity {
            schema_version: SCHEMA_VERSION,
            algorithm: ALGORITHM.to_string(),
            run_id: self.id().to_string(),
            sealed_at: now_rfc3339_millis(),
            artifacts,
            objects,
        };
        let name = Artifact::Integrity.file_name();
        let bytes = to_pretty_json(name, &integrity)?;
        // Artifacts, events and backup objects were written without their own fsync; one flush of
        // the filesystem that holds them (the object store lives beside the runs) makes them
        // durable before the seal that vouches for them.
        atomic::sync_filesystem(self.dir())?;
        atomic::write_atomic(self.dir(), name, &bytes, atomic::Durability::Now)?;
        self.recovery_event("sealed", json!({ "objects": integrity.objects.len() }))?;
        Ok(integrity)
    }

    /// The transaction artifacts present in the run directory; errors on anything unexpected.
    fn sealable_artifacts(&self) -> Result<Vec<Artifact>, StoreError> {
        let mut found = Vec::new();
        let entries =
            fs::read_dir(self.dir()).map_err(|e| StoreError::io("list", self.dir(), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", self.dir(), e))?;
            let name = entry.file_name();
            let unexpected = || StoreError::UnexpectedEntry {
                run_id: self.id().to_string(),
                name: name.to_string_lossy().into_owned(),
            };
            let Some(name_str) = name.to_str() else {
                return Err(unexpected());
            };
            if let Some(artifact) = Artifact::from_file_name(name_str) {
                let file_type = entry
                    .file_type()
                    .map_err(|e| StoreError::io("inspect", entry.path(), e))?;
                if !file_type.is_file() {
                    return Err(StoreError::NotRegularFile {
                        path: entry.path(),
                        reason: "a transaction artifact must be a regular file",
                    });
                }
                found.push(artifact);
            } else if RecoveryArtifact::parse(name_str).is_err() {
                return Err(unexpected());
            }
        }
        found.sort();
        Ok(found)
    }

    /// Checks the seal: every listed artifact exists as a regular file with its sealed hash, no
    /// unexpected entry was added, and every referenced object is present and intact. Recovery
    /// artifacts do not affect the result. Returns `Err` only when the run directory cannot be
    /// read at all; everything else is a problem in the report.
    pub fn verify(&self, objects: &ObjectStore) -> Result<VerifyReport, StoreError> {
        let mut problems = Vec::new();
        let mut problem = |subject: &str, text: String| {
            problems.push(VerifyProblem {
                subject: subject.to_string(),
                problem: text,
            })
        };
        let integrity_name = Artifact::Integrity.file_name();
        let integrity_path = self.dir().join(integrity_name);
        let report = |sealed, problems: Vec<VerifyProblem>| VerifyReport {
            run_id: self.id().clone(),
            sealed,
            ok: sealed && problems.is_empty(),
            problems,
        };

        match fs::symlink_metadata(&integrity_path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                problem(
                    integrity_name,
                    "missing: the run was never sealed (interrupted or still running), so its \
                     artifacts cannot be verified"
                        .into(),
                );
                return Ok(report(false, problems));
            }
            Err(e) => return Err(StoreError::io("inspect", integrity_path, e)),
        }
        let manifest: Integrity = match atomic::read_bounded(&integrity_path, MAX_ARTIFACT_BYTES)
            .and_then(|bytes| {
                serde_json::from_slice(&bytes).map_err(|source| StoreError::MalformedArtifact {
                    run_id: self.id().to_string(),
                    name: integrity_name.into(),
                    source,
                })
            }) {
            Ok(m) => m,
            Err(e) => {
                problem(integrity_name, format!("unreadable seal: {e}"));
                return Ok(report(true, problems));
            }
        };
        if manifest.algorithm != ALGORITHM {
            problem(
                integrity_name,
                format!(
                    "unsupported algorithm {:?} (expected {ALGORITHM})",
                    manifest.algorithm
                ),
            );
            return Ok(report(true, problems));
        }
        if manifest.schema_version != SCHEMA_VERSION {
            problem(
                integrity_name,
                format!(
                    "schema_version {} is not the supported version {SCHEMA_VERSION}",
                    manifest.schema_version
                ),
            );
        }
        if manifest.run_id != self.id().as_str() {
            problem(
                integrity_name,
                format!(
                    "the seal belongs to run {:?}, not to this run directory",
                    manifest.run_id
                ),
            );
        }

        for (name, expected) in &manifest.artifacts {
            match Artifact::from_file_name(name) {
                Some(a) if a != Artifact::Integrity => {}
                _ => {
                    problem(
                        name,
                        "listed in integrity.json but not a transaction artifact name".into(),
                    );
                    continue;
                }
            }
            if validate_object_id(expected).is_err() {
                problem(
                    name,
                    format!("recorded digest {expected:?} is not a SHA-256"),
                );
                continue;
            }
            let path = self.dir().join(name);
            let meta = match fs::symlink_metadata(&path) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    problem(name, "missing: deleted after the seal".into());
                    continue;
                }
                Err(e) => {
                    problem(name, format!("cannot inspect: {e}"));
                    continue;
                }
            };
            if meta.file_type().is_symlink() {
                problem(
                    name,
                    "is a symbolic link, not the sealed file (replaced after the seal)".into(),
                );
                continue;
            }
            if !meta.is_file() {
                problem(name, "is not a regular file".into());
                continue;
            }
            match atomic::hash_file(&path) {
                Ok((actual, _)) if actual == *expected => {}
                Ok((actual, _)) => problem(
                    name,
                    format!(
                        "content changed since the seal: sealed SHA-256 {expected}, now {actual}"
                    ),
                ),
                Err(e) => problem(name, format!("cannot hash: {e}")),
            }
        }

        let entries =
            fs::read_dir(self.dir()).map_err(|e| StoreError::io("list", self.dir(), e))?;
        let mut extra = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", self.dir(), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == integrity_name || manifest.artifacts.contains_key(&name) {
                continue;
            }
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            let text = if Artifact::from_file_name(&name).is_some() {
                "present but not listed in integrity.json (added after the seal)".to_string()
            } else if RecoveryArtifact::parse(&name).is_ok() {
                if is_file {
                    continue;
                }
                "recovery artifact is not a regular file".to_string()
            } else {
                "unexpected entry in a sealed run directory".to_string()
            };
            extra.push((name, text));
        }
        extra.sort();
        for (name, text) in extra {
            problem(&name, text);
        }

        for hex in &manifest.objects {
            let subject = format!("object {hex}");
            if let Err(e) = validate_object_id(hex).and_then(|()| objects.verify_object(hex)) {
                problem(&subject, e.to_string());
            }
        }
        Ok(report(true, problems))
    }

    /// The sealed manifest, if the run is sealed.
    pub fn integrity(&self) -> Result<Integrity, StoreError> {
        self.read_artifact(Artifact::Integrity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integrity_rejects_unknown_fields() {
        let text = r#"{"schema_version":1,"algorithm":"sha256","run_id":"a","sealed_at":"x",
            "artifacts":{},"objects":[],"extra":1}"#;
        assert!(serde_json::from_str::<Integrity>(text).is_err());
    }
}
