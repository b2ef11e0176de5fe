//! The transaction's side of in-run tamper detection (see `store::tamper` for the mechanism):
//! snapshot the store before launch, and after the command ran report what changed, put the
//! artifacts back, quarantine changed objects and stop counting their backups as recovery.

use std::collections::BTreeSet;

use super::capture::Captured;
use crate::fs::{read_entries, BackupSkip, BackupState};
use crate::store::{Artifact, Capsule, Store, StoreError, StoreSnapshot, TamperFinding};

/// Why a backup stopped counting, as recorded in the before manifest.
const LOST_BACKUP: &str =
    "the backup object was changed while the command ran (capsule tampering); it was quarantined";

/// What the check after the command found.
pub(crate) struct Tampering {
    pub findings: Vec<TamperFinding>,
    /// The before manifest's root tree, when the manifest was written again.
    pub rewritten_root: Option<String>,
    /// Why the before manifest could not be read back to be written again (its tree objects were
    /// destroyed): the comparison may then be incomplete.
    pub unreadable: Option<String>,
}

/// Findings after the command ran. When anything was tampered with, the before manifest is read
/// back from its tree (the whole manifest is held in memory only in this case): entries whose
/// backup object no longer verifies are marked as not backed up, and the manifest is written
/// again (storing any tree object that was lost and can still be rebuilt).
pub(crate) fn after_command(
    store: &Store,
    capsule: &Capsule,
    snapshot: &StoreSnapshot,
    before: &Captured,
) -> Result<Tampering, StoreError> {
    let mut findings = capsule.tampered_artifacts();
    findings.extend(store.tamper_since(snapshot)?);
    if findings.is_empty() {
        return Ok(Tampering {
            findings,
            rewritten_root: None,
            unreadable: None,
        });
    }
    let objects = store.objects();
    let mut lost = BTreeSet::new();
    for hex in findings.iter().filter_map(|f| f.object.as_deref()) {
        if objects.verify_object(hex).is_err() {
            objects.quarantine(hex)?;
            lost.insert(hex.to_string());
        }
    }
    // Everything verified before launch is checked again on its next use.
    objects.forget_verified();
    capsule.restore_written_artifacts()?;
    // The header is this run's own (kept in memory); the entries come from the private copy of
    // the trees, which the command could not reach through the store.
    let mut manifest = before.manifest.clone();
    manifest.entries = match read_entries(&before.trees(store), &before.root_tree) {
        Ok(entries) => entries,
        Err(e) => {
            return Ok(Tampering {
                findings,
                rewritten_root: None,
                unreadable: Some(format!(
                    "the before manifest could not be read back after the command ran ({e}); \
                     changes below the damaged trees may be missing"
                )),
            })
        }
    };
    for entry in manifest.entries.values_mut() {
        let stored = matches!(entry.backup, BackupState::Stored);
        if stored && entry.sha256.as_ref().is_some_and(|h| lost.contains(h)) {
            entry.backup = BackupState::Skipped {
                reason: BackupSkip::StoreFailed,
                detail: Some(LOST_BACKUP.into()),
            };
        }
    }
    let root = capsule.write_manifest(Artifact::Before, &manifest, objects)?;
    Ok(Tampering {
        findings,
        rewritten_root: Some(root),
        unreadable: None,
    })
}
