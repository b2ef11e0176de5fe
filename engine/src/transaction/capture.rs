//! The before- and after-captures of the project tree, written to the capsule.
//!
//! Invariant: the after-scan uses the before-scan's ignore lines and re-includes, so the command
//! cannot hide its own writes by editing `.agentdiffignore` or the policy mid-run.
//!
//! The before-scan also copies each tree object it writes to a [`TreeSpool`] (an unlinked file in
//! the store's `objects/tmp/`), and the tamper check and the comparison read the before trees from
//! it first ([`Captured::trees`]): the store's copies are files the command can rewrite or delete.
//! With the last clean run's scan record (`store::scan_record`), the spool starts as a copy of
//! that run's, and a directory whose listing matches its tree's recorded stat digest is taken as
//! that tree unread; a clean run leaves its own record after the seal.
//! Every spool read is verified against the id and falls back to the store's object; a spool that
//! cannot be written stops taking trees (recorded as `tree_spool_incomplete`) without failing the
//! scan. Not defended: a process that can write both copies (root, or the spool through
//! `/proc/PID/fd` were agentdiff dumpable); the comparison then fails closed
//! (`comparison_incomplete`).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use serde_json::json;

use super::{ProgressFn, TransactionError};
use agentdiff_policy::Policy;
use agentdiff_scan::{
    self as fs, BackupRequest, IgnoreSource, Manifest, Reusable, ScanOptions, ScanProgress,
    Scanned, StatDigests, Tree, TreeError, TreeReuse, TreeSink, TreeSource,
};
use agentdiff_store::seal::SealAuthority;
use agentdiff_store::{
    Artifact, Capsule, ObjectsSnapshot, PreviousScan, RecordedScan, SpooledTrees, Store, TreeSpool,
    TreeWrite, TreeWriter,
};

/// What a capture needs to know about the run.
pub(super) struct CapturePlan<'a> {
    pub store: &'a Store,
    pub capsule: &'a Capsule,
    /// Deny patterns and `observe.include` (v2): default-excluded directories they name are
    /// scanned.
    pub reinclude: Vec<String>,
    /// The command runs in a private copy of the tree materialised from backups.
    pub private_workspace: bool,
    /// Back up files before the run (rollback enabled, or a private workspace to materialise).
    pub backup_before: bool,
    /// `rollback.max_backup_file_mb` in bytes.
    pub max_backup_bytes: u64,
    /// `capture.trust_stat`: scans reuse hashes of files whose stat is unchanged since a verified
    /// earlier scan.
    pub trust_stat: bool,
    /// The key and ledger an earlier run's seal must check under before its manifest is reused.
    pub authority: &'a SealAuthority,
    pub progress: Option<ProgressFn<'a>>,
}

/// A stored manifest: its header (no entries; they are in the tree) and its root tree.
pub(super) struct Captured {
    pub manifest: Manifest,
    pub root_tree: String,
    /// Entries whose backup the store failed to write (`capture.require_backups`).
    pub failed_backups: FailedBackups,
    /// The before-scan's trees, copied outside the store while the command runs.
    pub spool: Option<TreeSpool>,
    /// The before-scan's stat digests, for the after-scan (see [`StatDigests`]).
    pub digests: Option<StatDigests>,
}

impl Captured {
    /// Where this manifest's trees are read from: the private copy first, then the store.
    pub fn trees<'s>(&'s self, store: &'s Store) -> SpooledTrees<'s> {
        SpooledTrees {
            spool: self.spool.as_ref(),
            objects: store.objects(),
        }
    }
}

/// The entries whose backup could not be stored: the first [`MAX_NAMED`] by path named, all
/// counted.
#[derive(Debug, Default)]
pub(super) struct FailedBackups {
    pub named: Vec<String>,
    pub count: usize,
}

/// Stores each directory's tree as the scan streams it, noting failed backups on the way.
struct CaptureSink<'s> {
    writer: TreeWriter<'s>,
    failed: FailedBackups,
}

impl CaptureSink<'_> {
    fn note_failed_backups(&mut self, dir: &str, tree: &Tree) {
        for (name, e) in &tree.entries {
            if let fs::BackupState::Skipped {
                reason: fs::BackupSkip::StoreFailed,
                detail,
            } = &e.backup
            {
                self.failed.count += 1;
                let path = if dir.is_empty() {
                    name.clone()
                } else {
                    format!("{dir}/{name}")
                };
                self.failed.named.push(format!(
                    "{path} ({})",
                    detail.as_deref().unwrap_or("no detail recorded")
                ));
                // Directories arrive in no fixed order (several walkers): the first paths by
                // name are the ones named, so the message is the same on every run.
                self.failed.named.sort();
                self.failed.named.truncate(MAX_NAMED);
            }
        }
    }
}

impl TreeSink for CaptureSink<'_> {
    fn directory(&mut self, dir: &str, tree: Tree) -> Result<String, TreeError> {
        self.note_failed_backups(dir, &tree);
        self.writer.directory(dir, tree)
    }

    fn unchanged(&mut self, dir: &str, id: &str, earlier: Reusable) -> Result<String, TreeError> {
        self.note_failed_backups(dir, &earlier.tree);
        self.writer.unchanged(dir, id, earlier)
    }

    /// Only the after-scan reuses by stat digest, and only the before-scan's failed backups
    /// are acted on (`missing_backups`): the tree need not be read to note them.
    fn unchanged_unread(
        &mut self,
        dir: &str,
        id: &str,
        entries: usize,
        src: &dyn TreeSource,
    ) -> Result<String, TreeError> {
        self.writer.unchanged_unread(dir, id, entries, src)
    }
}

impl<'a> CapturePlan<'a> {
    pub fn new(
        store: &'a Store,
        capsule: &'a Capsule,
        policy: &Policy,
        authority: &'a SealAuthority,
        private_workspace: bool,
        progress: Option<ProgressFn<'a>>,
    ) -> Self {
        let rollback = policy.rollback();
        let mut reinclude = policy.always_observed();
        reinclude.extend(policy.observe().include.iter().cloned());
        CapturePlan {
            store,
            capsule,
            reinclude,
            private_workspace,
            backup_before: rollback.enabled || private_workspace,
            max_backup_bytes: rollback.max_backup_file_mb.saturating_mul(1024 * 1024),
            trust_stat: policy.capture().trust_stat,
            authority,
            progress,
        }
    }

    /// The last clean run's scan record, when the stat cache may use it and the store is as that
    /// run left it, with the object store's part of the tamper snapshot from its listing. Every
    /// object known from the cache file is then claimed as verified (see `store::scan_record`).
    pub fn recorded_scan(
        &self,
    ) -> Result<Option<(RecordedScan, ObjectsSnapshot)>, TransactionError> {
        if !self.keeps_record() {
            return Ok(None);
        }
        let key = self.authority.key();
        let Some(record) = self.store.objects().load_scan_record(key) else {
            return Ok(None);
        };
        Ok(record.check(self.store.objects(), key)?)
    }

    /// Whether runs of this plan read and write scan records: the stat cache is on and the
    /// before-scan backs up the project tree itself (not a private workspace's copy).
    fn keeps_record(&self) -> bool {
        self.trust_stat && self.backup_before && !self.private_workspace
    }

    /// Leaves this run's scan record for the next run (after the seal: every object is written),
    /// unless the one it used (`recorded`) says the same. Only a run whose store was untouched
    /// while the command ran leaves one; any other removes the last. A record that cannot be
    /// written only costs the next run time.
    pub fn leave_record(
        &self,
        before: &mut Captured,
        recorded: Option<&RecordedScan>,
        store_untouched: bool,
    ) {
        if !self.keeps_record() {
            return;
        }
        let objects = self.store.objects();
        let key = self.authority.key();
        let (Some(digests), Some(spool), true) =
            (&before.digests, before.spool.as_mut(), store_untouched)
        else {
            let _ = objects.drop_scan_record();
            return;
        };
        if let Some(r) = recorded.filter(|r| r.still_current(objects, key, digests, spool)) {
            if let Some(stamp) = r.vouched() {
                // The pack was hashed whole this run: the next copies it as it is.
                let _ = objects.write_stamp(key, stamp);
            }
            return;
        }
        let _ = objects.save_scan_record(key, digests, spool);
    }

    /// Scans `root` before the run, backing up what rollback or the workspace needs.
    /// `previous`: the verified earlier scan unchanged files' hashes come from
    /// ([`CapturePlan::previous_scan`]); `recorded`: the last run's scan record, checked (see
    /// [`CapturePlan::recorded_scan`]) only when there is a previous scan to use it with.
    pub fn before(
        &self,
        root: &Path,
        previous: Option<PreviousScan>,
        recorded: Option<&RecordedScan>,
    ) -> Result<Captured, TransactionError> {
        let backup = self.backup_before.then(|| BackupRequest {
            sink: self.store.objects(),
            // A private workspace is materialised from backups, so every file is captured.
            max_file_bytes: if self.private_workspace {
                fs::DEFAULT_MAX_HASH_BYTES
            } else {
                self.max_backup_bytes
            },
        });
        let mut spool = TreeSpool::new(self.store.objects())?;
        // The record's pack is the private copy of the trees it describes.
        let copied = match (recorded, &previous) {
            (Some(r), Some(_)) => r.seed(&mut spool),
            _ => 0,
        };
        let step = Step {
            artifact: Artifact::Before,
            phase: "before",
            event: "before_captured",
            spool: Some(spool),
            carry_backup_state: false,
            reuse_from_store: true,
            // Only the after-scan of the project tree reuses (see `after`).
            collect_digests: self.trust_stat && !self.private_workspace,
        };
        if let Some(p) = &previous {
            let digests = recorded.map_or(0, |r| r.digests.len());
            self.capsule.event(
                "stat_cache",
                json!({
                    "run_id": p.run_id.as_str(),
                    "artifact": p.artifact.file_name(),
                    "recorded_digests": digests,
                    "recorded_trees_copied": copied,
                    "recorded_pack_hashed": recorded.is_some_and(RecordedScan::pack_hashed),
                }),
            )?;
        }
        let reuse = previous.as_ref().map(|p| TreeReuse {
            root: &p.manifest.root,
            started_ns: p.manifest.stats.started_ns,
            tree: &p.root_tree,
            source: self.store.objects(),
            digests: recorded.map(|r| &r.digests),
        });
        self.scan_and_store(root, step, backup, reuse, IgnoreSource::ProjectFile)
    }

    /// The verified earlier scan the before-scan takes unchanged files' hashes from, when
    /// `capture.trust_stat` allows it.
    pub fn previous_scan(&self, root: &Path, recent: &[String]) -> Option<PreviousScan> {
        if !self.trust_stat {
            return None;
        }
        let tail = self.authority.recent_verify_context();
        // The whole ledger is read only when no recent run qualifies; an unreadable ledger then
        // just means no cache.
        let full = || self.authority.verify_context().ok();
        // The scanner names its root this way; a manifest of another root is never reused.
        let canon = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        let shown = agentdiff_scan::escape_bytes(canon.as_os_str().as_bytes());
        self.store
            .previous_verified_manifest(&tail, full, &shown, recent)
    }

    /// Scans `workdir` after the run with the before-scan's ignore rules, reusing unchanged
    /// hashes when it is the same tree. `store_untouched`: the tamper check found no object
    /// changed or removed while the command ran, so every before tree is still stored intact.
    pub fn after(
        &self,
        workdir: &Path,
        before: &Captured,
        store_untouched: bool,
    ) -> Result<Captured, TransactionError> {
        let ignore = IgnoreSource::Lines(before.manifest.ignore_lines.clone());
        let step = Step {
            artifact: Artifact::After,
            phase: "after",
            event: "after_captured",
            spool: None,
            carry_backup_state: false,
            reuse_from_store: false,
            collect_digests: false,
        };
        if self.private_workspace {
            // Changes in the workspace are kept as objects so promote can apply them.
            let backup = Some(BackupRequest {
                sink: self.store.objects(),
                max_file_bytes: fs::DEFAULT_MAX_HASH_BYTES,
            });
            self.scan_and_store(workdir, step, backup, None, ignore)
        } else {
            let trees = before.trees(self.store);
            let reuse = self.trust_stat.then(|| TreeReuse {
                root: &before.manifest.root,
                started_ns: before.manifest.stats.started_ns,
                tree: &before.root_tree,
                source: &trees,
                digests: before.digests.as_ref(),
            });
            let step = Step {
                carry_backup_state: true,
                reuse_from_store: store_untouched,
                ..step
            };
            self.scan_and_store(workdir, step, None, reuse, ignore)
        }
    }

    fn scan_and_store(
        &self,
        dir: &Path,
        step: Step,
        backup: Option<BackupRequest<'_>>,
        reuse: Option<TreeReuse<'_>>,
        ignore: IgnoreSource,
    ) -> Result<Captured, TransactionError> {
        let mut spool = step.spool;
        let phase = step.phase;
        let progress = self.progress.map(|p| move |s: &ScanProgress| p(phase, s));
        let mut opts = ScanOptions::new();
        opts.reinclude = self.reinclude.clone();
        opts.backup = backup;
        opts.reuse_tree = reuse;
        opts.carry_backup_state = step.carry_backup_state;
        opts.collect_digests = step.collect_digests;
        opts.ignore = ignore;
        opts.progress = progress
            .as_ref()
            .map(|p| p as &(dyn Fn(&ScanProgress) + Sync));
        let mut writer = TreeWriter::new(self.store.objects(), spool.as_mut());
        if step.reuse_from_store {
            writer = writer.reused_trees_are_stored();
        }
        let mut sink = CaptureSink {
            writer,
            failed: FailedBackups::default(),
        };
        let Scanned {
            manifest,
            root_tree,
            digests,
        } = fs::scan_to(dir, &opts, &mut sink)?;
        sink.writer.finish()?;
        let written = TreeWrite {
            root: root_tree.clone(),
            entries: sink.writer.entries,
            trees: sink.writer.trees,
        };
        let failed_backups = sink.failed;
        self.capsule
            .write_manifest_header(step.artifact, &manifest, &written)?;
        self.capsule.event(
            step.event,
            json!({
                "entries": written.entries,
                "unsupported": manifest.unsupported.len(),
                "hashes_reused": manifest.stats.hashes_reused,
                "trees_reused": manifest.stats.trees_reused,
            }),
        )?;
        if let Some(why) = spool.as_ref().and_then(TreeSpool::failure) {
            // Not a weaker result (every tree is still read verified from the store), but the
            // store's copy is what the command could reach: say so.
            self.capsule
                .event("tree_spool_incomplete", json!({ "reason": why }))?;
        }
        Ok(Captured {
            manifest,
            root_tree,
            failed_backups,
            spool,
            digests,
        })
    }
}

/// Which capture this is: the artifact, the progress phase and the event name, and how it scans.
struct Step {
    artifact: Artifact,
    phase: &'static str,
    event: &'static str,
    /// Copy the trees outside the store (the before-scan; see [`TreeSpool`]).
    spool: Option<TreeSpool>,
    /// See `ScanOptions::carry_backup_state` (the after-scan of the project tree).
    carry_backup_state: bool,
    /// Every tree the stat cache may reuse is in the store intact (see
    /// `TreeWriter::reused_trees_are_stored`).
    reuse_from_store: bool,
    /// Keep the stat digests of the trees (the before-scan, for the after-scan).
    collect_digests: bool,
}

/// Most paths named in the refusal message; the rest are counted.
const MAX_NAMED: usize = 10;

/// `capture.require_backups`: why the run must not launch, when a backup rollback would need
/// could not be written (the object store failed, e.g. a full disk). Files skipped by design
/// (too large, hardlinked) are not counted: the policy chose that.
pub(super) fn missing_backups(before: &Captured) -> Option<String> {
    let failed = &before.failed_backups;
    if failed.count == 0 {
        return None;
    }
    let more = failed.count.saturating_sub(failed.named.len());
    Some(format!(
        "not launched: capture.require_backups is set and {} backup(s) could not be written: \
         {}{}; free space in the store and run again",
        failed.count,
        failed.named.join(", "),
        if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        }
    ))
}
