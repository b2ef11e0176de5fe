//! `before.json` and `after.json`: a manifest's header in the run directory, its entries in the
//! object store.
//!
//! The entries of a large tree are most of a capsule's bytes, and they repeat: an unchanged tree
//! yields the same before-entries run after run, and the same after-entries too. Storing them as a
//! content-addressed object (compact JSON, named by its SHA-256) makes a warm run cost almost no new
//! bytes. The header names the object (`entries_object`), the seal covers both the header (as an
//! artifact) and the object (as a referenced object), and every read verifies the object's hash.

use serde_json::{json, Value};

use super::capsule::{Capsule, MAX_ARTIFACT_BYTES};
use super::{Artifact, ObjectStore, StoreError};
use crate::fs::Manifest;

fn check_manifest_artifact(artifact: Artifact, method: &'static str) -> Result<(), StoreError> {
    match artifact {
        Artifact::Before | Artifact::After => Ok(()),
        other => Err(StoreError::ReservedArtifact {
            name: other.file_name().to_string(),
            method,
            reason: "only before.json and after.json hold manifests",
        }),
    }
}

fn malformed(capsule: &Capsule, artifact: Artifact, message: String) -> StoreError {
    StoreError::MalformedArtifact {
        run_id: capsule.id().to_string(),
        name: artifact.file_name().to_string(),
        source: <serde_json::Error as serde::de::Error>::custom(message),
    }
}

impl Capsule {
    /// Writes a manifest: entries into the object store, the rest as the artifact. Returns the
    /// entries object's hash, which the caller must reference when sealing.
    pub fn write_manifest(
        &self,
        artifact: Artifact,
        manifest: &Manifest,
        objects: &ObjectStore,
    ) -> Result<String, StoreError> {
        check_manifest_artifact(artifact, "write_manifest")?;
        let entries =
            serde_json::to_vec(&manifest.entries).map_err(|source| StoreError::Serialize {
                name: artifact.file_name().to_string(),
                source,
            })?;
        let hex = objects.put_bytes(&entries)?;
        // The header without its entries: a JSON tree of every entry would cost far more memory
        // than the entries themselves. (Listing every field keeps this in step with `Manifest`.)
        let shallow = Manifest {
            schema_version: manifest.schema_version,
            root: manifest.root.clone(),
            ignore_lines: manifest.ignore_lines.clone(),
            entries: Default::default(),
            unsupported: manifest.unsupported.clone(),
            excluded: manifest.excluded.clone(),
            stats: manifest.stats.clone(),
        };
        let mut header =
            serde_json::to_value(&shallow).map_err(|source| StoreError::Serialize {
                name: artifact.file_name().to_string(),
                source,
            })?;
        if let Some(map) = header.as_object_mut() {
            map.remove("entries");
            map.insert(
                "entries_object".into(),
                json!({
                    "sha256": hex,
                    "count": manifest.entries.len(),
                    "bytes": entries.len(),
                    "format": "json",
                }),
            );
        }
        self.write_artifact(artifact, &header)?;
        Ok(hex)
    }

    /// Reads a manifest written by [`Capsule::write_manifest`], verifying the entries object.
    pub fn read_manifest(
        &self,
        artifact: Artifact,
        objects: &ObjectStore,
    ) -> Result<Manifest, StoreError> {
        check_manifest_artifact(artifact, "read_manifest")?;
        let header = self.read_artifact_value(artifact)?;
        self.manifest_from_header(artifact, header, objects)
    }

    /// The manifest a header names, its entries object verified against its hash.
    pub(crate) fn manifest_from_header(
        &self,
        artifact: Artifact,
        mut header: Value,
        objects: &ObjectStore,
    ) -> Result<Manifest, StoreError> {
        let hex = header
            .get("entries_object")
            .and_then(|o| o.get("sha256"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| malformed(self, artifact, "missing entries_object.sha256".into()))?;
        let bytes = objects.read_verified(&hex, MAX_ARTIFACT_BYTES)?;
        if let Some(map) = header.as_object_mut() {
            map.remove("entries_object");
            map.insert("entries".into(), Value::Object(Default::default()));
        }
        let mut manifest: Manifest =
            serde_json::from_value(header).map_err(|source| StoreError::MalformedArtifact {
                run_id: self.id().to_string(),
                name: artifact.file_name().to_string(),
                source,
            })?;
        // Straight into typed entries: no intermediate JSON tree.
        manifest.entries = serde_json::from_slice(&bytes)
            .map_err(|e| malformed(self, artifact, format!("entries object {hex}: {e}")))?;
        Ok(manifest)
    }

    /// The entries object a stored manifest names, if any.
    pub fn manifest_entries_object(
        &self,
        artifact: Artifact,
    ) -> Result<Option<String>, StoreError> {
        check_manifest_artifact(artifact, "manifest_entries_object")?;
        let header = self.read_artifact_value(artifact)?;
        Ok(header
            .get("entries_object")
            .and_then(|o| o.get("sha256"))
            .and_then(Value::as_str)
            .map(str::to_string))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::fs::{BackupState, Entry, EntryKind, ScanStats};
    use crate::store::Store;

    fn manifest() -> Manifest {
        let mut entries = BTreeMap::new();
        entries.insert(
            "a.txt".to_string(),
            Entry {
                kind: EntryKind::File,
                size: 2,
                mode: 0o644,
                mtime_ns: 1,
                ctime_ns: 2,
                dev: 3,
                ino: 4,
                nlink: 1,
                sha256: Some("0".repeat(64)),
                symlink_target: None,
                backup: BackupState::Stored,
            },
        );
        Manifest {
            schema_version: 1,
            root: "/r".into(),
            ignore_lines: vec!["x".into()],
            entries,
            unsupported: vec![],
            excluded: vec![],
            stats: ScanStats::default(),
        }
    }

    #[test]
    fn manifests_round_trip_and_share_identical_entries() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let c = store.create_run(None).unwrap();
        let m = manifest();
        let h1 = c
            .write_manifest(Artifact::Before, &m, store.objects())
            .unwrap();
        let h2 = c
            .write_manifest(Artifact::After, &m, store.objects())
            .unwrap();
        assert_eq!(h1, h2, "identical entries are one object");
        assert_eq!(
            c.read_manifest(Artifact::Before, store.objects()).unwrap(),
            m
        );
        let header = c.read_artifact_value(Artifact::Before).unwrap();
        assert!(header.get("entries").is_none());
        assert_eq!(header["entries_object"]["count"], 1);
        assert_eq!(
            c.manifest_entries_object(Artifact::After).unwrap(),
            Some(h1.clone())
        );
        assert!(c
            .write_manifest(Artifact::Result, &m, store.objects())
            .is_err());

        // A tampered entries object is refused on read.
        let path = store.objects().object_path(&h1).unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[5] ^= 1;
        std::fs::write(&path, bytes).unwrap();
        assert!(c.read_manifest(Artifact::Before, store.objects()).is_err());
    }
}
