//! Listing a directory: opening it without following a link, reading its names, and sorting each
//! entry into what is excluded, what is a symlink, a directory to descend into, or a file to
//! capture.

use super::*;
use agentdiff_host::dir::Listed;
use agentdiff_host::git_dirs::listing_has_layout;

impl<'o, 'a> Walker<'o, 'a> {
    /// Registers a directory about to be listed (pending 1 until its listing is done).
    pub(super) fn open_node(
        &mut self,
        rel: String,
        parent: Option<(u64, String)>,
        is_entry: bool,
        owner: Option<Sender<Event>>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.open.insert(
            id,
            OpenDir {
                rel,
                parent,
                is_entry,
                tree: Tree::default(),
                pending: 1,
                earlier: None,
                same_stat: None,
                owner,
            },
        );
        id
    }

    /// Opens a directory popped from the stack and lists it.
    pub(super) fn open_and_list(&mut self, dir: PendingDir, stack: &mut Stack, jobs: &Pool) {
        #[cfg(test)]
        BEFORE_OPEN_DIR.with(|h| {
            if let Some(hook) = h.borrow_mut().as_mut() {
                hook(&dir.rel);
            }
        });
        #[cfg(test)]
        if dir.name == PANIC_IN_HELPER
            && std::thread::current()
                .name()
                .is_some_and(|n| n.starts_with("agentdiff-walk-"))
        {
            panic!("a helper walker died");
        }
        let PendingDir {
            parent,
            c_name,
            parent_dir,
            name,
            rel,
            seen,
            searched,
            is_entry,
            git,
            prev,
            owner,
        } = dir;
        let opened = open_dir(&parent, &c_name, &seen);
        drop(parent);
        let id = self.open_node(rel.clone(), Some((parent_dir, name)), is_entry, owner);
        match opened {
            Ok(fd) => {
                let fd = Arc::new(fd);
                self.list_dir(&fd, id, &rel, (searched, git), prev, stack, jobs);
            }
            Err((kind, reason)) => {
                self.report(rel, kind, reason);
                // A directory entry still gets its (empty) tree.
                self.done_one(id);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn list_dir(
        &mut self,
        fd: &Arc<OwnedFd>,
        id: u64,
        rel: &str,
        (searched, in_git): (bool, bool),
        prev: Option<PrevRef>,
        stack: &mut Stack,
        jobs: &Pool<'_, '_>,
    ) {
        let (mut names, error) = read_names(fd, &mut self.list_buf);
        // Git takes such a directory for a repository whatever its name. The root is recorded
        // too (`""`: git runs in a project without `.git` as a bare repository there), but its
        // entries keep their ignore rules: only git's own names in it are git metadata.
        let layout = !in_git && listing_has_layout(fd.as_ref(), &names);
        if layout {
            self.git_layouts.push(rel.to_owned());
        }
        let root_git = layout && rel.is_empty();
        let layout = layout && !rel.is_empty();
        let (prev, digest) = self.earlier_listing(prev);
        let at = Listing {
            id,
            rel,
            searched,
            git: in_git || layout,
            root_git,
            prev: prev.as_ref(),
            digest: digest.as_ref().map(|(_, d)| *d),
        };
        let shown = if rel.is_empty() {
            ".".to_string()
        } else {
            rel.to_string()
        };
        if let Some(e) = error {
            let why = format!(
                "cannot list directory: {e}; {} entries read were captured",
                names.len()
            );
            self.report(shown, uk::UNREADABLE, why);
        }
        names.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        // Pushed in reverse so the depth-first walk visits directories in name order.
        let mut subdirs = Vec::new();
        for Listed { name, kind, .. } in names {
            if let Some(sub) = self.list_entry(fd, &at, name, kind, jobs) {
                self.add_pending(id);
                subdirs.push(sub);
            }
        }
        stack.extend(subdirs.into_iter().rev());
        let prev = match digest {
            Some((earlier_id, d)) => self.settle_deferred(fd, id, earlier_id, d, jobs),
            None => prev,
        };
        if let (Some(Prev::Tree(earlier)), Some(node)) = (prev, self.open.get_mut(&id)) {
            node.earlier = Some(earlier);
        }
        self.done_one(id);
    }

    /// The earlier listing `r` names: its stat digest when one is kept (the tree is then not
    /// read), else the tree itself.
    pub(super) fn earlier_listing(
        &self,
        r: Option<PrevRef>,
    ) -> (Option<Prev<'a>>, Option<(String, &'a DirDigest)>) {
        let (Some(r), Some(reuse)) = (r, self.reuse.as_ref()) else {
            return (None, None);
        };
        if let PrevRef::Tree(id) = &r {
            if let Some(d) = reuse.digest(id) {
                return (None, Some((id.clone(), d)));
            }
        }
        (reuse.load(r), None)
    }

    /// After a listing checked against the stat digest `d` of the earlier tree `earlier_id`:
    /// when the listing gives the same digest, its files are that tree's (nothing is read);
    /// otherwise the tree is read and each file is reused or hashed as without a digest.
    /// Returns the earlier listing read, if any.
    pub(super) fn settle_deferred(
        &mut self,
        fd: &Arc<OwnedFd>,
        dir: u64,
        earlier_id: String,
        d: &DirDigest,
        jobs: &Pool<'_, '_>,
    ) -> Option<Prev<'a>> {
        let deferred = std::mem::take(&mut self.deferred);
        let same = self.open.get(&dir).is_some_and(|n| {
            let files = n.tree.entries.values();
            files.filter(|e| e.kind == EntryKind::File).count() == deferred.len()
                && stat_digest(&n.tree.entries) == d.stat
        });
        if same {
            self.stats.hashes_reused += deferred.len() as u64;
            if self.opts.backup.is_some() {
                // Every file's backup is the earlier tree's, stored (see `DirDigest::fits`).
                self.stats.backups_reused += deferred.len() as u64;
            }
            for _ in &deferred {
                self.counters.file_done(0, self.opts.progress);
            }
            if let Some(node) = self.open.get_mut(&dir) {
                node.same_stat = Some(earlier_id);
            }
            return None;
        }
        let prev = self
            .reuse
            .as_ref()
            .and_then(|r| r.load(PrevRef::Tree(earlier_id)));
        for f in deferred {
            let earlier = prev.as_ref().and_then(|p| p.entry(&f.path, &f.name));
            self.reuse_or_hash(fd, dir, earlier, f, jobs);
        }
        prev
    }

    /// Records one name of a listing; returns the subdirectory to descend into, if it is one.
    pub(super) fn list_entry(
        &mut self,
        fd: &Arc<OwnedFd>,
        at: &Listing<'_, 'a>,
        c_name: CString,
        d_type: Option<Type>,
        jobs: &Pool<'_, '_>,
    ) -> Option<PendingDir> {
        let Ok(name_str) = std::str::from_utf8(c_name.to_bytes()) else {
            self.non_utf8_name(fd, &c_name, at.rel);
            return None;
        };
        let name = name_str.to_string();
        let path = join(at.rel, &name);
        // Where the listing gives the entry's type, an excluded entry is dropped without a
        // stat: inside a searched directory that is every name no glob names.
        let early = d_type.map(|t| {
            let is_dir = t == Type::Directory;
            (is_dir, self.verdict(at, &path, &name, is_dir))
        });
        if let Some((_, Verdict::Exclude(reason))) = early {
            self.exclude(path, reason, at.searched);
            return None;
        }
        let seen = match fstatat(
            Some(fd.as_raw_fd()),
            c_name.as_c_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => Meta::from_stat(&st),
            Err(Errno::ENOENT) => {
                self.report(
                    path,
                    uk::CHANGED_DURING_CAPTURE,
                    "removed while its directory was listed",
                );
                return None;
            }
            Err(e) => {
                self.report(path, uk::UNREADABLE, format!("cannot lstat: {}", e.desc()));
                return None;
            }
        };
        let is_dir = seen.is(SFlag::S_IFDIR);
        // The stat decides when it disagrees with the listing (the entry was replaced).
        let verdict = match early {
            Some((guess, v)) if guess == is_dir => v,
            _ => self.verdict(at, &path, &name, is_dir),
        };
        let git = in_git(at, &name);
        let mut sub = PendingDir {
            parent: Arc::clone(fd),
            c_name,
            parent_dir: at.id,
            prev: at.sub(&name),
            owner: None,
            name,
            rel: path,
            seen,
            searched: at.searched,
            is_entry: true,
            git,
        };
        match verdict {
            Verdict::Scan => {}
            Verdict::Exclude(reason) => {
                self.exclude(sub.rel, reason, at.searched);
                return None;
            }
            Verdict::Search(reason) => {
                self.exclude(sub.rel.clone(), reason, at.searched);
                sub.searched = true;
                sub.is_entry = false;
                return Some(sub);
            }
        }
        if is_dir {
            self.stats.directories += 1;
            let e = entry(&seen, EntryKind::Directory, BackupState::NotApplicable);
            self.record(at.id, &sub.name, e);
            Some(sub)
        } else if seen.is(SFlag::S_IFLNK) {
            self.symlink(fd, at.id, &sub.c_name, &sub.name, sub.rel, &seen);
            None
        } else if seen.is(SFlag::S_IFREG) {
            self.regular_file(fd, at, sub, jobs);
            None
        } else {
            let kind = type_name(&seen);
            let why = format!(
                "{} not captured (only regular files, directories and symlinks are)",
                describe(&seen)
            );
            self.report(sub.rel, kind, why);
            None
        }
    }

    /// What to do with `path` listed at `at`: in git metadata no ignore rule applies.
    fn verdict(&self, at: &Listing<'_, 'a>, path: &str, name: &str, is_dir: bool) -> Verdict {
        if in_git(at, name) {
            self.rules.verdict_unignored(path, name, is_dir)
        } else {
            self.rules.verdict(path, name, is_dir, at.searched)
        }
    }

    /// Records an excluded entry; inside a searched directory the directory's own record covers it.
    pub(super) fn exclude(&mut self, path: String, reason: &str, searched: bool) {
        if !searched {
            self.excluded.push(Exclusion {
                path,
                reason: reason.to_string(),
            });
        }
    }

    pub(super) fn non_utf8_name(&mut self, fd: &OwnedFd, name: &CStr, rel: &str) {
        let kind = fstatat(Some(fd.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map(|st| describe(&Meta::from_stat(&st)))
            .unwrap_or("entry");
        let why =
            format!("name is not valid UTF-8 (a {kind}); not captured and not descended into");
        let shown = escape_bytes(name.to_bytes());
        self.report(join(rel, &shown), uk::NON_UTF8_NAME, why);
    }

    pub(super) fn symlink(
        &mut self,
        fd: &OwnedFd,
        dir: u64,
        c_name: &CStr,
        name: &str,
        path: String,
        seen: &Meta,
    ) {
        self.stats.symlinks += 1;
        let mut e = entry(seen, EntryKind::Symlink, BackupState::NotApplicable);
        match readlinkat(Some(fd.as_raw_fd()), c_name) {
            Ok(target) => {
                let bytes = target.as_bytes();
                e.symlink_target = Some(escape_bytes(bytes));
                if std::str::from_utf8(bytes).is_err() {
                    self.report(
                        path,
                        uk::NON_UTF8_SYMLINK_TARGET,
                        "symlink target is not valid UTF-8; recorded with \\xNN escapes",
                    );
                }
            }
            Err(Errno::EINVAL | Errno::ENOENT) => {
                self.report(
                    path,
                    uk::CHANGED_DURING_CAPTURE,
                    "symlink replaced or removed before its target was read",
                );
            }
            Err(err) => {
                self.report(
                    path,
                    uk::UNREADABLE,
                    format!("cannot read symlink target: {}", err.desc()),
                );
            }
        }
        self.record(dir, name, e);
    }
}

fn describe(seen: &Meta) -> &'static str {
    if seen.is(SFlag::S_IFDIR) {
        "directory"
    } else if seen.is(SFlag::S_IFLNK) {
        "symlink"
    } else if seen.is(SFlag::S_IFREG) {
        "regular file"
    } else if seen.is(SFlag::S_IFIFO) {
        "FIFO"
    } else if seen.is(SFlag::S_IFSOCK) {
        "socket"
    } else if seen.is(SFlag::S_IFCHR) {
        "character device"
    } else if seen.is(SFlag::S_IFBLK) {
        "block device"
    } else {
        "file of unknown type"
    }
}

/// Opens the subdirectory `name` of `parent` without following a symlink and checks it is the
/// directory the listing saw.
fn open_dir(parent: &OwnedFd, name: &CStr, seen: &Meta) -> Result<OwnedFd, (&'static str, String)> {
    let fd = match agentdiff_host::dir::open_dir_at(parent, name) {
        Ok(fd) => fd,
        Err(Errno::ELOOP | Errno::ENOTDIR) => {
            return Err((
                uk::CHANGED_DURING_CAPTURE,
                "directory replaced by a symlink or non-directory during the walk; not followed"
                    .into(),
            ))
        }
        Err(Errno::ENOENT) => {
            return Err((
                uk::CHANGED_DURING_CAPTURE,
                "directory removed during the walk".into(),
            ))
        }
        Err(Errno::EMFILE | Errno::ENFILE) => {
            return Err((
                uk::UNREADABLE,
                "too many open files (directory nesting too deep); contents not captured".into(),
            ))
        }
        Err(e) => {
            return Err((
                uk::UNREADABLE,
                format!("cannot open directory: {}; contents not captured", e.desc()),
            ))
        }
    };
    match fstat(fd.as_raw_fd()) {
        Ok(st) => {
            let now = Meta::from_stat(&st);
            if now.dev != seen.dev || now.ino != seen.ino || !now.is(SFlag::S_IFDIR) {
                return Err((
                    uk::CHANGED_DURING_CAPTURE,
                    "directory replaced during the walk; contents not captured".into(),
                ));
            }
            Ok(fd)
        }
        Err(e) => Err((
            uk::UNREADABLE,
            format!("cannot fstat directory: {}", e.desc()),
        )),
    }
}

/// The names of a directory with the type the listing gives each (`None` where the filesystem
/// gives none), and the error that stopped the listing, if any
/// ([`agentdiff_host::dir::list_names`]: `getdents64` on the directory's own fd, no `DIR` stream).
pub(super) fn read_names(fd: &OwnedFd, buf: &mut Vec<u8>) -> (Vec<Listed>, Option<String>) {
    let (names, error) = agentdiff_host::dir::list_names(fd, buf);
    (names, error.map(|e| e.desc().to_string()))
}

/// Whether `name`, listed at `at`, is git metadata: in a git directory, or one of git's own
/// names at a root with git's layout.
fn in_git(at: &Listing<'_, '_>, name: &str) -> bool {
    at.git || (at.root_git && agentdiff_host::git_dirs::GIT_DIR_ENTRIES.contains(&name))
}
