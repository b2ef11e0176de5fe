//! Capturing regular files: reuse of the earlier hash when nothing in the stat key changed,
//! otherwise a hash (and backup) job for the pool, and the job's result.

use super::*;

impl<'o, 'a> Walker<'o, 'a> {
    pub(super) fn regular_file(
        &mut self,
        fd: &Arc<OwnedFd>,
        at: &Listing<'_, 'a>,
        file: PendingDir,
        jobs: &Pool<'_, '_>,
    ) {
        let PendingDir {
            c_name,
            name,
            rel: path,
            seen,
            ..
        } = file;
        self.stats.files += 1;
        let backup = self.opts.backup;
        if seen.size > self.opts.max_hash_bytes {
            let state = match backup {
                Some(_) => BackupState::Skipped {
                    reason: BackupSkip::TooLarge,
                    detail: None,
                },
                None => BackupState::NotRequested,
            };
            self.record(at.id, &name, entry(&seen, EntryKind::File, state));
            let why = format!(
                "{} bytes exceeds the hash limit of {} bytes; metadata only",
                seen.size, self.opts.max_hash_bytes
            );
            self.report(path, uk::TOO_LARGE, why);
            self.counters.file_done(0, self.opts.progress);
            return;
        }
        let file = Deferred {
            c_name,
            name,
            path,
            seen,
        };
        if at.digest.is_some() {
            // A placeholder until the listing's digest is known (see `settle_deferred`).
            let placeholder = entry(&seen, EntryKind::File, BackupState::NotRequested);
            self.record(at.id, &file.name, placeholder);
            self.deferred.push(file);
            return;
        }
        let prev = at.prev.and_then(|p| p.entry(&file.path, &file.name));
        self.reuse_or_hash(fd, at.id, prev, file, jobs);
    }

    /// Records a regular file with the earlier entry's hash when the stat cache allows it, else
    /// sends it to the hashing workers.
    pub(super) fn reuse_or_hash(
        &mut self,
        fd: &Arc<OwnedFd>,
        dir: u64,
        prev: Option<&Entry>,
        file: Deferred,
        jobs: &Pool<'_, '_>,
    ) {
        let Deferred {
            c_name,
            name,
            path,
            seen,
        } = file;
        if let Some((sha, state, reused_backup)) = self.reusable(prev, &seen) {
            let mut e = entry(&seen, EntryKind::File, state);
            e.sha256 = Some(sha);
            self.record(dir, &name, e);
            self.stats.hashes_reused += 1;
            self.stats.backups_reused += u64::from(reused_backup);
            self.counters.file_done(0, self.opts.progress);
            return;
        }
        let job = FileJob {
            parent: Arc::clone(fd),
            reply: self.inbox.clone(),
            c_name,
            dir,
            name,
            seen,
        };
        self.add_pending(dir);
        if let Some(failed) = jobs.send(job) {
            let state = match self.opts.backup {
                Some(_) => BackupState::Skipped {
                    reason: BackupSkip::NotHashed,
                    detail: None,
                },
                None => BackupState::NotRequested,
            };
            self.record(dir, &failed.name, entry(&seen, EntryKind::File, state));
            self.report(path, uk::UNREADABLE, "no hashing worker available");
            self.done_one(dir);
        }
    }

    /// The earlier scan's hash when all seven identity fields are unchanged and the entry is not
    /// racy; with a backup request, only when no copy is needed (the object is stored and
    /// verified, or the file is ineligible anyway).
    pub(super) fn reusable(
        &self,
        prev: Option<&Entry>,
        seen: &Meta,
    ) -> Option<(String, BackupState, bool)> {
        let racy_from = self.reuse.as_ref()?.racy_from;
        let prev = prev?;
        if prev.mtime_ns.max(prev.ctime_ns) >= racy_from {
            return None;
        }
        let unchanged = prev.kind == EntryKind::File
            && prev.dev == seen.dev
            && prev.ino == seen.ino
            && prev.size == seen.size
            && prev.mtime_ns == seen.mtime_ns
            && prev.ctime_ns == seen.ctime_ns
            && prev.mode == seen.perm
            && prev.nlink == seen.nlink;
        if !unchanged {
            return None;
        }
        let sha = prev.sha256.clone()?;
        let Some(req) = self.opts.backup else {
            let state = if self.opts.carry_backup_state {
                prev.backup.clone()
            } else {
                BackupState::NotRequested
            };
            return Some((sha, state, false));
        };
        let eligible = seen.nlink == 1 && seen.size <= req.max_file_bytes;
        if eligible {
            // One look in the sink decides: stored (reused as it is) or needs the open file.
            return req
                .sink
                .contains(&sha, seen.size)
                .then_some((sha, BackupState::Stored, true));
        }
        let mut scratch = Captured {
            sha256: None,
            backup: BackupState::NotRequested,
            problem: None,
            bytes_hashed: 0,
            backup_stored: false,
            backup_reused: false,
        };
        let state = backup_state(&req, seen, &sha, &mut scratch, None);
        Some((sha, state, scratch.backup_reused))
    }

    pub(super) fn file_result(&mut self, r: FileResult) {
        let FileResult {
            dir,
            name,
            seen,
            captured,
        } = r;
        let mut e = entry(&seen, EntryKind::File, captured.backup);
        e.sha256 = captured.sha256;
        self.stats.backups_stored += u64::from(captured.backup_stored);
        self.stats.backups_reused += u64::from(captured.backup_reused);
        if let Some((kind, reason)) = captured.problem {
            let rel = self.open.get(&dir).map_or("", |d| d.rel.as_str());
            let path = join(rel, &name);
            self.report(path, kind, reason);
        }
        self.record(dir, &name, e);
        self.done_one(dir);
    }
}
