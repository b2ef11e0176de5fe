//! The transaction's side of in-run tamper detection (see `store::tamper` for the mechanism):
//! snapshot the store before launch, and after the command ran report what changed, put the
//! artifacts back, quarantine changed objects and stop counting their backups as recovery.

use std::collections::BTreeSet;

use crate::fs::{BackupSkip, BackupState, Manifest};
use crate::store::{Artifact, Capsule, Store, StoreError, StoreSnapshot, TamperFinding};

/// Why a backup stopped counting, as recorded in the before manifest.
const LOST_BACKUP: &str =
    "the backup object was changed while the command ran (capsule tampering); it was quarantined";

/// What the check after the command found.
pub(crate) struct Tampering {
    pub findings: Vec<TamperFinding>,
    /// The before manifest's root tree, when the manifest was written again.
    pub rewritten_root: Option<String>,
}

/// Findings after the command ran. `before` is the in-memory before manifest: entries whose
/// backup object no longer verifies are marked as not backed up, and the manifest (entries object
/// included) is written again from memory.
pub(crate) fn after_command(
    store: &Store,
    capsule: &Capsule,
    snapshot: &StoreSnapshot,
    before: &mut Manifest,
) -> Result<Tampering, StoreError> {
    let mut findings = capsule.tampered_artifacts();
    findings.extend(store.tamper_since(snapshot)?);
    if findings.is_empty() {
        return Ok(Tampering {
            findings,
            rewritten_root: None,
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
    for entry in before.entries.values_mut() {
        let stored = matches!(entry.backup, BackupState::Stored);
        if stored && entry.sha256.as_ref().is_some_and(|h| lost.contains(h)) {
            entry.backup = BackupState::Skipped {
                reason: BackupSkip::StoreFailed,
                detail: Some(LOST_BACKUP.into()),
            };
        }
    }
    capsule.restore_written_artifacts()?;
    // Rewriting the manifest stores its tree objects again if they were lost, and records the
    // withdrawn backups.
    let root = capsule.write_manifest(Artifact::Before, before, objects)?;
    Ok(Tampering {
        findings,
        rewritten_root: Some(root),
    })
}
