//! The sweep of excluded paths for programs and git metadata (see [`crate::programs`]): every
//! excluded directory is listed and every name in it `lstat`ed, one directory handle per level,
//! never through a symlink; no file is opened.

use std::sync::atomic::AtomicUsize;
use std::sync::Condvar;

use super::list::read_names;
use super::*;
use crate::manifest::exclusion_reason::{AGENTDIFFIGNORE, DEFAULT_GENERATED};
use crate::programs::{
    program_reason, Program, ProgramReason, ProgramSweep, MAX_SWEEP_DEPTH, MAX_SWEPT_ENTRIES,
    MAX_SWEPT_PROGRAMS,
};
use agentdiff_host::dir::Listed;
use agentdiff_host::git_dirs::listing_has_layout;

/// Sweeps every path in `excluded` (sorted by path) below `root`, on up to `threads` threads.
pub(super) fn sweep(root: &OwnedFd, excluded: &[Exclusion], threads: usize) -> ProgramSweep {
    let shared = Shared {
        queue: Mutex::new(Queue::default()),
        more: Condvar::new(),
        entries_seen: AtomicU64::new(0),
        programs: AtomicUsize::new(0),
    };
    let mut first = Sweeper::new(&shared);
    let mut last_swept: Option<&str> = None;
    for ex in excluded {
        // The run store is agentdiff's own and checked by the capsule's tamper evidence.
        if !matches!(ex.reason.as_str(), DEFAULT_GENERATED | AGENTDIFFIGNORE)
            || git_objects(&ex.path)
            || last_swept.is_some_and(|d| below(&ex.path, d))
        {
            continue;
        }
        last_swept = Some(&ex.path);
        first.sweep_path(root, &ex.path);
    }
    let mut parts = vec![first.finish()];
    std::thread::scope(|scope| {
        let helpers: Vec<_> = (1..threads.max(1))
            .filter_map(|i| {
                std::thread::Builder::new()
                    .name(format!("agentdiff-sweep-{i}"))
                    .spawn_scoped(scope, || {
                        let mut s = Sweeper::new(&shared);
                        s.work();
                        s.finish()
                    })
                    // Fewer threads only make the sweep slower, never less complete.
                    .ok()
            })
            .collect();
        let mut s = Sweeper::new(&shared);
        s.work();
        parts.push(s.finish());
        for h in helpers {
            match h.join() {
                Ok(part) => parts.push(part),
                Err(_) => parts.push(ProgramSweep {
                    incomplete: vec!["a sweep thread failed; its part was not swept".into()],
                    ..ProgramSweep::default()
                }),
            }
        }
    });
    let mut out = ProgramSweep::default();
    for part in parts {
        out.entries_seen += part.entries_seen;
        out.programs.extend(part.programs);
        out.git_layouts.extend(part.git_layouts);
        for why in part.incomplete {
            out.note_incomplete(why);
        }
    }
    if shared.stopped() {
        out.note_incomplete(format!(
            "the sweep stopped at its bound ({MAX_SWEPT_ENTRIES} names or \
             {MAX_SWEPT_PROGRAMS} programs); the rest of the excluded paths was not swept"
        ));
    }
    out.programs.sort_by(|a, b| a.path.cmp(&b.path));
    out.git_layouts.sort();
    out.incomplete.sort();
    out
}

/// A directory waiting to be listed: its parent stays open through the `Arc` until every such
/// child is taken, so open descriptors are bounded by the depth being worked on, not the width.
struct Task {
    parent: Arc<OwnedFd>,
    c_name: CString,
    rel: String,
    name: String,
    depth: usize,
    /// The depth of the git directory it is in, if it is in one.
    git: Option<usize>,
}

/// Where one name is, for [`Sweeper::visit`].
struct At<'n> {
    name: &'n str,
    rel: String,
    parent_name: &'n str,
    depth: usize,
    /// The depth of the git directory the name is in, if it is in one.
    git: Option<usize>,
}

#[derive(Default)]
struct Queue {
    /// Taken last-in first-out: the walk stays depth-first.
    tasks: Vec<Task>,
    /// Tasks pushed and not yet finished (taken ones included).
    pending: usize,
}

struct Shared {
    queue: Mutex<Queue>,
    more: Condvar,
    entries_seen: AtomicU64,
    programs: AtomicUsize,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.entries_seen.load(Ordering::Relaxed) >= MAX_SWEPT_ENTRIES
            || self.programs.load(Ordering::Relaxed) >= MAX_SWEPT_PROGRAMS
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, task: Task) {
        let mut q = self.lock();
        q.tasks.push(task);
        q.pending += 1;
        drop(q);
        self.more.notify_one();
    }

    /// The next task, or `None` when every task is finished.
    fn take(&self) -> Option<Task> {
        let mut q = self.lock();
        loop {
            if let Some(t) = q.tasks.pop() {
                return Some(t);
            }
            if q.pending == 0 {
                return None;
            }
            q = self.more.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
    }

    fn done(&self) {
        let mut q = self.lock();
        q.pending = q.pending.saturating_sub(1);
        let all_done = q.pending == 0;
        drop(q);
        if all_done {
            self.more.notify_all();
        }
    }
}

struct Sweeper<'s> {
    shared: &'s Shared,
    out: ProgramSweep,
    buf: Vec<u8>,
}

/// `rel` is `dir` or below it.
fn below(rel: &str, dir: &str) -> bool {
    rel == dir || rel.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// A Git object store (`.git/objects` at any depth): content addressed, never run.
fn git_objects(rel: &str) -> bool {
    rel == ".git/objects" || rel.ends_with("/.git/objects")
}

impl<'s> Sweeper<'s> {
    fn new(shared: &'s Shared) -> Self {
        Self {
            shared,
            out: ProgramSweep::default(),
            buf: Vec::new(),
        }
    }

    fn finish(self) -> ProgramSweep {
        self.out
    }

    /// Lists queued directories until none is left anywhere.
    fn work(&mut self) {
        while let Some(task) = self.shared.take() {
            if !self.shared.stopped() {
                self.list(&task);
            }
            // Dropped before `done`, so its parent's descriptor is closed when nothing needs it.
            drop(task);
            self.shared.done();
        }
    }

    /// Reaches the excluded path one component at a time and sweeps what is there.
    fn sweep_path(&mut self, root: &OwnedFd, rel: &str) {
        let mut parts: Vec<&str> = rel.split('/').collect();
        let Some(last) = parts.pop() else { return };
        let mut dir: Option<OwnedFd> = None;
        for part in parts {
            let Ok(c) = CString::new(part) else { return };
            let parent = dir.as_ref().unwrap_or(root);
            match agentdiff_host::dir::open_path_at(parent, &c) {
                Ok(fd) => dir = Some(fd),
                Err(e) => {
                    // The walk saw this path a moment ago: a parent that is gone or replaced now
                    // is a change the sweep could not follow.
                    self.unreadable(rel, e);
                    return;
                }
            }
        }
        let parent = match dir {
            Some(fd) => Arc::new(fd),
            None => match root.try_clone() {
                Ok(fd) => Arc::new(fd),
                Err(e) => {
                    let errno = e.raw_os_error().map_or(Errno::EBADF, Errno::from_raw);
                    return self.unreadable(rel, errno);
                }
            },
        };
        let parent_name = rel.rsplit('/').nth(1).unwrap_or("");
        if let Ok(c) = CString::new(last) {
            let at = At {
                name: last,
                rel: rel.to_owned(),
                parent_name,
                depth: 0,
                git: None,
            };
            self.visit(&parent, c, at);
        }
    }

    /// One name below `parent`: a directory is queued, a program or git metadata recorded.
    fn visit(&mut self, parent: &Arc<OwnedFd>, c_name: CString, at: At<'_>) {
        self.shared.entries_seen.fetch_add(1, Ordering::Relaxed);
        self.out.entries_seen += 1;
        let seen = match fstatat(
            Some(parent.as_raw_fd()),
            c_name.as_c_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => Meta::from_stat(&st),
            // Removed between listing and stat: nothing is there to run.
            Err(Errno::ENOENT) => return,
            Err(e) => return self.unreadable(&at.rel, e),
        };
        // A `.git` entry of any kind is git metadata: a directory git reads, a `gitdir:` file
        // or a symlink that points git elsewhere.
        let git = match at.git {
            None if at.name == ".git" => {
                self.record(parent, &c_name, &at.rel, &seen, ProgramReason::GitMetadata);
                Some(at.depth)
            }
            g => g,
        };
        if seen.is(SFlag::S_IFDIR) {
            // An object store is content addressed: git runs nothing from it.
            let objects = git.is_some_and(|d| at.depth == d + 1) && at.name == "objects";
            if git_objects(&at.rel) || objects {
                return;
            }
            if at.depth >= MAX_SWEEP_DEPTH {
                return self.out.note_incomplete(format!(
                    "{}: deeper than {MAX_SWEEP_DEPTH} levels; not swept below",
                    escape_terminal(&at.rel)
                ));
            }
            return self.shared.push(Task {
                parent: Arc::clone(parent),
                c_name,
                rel: at.rel,
                name: at.name.to_owned(),
                depth: at.depth,
                git,
            });
        }
        let kind = if seen.is(SFlag::S_IFREG) {
            EntryKind::File
        } else if seen.is(SFlag::S_IFLNK) {
            EntryKind::Symlink
        } else {
            return;
        };
        if at.git.is_some() {
            return self.record(parent, &c_name, &at.rel, &seen, ProgramReason::GitMetadata);
        }
        if git.is_some() {
            // The `.git` entry itself, recorded above.
            return;
        }
        if let Some(reason) = program_reason(at.name, kind, seen.perm, at.parent_name) {
            self.record(parent, &c_name, &at.rel, &seen, reason);
        }
    }

    /// Records what `seen` shows of `rel` (a symlink with its target).
    fn record(
        &mut self,
        parent: &Arc<OwnedFd>,
        c_name: &CString,
        rel: &str,
        seen: &Meta,
        reason: ProgramReason,
    ) {
        let mut program = self.program(rel, seen, reason);
        program.symlink_target = (program.kind == EntryKind::Symlink)
            .then(|| readlinkat(Some(parent.as_raw_fd()), c_name.as_c_str()).ok())
            .flatten()
            .map(|t| escape_bytes(t.as_bytes()));
        self.shared.programs.fetch_add(1, Ordering::Relaxed);
        self.out.programs.push(program);
    }

    /// What `seen` shows of `rel`, without a symlink's target.
    fn program(&self, rel: &str, seen: &Meta, reason: ProgramReason) -> Program {
        let kind = if seen.is(SFlag::S_IFDIR) {
            EntryKind::Directory
        } else if seen.is(SFlag::S_IFLNK) {
            EntryKind::Symlink
        } else {
            EntryKind::File
        };
        Program {
            path: rel.to_owned(),
            kind,
            reason,
            size: seen.size,
            mode: seen.perm,
            mtime_ns: seen.mtime_ns,
            ctime_ns: seen.ctime_ns,
            dev: seen.dev,
            ino: seen.ino,
            symlink_target: None,
        }
    }

    /// Lists one queued directory and visits every name in it.
    fn list(&mut self, task: &Task) {
        let fd = match agentdiff_host::dir::open_dir_at(task.parent.as_ref(), &task.c_name) {
            Ok(fd) => Arc::new(fd),
            Err(Errno::ENOENT) => return,
            Err(e) => return self.unreadable(&task.rel, e),
        };
        let mut buf = std::mem::take(&mut self.buf);
        let (names, error) = read_names(&fd, &mut buf);
        self.buf = buf;
        let git = self.git_of(task, &fd, &names);
        if let Some(e) = error {
            self.out.note_incomplete(format!(
                "{}: cannot list ({e}); not swept",
                escape_terminal(&task.rel)
            ));
        }
        for Listed { name: c_child, .. } in names {
            if self.shared.stopped() {
                return;
            }
            let Ok(child) = std::str::from_utf8(c_child.to_bytes()) else {
                // The name cannot be recorded; a program under it would go unseen.
                self.out.note_incomplete(format!(
                    "{}/{}: a name that is not UTF-8; not swept",
                    escape_terminal(&task.rel),
                    escape_bytes(c_child.to_bytes())
                ));
                continue;
            };
            let child = child.to_owned();
            let at = At {
                name: &child,
                rel: join(&task.rel, &child),
                parent_name: &task.name,
                depth: task.depth + 1,
                git,
            };
            self.visit(&fd, c_child, at);
        }
    }

    /// The depth of the git directory `task`'s entries are in: its own when its listing has git's
    /// layout (a repository whatever its name, recorded and listed here; a `.git` directory was
    /// recorded when visited, and its layout is listed too, as the walk does).
    fn git_of(&mut self, task: &Task, fd: &OwnedFd, names: &[Listed]) -> Option<usize> {
        let dot_git = task.git == Some(task.depth);
        if !(task.git.is_none() || dot_git) || !listing_has_layout(fd, names) {
            return task.git;
        }
        self.out.git_layouts.push(task.rel.clone());
        if task.git.is_none() {
            if let Ok(st) = fstat(fd.as_raw_fd()) {
                let program =
                    self.program(&task.rel, &Meta::from_stat(&st), ProgramReason::GitMetadata);
                self.shared.programs.fetch_add(1, Ordering::Relaxed);
                self.out.programs.push(program);
            }
        }
        Some(task.depth)
    }

    fn unreadable(&mut self, rel: &str, e: Errno) {
        self.out.note_incomplete(format!(
            "{}: cannot be swept ({})",
            escape_terminal(rel),
            e.desc()
        ));
    }
}

fn escape_terminal(s: &str) -> String {
    agentdiff_host::redact::escape_terminal(s)
}
