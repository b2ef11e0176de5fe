//! Pruning runs: remove the runs a selection names, then every object no remaining run references
//! (mark and sweep), reporting the bytes freed.
//!
//! Invariants:
//! - it runs only under the store lock ([`StoreLock`] is a parameter), so no `run`, `rollback` or
//!   `promote` of this project adds objects or capsules meanwhile;
//! - only sealed runs are removed; an unsealed run (interrupted, or being recovered) is kept, and
//!   one this user's ledger records as sealed (its seal was deleted) is kept as unverified;
//! - only runs whose seal authenticates under this user's key and ledger are removed: a run whose
//!   seal is broken, forged or cannot be authenticated here is evidence to look at, and stays;
//! - only those genuine runs are ordered and counted, by the creation time their sealed metadata
//!   records: an unsealed or unauthenticated directory (anyone can plant one, named or dated as it
//!   likes) is reported and left in place, never kept in place of a genuine run;
//! - the mark covers every remaining run: what its seal lists and everything below its manifests'
//!   trees (tree objects and backups). If any remaining run's references cannot be read, nothing
//!   is swept (the report says which run), so an object a remaining run needs is never removed;
//! - each removed run is recorded in the ledger as pruned (when a key is given), so
//!   `verify --all` does not report it as missing from the store.
//!
//! Not defended: another process of the same user that deletes or writes `.agentdiff/` without
//! taking the lock.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::seal::{SealAuthority, VerifyContext};
use super::Verdict;
use super::{Artifact, Capsule, RunId, Store, StoreError, StoreLock};

/// Which runs to remove. Only runs whose seal authenticates here are counted and compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneSelection {
    /// Keep the newest N authenticated runs (by sealed creation time), remove the older ones.
    Keep(usize),
    /// Remove authenticated runs created (by their sealed creation time) longer ago than this.
    OlderThan(Duration),
}

/// One run a prune removed (or would remove).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrunedRun {
    pub id: String,
    pub created_at: Option<String>,
    /// Bytes of the run directory's files.
    pub bytes: u64,
}

/// A run a prune left in place, uncounted, because its seal does not authenticate under this
/// user's key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnverifiedRun {
    pub id: String,
    pub verdict: Option<Verdict>,
    /// The first problem `verify` found, or why it could not run.
    pub problem: Option<String>,
}

/// What a prune did (or, with `dry_run`, would do).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PruneRunsReport {
    pub dry_run: bool,
    pub runs_removed: Vec<PrunedRun>,
    /// Authenticated runs kept (the run directories below are not counted).
    pub runs_kept: usize,
    /// Run directories left in place because they have no seal; never counted as kept runs.
    pub unsealed_kept: Vec<String>,
    /// Run directories left in place because their seal does not authenticate here, and why;
    /// never counted as kept runs.
    pub unverified_kept: Vec<UnverifiedRun>,
    pub objects_removed: usize,
    pub objects_kept: usize,
    pub object_bytes_freed: u64,
    /// Run directories plus objects.
    pub bytes_freed: u64,
    /// Why no object was swept, when a remaining run's references could not be read.
    pub sweep_skipped: Option<String>,
}

struct Candidate {
    id: RunId,
    created: SystemTime,
    created_at: Option<String>,
    sealed: bool,
    /// `None` when the seal authenticates here (checked for sealed runs only).
    unverified: Option<UnverifiedRun>,
}

impl Store {
    /// Removes the runs `selection` names (sealed ones that authenticate under `ctx` only) and
    /// the objects no remaining run references. `authority` records each removed run in the
    /// ledger as pruned.
    pub fn prune_runs(
        &self,
        _lock: &StoreLock,
        selection: PruneSelection,
        dry_run: bool,
        ctx: &VerifyContext,
        authority: Option<&SealAuthority>,
    ) -> Result<PruneRunsReport, StoreError> {
        let mut runs = self.prune_candidates(ctx)?;
        // Newest first; ties by id so the order is stable. Only genuine runs' times are compared
        // (the others are never selected), and theirs come from authenticated metadata.
        runs.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.id.cmp(&a.id)));
        let now = SystemTime::now();
        let selected = |genuine_newer: usize, run: &Candidate| match selection {
            PruneSelection::Keep(n) => genuine_newer >= n,
            PruneSelection::OlderThan(age) => now
                .duration_since(run.created)
                .is_ok_and(|elapsed| elapsed > age),
        };
        let mut report = PruneRunsReport {
            dry_run,
            ..PruneRunsReport::default()
        };
        let (mut remove, mut keep) = (Vec::new(), Vec::new());
        let mut genuine = 0;
        for mut run in runs {
            if let Some(unverified) = run.unverified.take() {
                report.unverified_kept.push(unverified);
                keep.push(run);
            } else if !run.sealed {
                report.unsealed_kept.push(run.id.to_string());
                keep.push(run);
            } else {
                if selected(genuine, &run) {
                    remove.push(run);
                } else {
                    report.runs_kept += 1;
                    keep.push(run);
                }
                genuine += 1;
            }
        }

        // Mark before anything is removed: what the remaining runs reference.
        let marked = self.mark(&keep);
        for run in &remove {
            let capsule = self.open_run(run.id.as_str())?;
            let bytes = dir_bytes(capsule.dir());
            if !dry_run {
                self.remove_run(&capsule, authority)?;
            }
            report.runs_removed.push(PrunedRun {
                id: run.id.to_string(),
                created_at: run.created_at.clone(),
                bytes,
            });
            report.bytes_freed += bytes;
        }
        match marked {
            Ok(marked) => self.sweep(&marked, dry_run, &mut report)?,
            Err(why) => report.sweep_skipped = Some(why.to_string()),
        }
        Ok(report)
    }

    /// `None` when the run's seal is intact and authenticates under `ctx`; otherwise why not.
    fn unauthenticated(&self, id: &RunId, ctx: &VerifyContext) -> Option<UnverifiedRun> {
        let report = self
            .open_run(id.as_str())
            .and_then(|capsule| capsule.verify_with(self.objects(), ctx));
        let (verdict, problem) = match report {
            Ok(r) if r.ok && r.verdict == Verdict::Authenticated => return None,
            Ok(r) => (
                Some(r.verdict),
                r.problems
                    .first()
                    .map(|p| format!("{}: {}", p.subject, p.problem))
                    .or_else(|| r.notes.first().cloned()),
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        Some(UnverifiedRun {
            id: id.to_string(),
            verdict,
            problem,
        })
    }

    /// Every run directory, each sealed one verified. The creation time is read from
    /// metadata.json, which the seal covers; a run without one (or whose seal does not
    /// authenticate) gets the epoch, which orders it but is never trusted: such runs are not
    /// selected.
    fn prune_candidates(&self, ctx: &VerifyContext) -> Result<Vec<Candidate>, StoreError> {
        let mut out = Vec::new();
        for listing in self.list_runs()? {
            // An unsealed directory the ledger records as sealed lost its seal: it is kept as
            // evidence that does not verify, never as a leftover of an interrupted run.
            let unverified = if listing.sealed || ctx.ledger_records_seal(listing.id.as_str()) {
                self.unauthenticated(&listing.id, ctx)
            } else {
                None
            };
            let created = listing
                .created_at
                .as_deref()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            out.push(Candidate {
                id: listing.id,
                created,
                created_at: listing.created_at,
                sealed: listing.sealed,
                unverified,
            });
        }
        Ok(out)
    }

    /// Every object the runs reference, or why that cannot be known.
    fn mark(&self, runs: &[Candidate]) -> Result<BTreeSet<String>, Unmarked> {
        let mut marked = BTreeSet::new();
        for run in runs {
            let found = self.open_run(run.id.as_str()).and_then(|capsule| {
                if run.sealed {
                    self.run_references(&capsule)
                } else {
                    self.unsealed_references(&capsule)
                }
            });
            match found {
                Ok(objects) => marked.extend(objects),
                Err(source) => {
                    return Err(Unmarked {
                        run_id: run.id.to_string(),
                        source,
                    })
                }
            }
        }
        Ok(marked)
    }

    /// An unsealed run has no seal to list its objects: its manifests' trees are what it needs.
    fn unsealed_references(&self, capsule: &Capsule) -> Result<Vec<String>, StoreError> {
        let mut objects = Vec::new();
        for artifact in [Artifact::Before, Artifact::After] {
            match fs::symlink_metadata(capsule.dir().join(artifact.file_name())) {
                Ok(_) => objects.extend(capsule.manifest_references(artifact, self.objects())?),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io("inspect", capsule.dir(), e)),
            }
        }
        Ok(objects)
    }

    fn remove_run(
        &self,
        capsule: &Capsule,
        authority: Option<&SealAuthority>,
    ) -> Result<(), StoreError> {
        // The seal's digest is recorded with the prune, so the ledger still says what was sealed.
        let seal = capsule.parse_current_seal().map(|(seal, _)| seal);
        fs::remove_dir_all(capsule.dir())
            .map_err(|e| StoreError::io("remove run directory", capsule.dir(), e))?;
        super::atomic::sync_dir(self.runs_dir())?;
        if let (Some(authority), Some(seal)) = (authority, seal) {
            authority.record_pruned(&seal)?;
        }
        Ok(())
    }

    fn sweep(
        &self,
        marked: &BTreeSet<String>,
        dry_run: bool,
        report: &mut PruneRunsReport,
    ) -> Result<(), StoreError> {
        let objects = self.objects();
        if !dry_run {
            objects.remove_stale_temps()?;
        }
        for hex in objects.list()? {
            if marked.contains(&hex) {
                report.objects_kept += 1;
                continue;
            }
            let size = objects
                .object_path(&hex)
                .ok()
                .and_then(|p| fs::symlink_metadata(p).ok())
                .map_or(0, |m| m.len());
            if !dry_run {
                objects.remove(&hex)?;
            }
            report.objects_removed += 1;
            report.object_bytes_freed += size;
        }
        report.bytes_freed += report.object_bytes_freed;
        if !dry_run && report.objects_removed > 0 {
            // Its entries for removed objects would never match again, yet every later run
            // would load and re-save them; start it afresh, as `prune_objects` does.
            objects.drop_verified_cache()?;
            // The scan record names the store as it was: it would no longer be used.
            objects.drop_scan_record()?;
        }
        Ok(())
    }
}

/// Bytes of the regular files directly in `dir` (a run directory has no subdirectories).
fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// A run whose referenced objects cannot be read: nothing may be swept.
#[derive(Debug, thiserror::Error)]
#[error(
    "the objects run '{run_id}' references cannot be read ({source}); no object was removed — \
     verify or remove that run, then prune again"
)]
struct Unmarked {
    run_id: String,
    #[source]
    source: StoreError,
}
