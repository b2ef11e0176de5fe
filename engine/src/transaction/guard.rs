//! The transaction's side of in-run tamper detection (see `store::tamper` for the mechanism):
//! snapshot the store before launch, and after the command ran report what changed, put the
//! artifacts back, quarantine changed objects and stop counting their backups as recovery.

use std::collections::BTreeSet;

use super::capture::Captured;
use agentdiff_scan::{
    read_readable_entries, unsupported_kind, BackupSkip, BackupState, Unsupported,
};
use agentdiff_store::{Artifact, Capsule, Store, StoreError, StoreSnapshot, TamperFinding};

/// Why a backup stopped counting, as recorded in the before manifest.
const LOST_BACKUP: &str =
    "the backup object was changed while the command ran (capsule tampering); it was quarantined";

/// What the check after the command found.
pub(crate) struct Tampering {
    pub findings: Vec<TamperFinding>,
    /// The before manifest's root tree, when the manifest was written again.
    pub rewritten_root: Option<String>,
    /// Records added to the rewritten before manifest's header: directories whose trees could not
    /// be read back (`unreadable`), so the comparison marks what lies below them unverified.
    pub added_unsupported: Vec<Unsupported>,
    /// Why part of the before manifest could not be read back (its tree objects were destroyed
    /// in the store and in the private copy): the comparison is then incomplete.
    pub unreadable: Option<String>,
}

impl Tampering {
    /// Points the run at the rewritten before manifest, if there is one: withdrawn backups are
    /// no longer referenced, the rewritten manifest's tree is, and its added records count.
    pub(crate) fn apply(&self, before: &mut Captured, referenced: &mut Vec<String>) {
        if let Some(root_tree) = &self.rewritten_root {
            before.root_tree = root_tree.clone();
            *referenced = vec![root_tree.clone()];
            before
                .manifest
                .unsupported
                .extend(self.added_unsupported.iter().cloned());
        }
    }
}

/// A run that stops before its command ran still seals its before manifest. When the scan record
/// let its before-scan claim objects as verified unseen (see `store::scan_record`), they are
/// checked first, as after a command: the manifest then names no backup that was not verified.
pub(crate) struct Claims<'a> {
    claimed: bool,
    store: &'a Store,
    capsule: &'a Capsule,
}

impl<'a> Claims<'a> {
    pub(crate) fn new(claimed: bool, store: &'a Store, capsule: &'a Capsule) -> Self {
        Claims {
            claimed,
            store,
            capsule,
        }
    }

    /// Whether objects were claimed as verified (a refusal path then takes a snapshot for
    /// [`Claims::settle`]; without claims it need not).
    pub(crate) fn any(&self) -> bool {
        self.claimed
    }

    /// Checks the claimed objects against `snapshot` (a no-op when nothing was claimed).
    pub(crate) fn settle(
        &self,
        snapshot: &StoreSnapshot,
        before: &mut Captured,
        referenced: &mut Vec<String>,
    ) -> Result<(), StoreError> {
        if !self.claimed {
            return Ok(());
        }
        let checked = after_command(self.store, self.capsule, snapshot, before)?;
        if !checked.findings.is_empty() {
            self.capsule.event(
                "store_changed_before_launch",
                serde_json::json!({ "findings": checked.findings }),
            )?;
        }
        checked.apply(before, referenced);
        Ok(())
    }
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
            added_unsupported: Vec::new(),
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
    // the trees, which the command could not reach through the store, or else from the store.
    // A tree lost in both is left out of the rewritten manifest and recorded as unreadable, so
    // the seal references only objects that exist (the capsule verifies) and the comparison
    // marks everything below it unverified instead of trusting an empty directory.
    let mut manifest = before.manifest.clone();
    let (entries, failed) = read_readable_entries(&before.trees(store), &before.root_tree);
    manifest.entries = entries;
    let mut added_unsupported = Vec::new();
    let mut reasons = Vec::new();
    for (dir, e) in failed {
        let path = if dir.is_empty() { ".".to_string() } else { dir };
        reasons.push(format!("{path}: {e}"));
        added_unsupported.push(Unsupported {
            path,
            kind: unsupported_kind::UNREADABLE.into(),
            reason: format!(
                "its tree object was destroyed while the command ran and could not be read back \
                 ({e})"
            ),
        });
    }
    manifest
        .unsupported
        .extend(added_unsupported.iter().cloned());
    let unreadable = (!reasons.is_empty()).then(|| {
        format!(
            "the before manifest could not be read back whole after the command ran ({}); the \
             unreadable directories are recorded as such and changes below them are unverified",
            reasons.join("; ")
        )
    });
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
        added_unsupported,
        unreadable,
    })
}
