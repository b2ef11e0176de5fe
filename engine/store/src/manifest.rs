//! `before.json` and `after.json`: a manifest's header in the run directory, its entries in the
//! object store as a manifest tree (see [`super::tree`]).
//!
//! The entries of a large tree are most of a capsule's bytes, and they repeat: an unchanged tree
//! yields the same before-entries run after run, and the same after-entries too. Stored as one
//! content-addressed object per directory, an unchanged directory costs no new bytes, and a run
//! that changes one file adds only the trees on that file's path. The header (schema version 2)
//! names the root tree (`root_tree`); the seal covers the header (as an artifact) and the root
//! tree (as a referenced object), which names everything below it by hash; every read verifies
//! every tree object's hash.
//!
//! Headers of schema version 1 name one entries object (`entries_object`: every entry as one
//! compact JSON map); they are still read.

use serde_json::{json, Value};

use super::capsule::{Capsule, MAX_ARTIFACT_BYTES};
use super::tree::{self, TreeWrite, TREE_FORMAT};
use super::{Artifact, ObjectStore, StoreError};
use agentdiff_scan::Manifest;

pub use agentdiff_scan::MANIFEST_SCHEMA_VERSION;

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

/// The object a manifest header names for its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestObject {
    /// Schema version 2: the root tree.
    Tree(String),
    /// Schema version 1: one object holding every entry.
    Entries(String),
}

impl ManifestObject {
    fn of(header: &Value) -> Option<ManifestObject> {
        let named = |key: &str| {
            header
                .get(key)
                .and_then(|o| o.get("sha256"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        named("root_tree")
            .map(ManifestObject::Tree)
            .or_else(|| named("entries_object").map(ManifestObject::Entries))
    }

    pub fn hex(&self) -> &str {
        match self {
            ManifestObject::Tree(h) | ManifestObject::Entries(h) => h,
        }
    }
}

impl Capsule {
    /// Writes a manifest held in memory: entries into the object store as a tree, the rest as
    /// the artifact. Returns the root tree's hash, which the caller must reference when sealing.
    pub fn write_manifest(
        &self,
        artifact: Artifact,
        manifest: &Manifest,
        objects: &ObjectStore,
    ) -> Result<String, StoreError> {
        check_manifest_artifact(artifact, "write_manifest")?;
        let written = tree::write_tree(&manifest.entries, objects)?;
        self.write_manifest_header(artifact, manifest, &written)?;
        Ok(written.root)
    }

    /// Writes the artifact of a manifest whose entries are already stored as the tree `tree`
    /// (a streamed scan); `manifest.entries` is not written.
    pub fn write_manifest_header(
        &self,
        artifact: Artifact,
        manifest: &Manifest,
        tree: &TreeWrite,
    ) -> Result<(), StoreError> {
        check_manifest_artifact(artifact, "write_manifest_header")?;
        // The header without its entries. (Listing every field keeps this in step with
        // `Manifest`.)
        let shallow = Manifest {
            schema_version: MANIFEST_SCHEMA_VERSION,
            root: manifest.root.clone(),
            ignore_lines: manifest.ignore_lines.clone(),
            entries: Default::default(),
            unsupported: manifest.unsupported.clone(),
            excluded: manifest.excluded.clone(),
            excluded_programs: manifest.excluded_programs.clone(),
            git_layouts: manifest.git_layouts.clone(),
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
                "root_tree".into(),
                json!({
                    "sha256": tree.root,
                    "entries": tree.entries,
                    "trees": tree.trees,
                    "format": TREE_FORMAT,
                }),
            );
        }
        self.write_artifact(artifact, &header)
    }

    /// Reads a manifest written by [`Capsule::write_manifest`] (or a schema-1 header naming an
    /// entries object), verifying every object it reads.
    pub fn read_manifest(
        &self,
        artifact: Artifact,
        objects: &ObjectStore,
    ) -> Result<Manifest, StoreError> {
        check_manifest_artifact(artifact, "read_manifest")?;
        let header = self.read_artifact_value(artifact)?;
        self.manifest_from_header(artifact, header, objects)
    }

    /// The manifest a header names, its entries read from verified objects.
    pub(crate) fn manifest_from_header(
        &self,
        artifact: Artifact,
        header: Value,
        objects: &ObjectStore,
    ) -> Result<Manifest, StoreError> {
        let (mut manifest, named) = self.header_only(artifact, header)?;
        manifest.entries = match &named {
            ManifestObject::Tree(root) => tree::read_tree(root, objects)?,
            ManifestObject::Entries(hex) => {
                let bytes = objects.read_verified(hex, MAX_ARTIFACT_BYTES)?;
                // Straight into typed entries: no intermediate JSON tree.
                serde_json::from_slice(&bytes)
                    .map_err(|e| malformed(self, artifact, format!("entries object {hex}: {e}")))?
            }
        };
        Ok(manifest)
    }

    /// A manifest header without its entries, and the object it names for them.
    pub(crate) fn header_only(
        &self,
        artifact: Artifact,
        mut header: Value,
    ) -> Result<(Manifest, ManifestObject), StoreError> {
        let named = ManifestObject::of(&header).ok_or_else(|| {
            malformed(
                self,
                artifact,
                "names neither root_tree.sha256 nor entries_object.sha256".into(),
            )
        })?;
        if let Some(map) = header.as_object_mut() {
            map.remove("root_tree");
            map.remove("entries_object");
            map.insert("entries".into(), Value::Object(Default::default()));
        }
        let manifest: Manifest =
            serde_json::from_value(header).map_err(|source| StoreError::MalformedArtifact {
                run_id: self.id().to_string(),
                name: artifact.file_name().to_string(),
                source,
            })?;
        Ok((manifest, named))
    }

    /// A stored manifest's header (no entries) and the object it names for its entries.
    pub fn read_manifest_header(
        &self,
        artifact: Artifact,
    ) -> Result<(Manifest, ManifestObject), StoreError> {
        check_manifest_artifact(artifact, "read_manifest_header")?;
        let header = self.read_artifact_value(artifact)?;
        self.header_only(artifact, header)
    }

    /// The object a stored manifest names for its entries (root tree or entries object), if any.
    pub fn manifest_object(
        &self,
        artifact: Artifact,
    ) -> Result<Option<ManifestObject>, StoreError> {
        check_manifest_artifact(artifact, "manifest_object")?;
        let header = self.read_artifact_value(artifact)?;
        Ok(ManifestObject::of(&header))
    }

    /// The hash of the object a stored manifest names for its entries, if any.
    pub fn manifest_entries_object(
        &self,
        artifact: Artifact,
    ) -> Result<Option<String>, StoreError> {
        Ok(self.manifest_object(artifact)?.map(|o| o.hex().to_string()))
    }

    /// Every object a stored manifest references: for a tree, its tree objects and stored
    /// backups; for a schema-1 header, the entries object and stored backups.
    pub fn manifest_references(
        &self,
        artifact: Artifact,
        objects: &ObjectStore,
    ) -> Result<Vec<String>, StoreError> {
        match self.manifest_object(artifact)? {
            Some(ManifestObject::Tree(root)) => tree::tree_objects(&root, objects),
            Some(ManifestObject::Entries(hex)) => {
                let manifest = self.read_manifest(artifact, objects)?;
                let mut out = super::manifest_objects(&manifest);
                out.push(hex);
                out.sort();
                out.dedup();
                Ok(out)
            }
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::Store;
    use agentdiff_scan::{BackupState, Entry, EntryKind, ScanStats};

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
            schema_version: MANIFEST_SCHEMA_VERSION,
            root: "/r".into(),
            ignore_lines: vec!["x".into()],
            entries,
            unsupported: vec![],
            excluded: vec![],
            excluded_programs: None,
            git_layouts: Vec::new(),
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
        assert_eq!(header["schema_version"], 2);
        assert_eq!(header["root_tree"]["entries"], 1);
        assert_eq!(header["root_tree"]["format"], "tree-1");
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

    #[test]
    fn schema_1_headers_naming_an_entries_object_are_still_read() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let c = store.create_run(None).unwrap();
        let mut m = manifest();
        m.schema_version = 1;
        let entries = serde_json::to_vec(&m.entries).unwrap();
        let hex = store.objects().put_bytes(&entries).unwrap();
        let mut header = serde_json::to_value(&m).unwrap();
        let map = header.as_object_mut().unwrap();
        map.remove("entries");
        map.insert(
            "entries_object".into(),
            json!({"sha256": hex, "count": 1, "bytes": entries.len(), "format": "json"}),
        );
        c.write_artifact(Artifact::Before, &header).unwrap();
        assert_eq!(
            c.read_manifest(Artifact::Before, store.objects()).unwrap(),
            m
        );
        assert_eq!(
            c.manifest_object(Artifact::Before).unwrap(),
            Some(ManifestObject::Entries(hex.clone()))
        );
        let refs = c
            .manifest_references(Artifact::Before, store.objects())
            .unwrap();
        assert!(
            refs.contains(&hex) && refs.contains(&"0".repeat(64)),
            "{refs:?}"
        );
    }
}
