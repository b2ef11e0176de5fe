//! Where a project's git metadata lives, derived from the tree rather than from the name `.git`.
//!
//! Git runs code from its metadata (hooks, `core.fsmonitor`, filters), so a command that can
//! write any git directory the user later works in can run code outside every sandbox. A git
//! directory is not always `ROOT/.git`: `git init --separate-git-dir`, `git worktree add` and
//! submodules leave a `.git` *file* (`gitdir: PATH`) whose target may be anywhere, a worktree's
//! git directory names the shared one in `commondir`, and a bare repository or a nested one can
//! sit anywhere below the root.
//!
//! [`discover`] walks the directories below the root once, on a few threads (it lists them, it
//! reads no file but `.git` files and `commondir`; the evidence store `ROOT/.agentdiff` is not
//! searched) and returns, the same whatever the number of threads:
//! - every directory git itself would take for a git directory (a `HEAD` file, a `refs`
//!   directory, and an `objects` directory or a `commondir` file), whatever its name;
//! - every `.git` entry (a directory, or a file, which is returned as well so that the pointer
//!   itself can be protected);
//! - the target of each `.git` file's `gitdir:` line (relative paths against the file's
//!   directory), inside or outside the root, and the `commondir` of every git directory found.
//!
//! The walk sits on the critical path of every run (the launch waits for it), so it costs four
//! system calls per directory: each is opened relative to its parent's descriptor
//! (`openat(O_NOFOLLOW)`, one path component: a directory swapped for a symlink mid-walk is not
//! followed but listed as unreadable), listed with `getdents64` on that descriptor, types taken
//! from the listing (`d_type`; an `fstatat` only where the filesystem gives none), and closed;
//! each walker keeps its own depth-first stack and hands half of it over only while another
//! walker waits. At most `HELD_DESCRIPTORS` parents stay open for directories still to list;
//! past that, children are opened by path (a deep tree cannot run the walk out of descriptors).
//!
//! Invariants: symlinks are never followed during the walk; a target named by a `.git` file or
//! a `commondir` is accepted only when it is a directory git would take for a git directory, is
//! not the root or one of its ancestors, and is not below `/proc`, `/sys` or `/dev` — so a
//! pointer a command planted can only ever add protection to what already is a git directory,
//! never make agentdiff protect (or trust) an arbitrary path. Ignored pointers are listed in
//! [`GitDirs::ignored`].
//!
//! Not defended here: metadata created or re-pointed while the command runs (the walk happens
//! before the launch). The scanner applies the same layout rule ([`has_layout`]) to every
//! directory it lists, in the captured tree and in the sweep of excluded directories, so a
//! repository made during the run under any name is decided as git metadata after it; directories
//! the walk cannot read are listed in `unreadable`.

use std::ffi::{CString, OsStr};
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::dir::{self, Listed};

/// The evidence store's directory name below the root, not searched.
const STORE_DIR: &str = ".agentdiff";

/// Kernel filesystems no pointer may lead into.
const KERNEL_FILESYSTEMS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// How a git directory was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Found {
    /// An entry named `.git` (a directory, or the `.git` file itself).
    DotGit,
    /// A directory with git's own layout, whatever its name (a bare or renamed repository).
    Layout,
    /// The target of a `.git` file's `gitdir:` line.
    GitdirFile,
    /// The `commondir` of a git directory (a worktree's shared repository).
    Commondir,
    /// The target of a symlink named `.git` (git follows it).
    Symlink,
}

/// One protected location: canonical path, and how it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitDir {
    pub path: PathBuf,
    pub found: Found,
}

/// The result of [`discover`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitDirs {
    /// Every git directory and `.git` file, canonical, without duplicates, in walk order.
    pub dirs: Vec<GitDir>,
    /// Pointers that were not followed, each with why.
    pub ignored: Vec<String>,
    /// Directories below the root the walk could not list.
    pub unreadable: Vec<PathBuf>,
}

impl GitDirs {
    /// Every path found, canonical.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.path.clone()).collect()
    }

    /// The paths below `root` (root-relative, `/`-separated), for deciding recorded changes.
    pub fn relative_to(&self, root: &Path) -> Vec<String> {
        let mut out: Vec<String> = self
            .dirs
            .iter()
            .filter_map(|d| d.path.strip_prefix(root).ok())
            .filter(|rel| !rel.as_os_str().is_empty())
            .map(|rel| rel.to_string_lossy().into_owned())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    fn push(&mut self, path: PathBuf, found: Found) -> bool {
        if self.dirs.iter().any(|d| d.path == path) {
            return false;
        }
        self.dirs.push(GitDir { path, found });
        true
    }
}

/// Whether a directory has git's layout of a git directory, from what `has(name, kind)` says of
/// its entries: a `HEAD` file, a `refs` directory, and an `objects` directory or a `commondir`
/// file. The one rule every caller uses (the walk here, the scanner's listings and sweeps), so a
/// layout git takes for a repository is recognised the same way before, during and after a run.
/// Callers answer without following symlinks, and count a symlink as either kind
/// ([`LayoutKind::admits`]): git follows them (a symlinked `HEAD` is a symbolic ref, `objects`
/// and `refs` are checked with `access`), so a layout made of links is a repository too.
pub fn has_layout(has: impl Fn(&str, LayoutKind) -> bool) -> bool {
    has("HEAD", LayoutKind::File)
        && has("refs", LayoutKind::Dir)
        && (has("objects", LayoutKind::Dir) || has("commondir", LayoutKind::File))
}

/// The names git keeps in a git directory (a bare repository's top level): what a project root
/// that has git's layout holds as git metadata, while its other entries stay the project's.
pub const GIT_DIR_ENTRIES: [&str; 16] = [
    "HEAD",
    "config",
    "config.worktree",
    "hooks",
    "refs",
    "objects",
    "info",
    "packed-refs",
    "commondir",
    "worktrees",
    "modules",
    "logs",
    "index",
    "shallow",
    "branches",
    "remotes",
];

/// The kind of entry [`has_layout`] asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutKind {
    File,
    Dir,
}

/// An entry's type as listed (symlinks not followed), for [`LayoutKind::admits_entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryType {
    File,
    Dir,
    Symlink,
    Other,
}

impl EntryType {
    /// The layout type of a type a listing or `fstatat` gave (`None`: not known, [`Other`](Self::Other)).
    pub fn of(kind: Option<nix::dir::Type>) -> EntryType {
        match kind {
            Some(nix::dir::Type::Directory) => EntryType::Dir,
            Some(nix::dir::Type::File) => EntryType::File,
            Some(nix::dir::Type::Symlink) => EntryType::Symlink,
            _ => EntryType::Other,
        }
    }
}

/// Whether the directory open as `fd`, listed as `names` ([`dir::list_names`]), has git's
/// layout ([`has_layout`]); a wanted name the listing gave no type is inspected with `fstatat`.
pub fn listing_has_layout(fd: &impl std::os::fd::AsRawFd, names: &[Listed]) -> bool {
    has_layout(|name, kind| {
        names.iter().any(|l| {
            l.name.as_bytes() == name.as_bytes()
                && kind.admits_entry(EntryType::of(
                    l.kind.or_else(|| dir::listed_type_at(fd, &l.name)),
                ))
        })
    })
}

impl LayoutKind {
    /// Whether an entry of type `t` can be what git wants here: a symlink can be either, since
    /// git follows it.
    pub fn admits_entry(self, t: EntryType) -> bool {
        matches!(
            (self, t),
            (_, EntryType::Symlink)
                | (LayoutKind::Dir, EntryType::Dir)
                | (LayoutKind::File, EntryType::File)
        )
    }

    /// [`LayoutKind::admits_entry`] for a type `std::fs` gives.
    pub fn admits(self, t: fs::FileType) -> bool {
        let t = if t.is_symlink() {
            EntryType::Symlink
        } else if t.is_dir() {
            EntryType::Dir
        } else if t.is_file() {
            EntryType::File
        } else {
            EntryType::Other
        };
        self.admits_entry(t)
    }
}

/// Whether `dir` has git's layout of a git directory (symlinks inside it are not followed).
fn has_git_layout(dir: &Path) -> bool {
    has_layout(|name, kind| {
        fs::symlink_metadata(dir.join(name)).is_ok_and(|m| kind.admits(m.file_type()))
    })
}

/// [`has_layout`] from a directory's entries (their types as listed, symlinks not followed).
pub fn layout_of(entries: &[(std::ffi::OsString, fs::FileType)]) -> bool {
    has_layout(|name, kind| entries.iter().any(|(n, t)| n == name && kind.admits(*t)))
}

/// The `gitdir:` target of a `.git` file, resolved against the file's directory.
fn gitdir_target(file: &Path) -> io::Result<Option<PathBuf>> {
    let text = read_small(file)?;
    let Some(rest) = text.lines().next().and_then(|l| l.strip_prefix("gitdir:")) else {
        return Ok(None);
    };
    let target = PathBuf::from(rest.trim());
    if target.as_os_str().is_empty() {
        return Ok(None);
    }
    Ok(Some(match file.parent() {
        Some(dir) if target.is_relative() => dir.join(target),
        _ => target,
    }))
}

/// The directory a `commondir` file names (relative against its git directory); `None` when
/// there is no such file.
fn commondir_target(file: &Path) -> io::Result<Option<PathBuf>> {
    let text = match read_small(file) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let target = PathBuf::from(text.trim());
    if target.as_os_str().is_empty() {
        return Ok(None);
    }
    Ok(Some(match file.parent() {
        Some(dir) if target.is_relative() => dir.join(target),
        _ => target,
    }))
}

/// The first 4 KiB of a file: pointers are one line.
fn read_small(file: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    fs::File::open(file)?.take(4096).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// The canonical target, when it may be protected (see the module's invariants).
fn accept_target(root: &Path, target: &Path, what: &str) -> Result<PathBuf, String> {
    let canonical = target
        .canonicalize()
        .map_err(|e| format!("{what} {}: {e}", target.display()))?;
    if root.starts_with(&canonical) {
        return Err(format!(
            "{what} {}: the project root or above it",
            canonical.display()
        ));
    }
    if KERNEL_FILESYSTEMS
        .iter()
        .any(|k| canonical.starts_with(Path::new(k)))
    {
        return Err(format!(
            "{what} {}: a kernel filesystem",
            canonical.display()
        ));
    }
    if !has_git_layout(&canonical) {
        return Err(format!(
            "{what} {}: not a git directory (no HEAD, refs and objects or commondir)",
            canonical.display()
        ));
    }
    Ok(canonical)
}

/// Every git directory below `root` (canonical) and every one a `.git` file or `commondir`
/// there names. Never fails: what cannot be read is listed. The directories are listed on up to
/// [`MAX_WALKERS`] threads; the result is the same for any number of threads (sorted by path
/// before the pointers are followed).
pub fn discover(root: &Path) -> GitDirs {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_WALKERS));
    discover_with(root, threads)
}

/// Most threads listing directories: the walk is bound by the kernel's per-directory work.
const MAX_WALKERS: usize = 4;

fn discover_with(root: &Path, threads: usize) -> GitDirs {
    let mut out = GitDirs::default();
    let Ok(root) = root.canonicalize() else {
        out.unreadable.push(root.to_path_buf());
        return out;
    };
    // The evidence store holds no repository and many directories (objects, runs); the sandbox
    // re-binds it read-only and the engine checks it after the command.
    let store = root.join(STORE_DIR);
    // A walker thread that failed leaves its directories unlisted: walk again on this thread
    // alone rather than protect less.
    let mut walked = walk(&root, &store, threads).unwrap_or_else(|| {
        walk(&root, &store, 1).unwrap_or_else(|| Walked {
            unreadable: vec![root.clone()],
            ..Walked::default()
        })
    });
    walked.found.sort();
    for (path, found) in walked.found {
        out.push(path, found);
    }
    walked.unreadable.sort();
    out.unreadable = walked.unreadable;
    walked.pointed.sort();
    // `follow_pointers` takes them from the end: in path order.
    walked.pointed.reverse();
    follow_pointers(&root, walked.pointed, &mut out);
    out
}

/// What the walkers found: git directories, pointers to follow, directories not listed.
#[derive(Default)]
struct Walked {
    found: Vec<(PathBuf, Found)>,
    pointed: Vec<(PathBuf, Found)>,
    unreadable: Vec<PathBuf>,
}

/// Descriptors the walk keeps open for directories still to list, one per parent. Depth-first,
/// a deep tree with a directory left to list at every level would hold one per level and could
/// run the process out of descriptors (and leave the rest of the tree unlisted); past this bound a
/// directory's children are opened by path, as a walk without descriptors does (components above
/// the last are then resolved by the kernel).
const HELD_DESCRIPTORS: usize = 64;

/// A directory's descriptor kept for its children, counted in the walk's [`Shared::held`].
struct Parent {
    fd: OwnedFd,
    held: Arc<AtomicUsize>,
}

impl Drop for Parent {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A directory to list: reached through its parent's descriptor by its one-component name (the
/// root by its canonical path), so a directory swapped for a symlink mid-walk is not followed;
/// by its path when the walk holds [`HELD_DESCRIPTORS`] already.
struct DirJob {
    parent: Option<Arc<Parent>>,
    name: CString,
    path: PathBuf,
}

/// The directories handed over between walkers, and who waits for them.
struct Work {
    dirs: Vec<DirJob>,
    /// Walkers running (the calling thread and each helper that started).
    walkers: usize,
    /// Walkers waiting for a directory: their own stacks are empty.
    idle: usize,
    /// Every walker ran out of directories: the walk is over.
    done: bool,
    /// A walker panicked: the directories on its own stack are missing.
    failed: bool,
}

struct Shared {
    work: Mutex<Work>,
    more: Condvar,
    /// `Work::idle`, read without the lock to decide whether to hand directories over.
    waiting: AtomicUsize,
    /// Parent descriptors open ([`HELD_DESCRIPTORS`]).
    held: Arc<AtomicUsize>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Work> {
        self.work.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next handed-over directory; `None` when the walk is over (every walker idle with
    /// nothing queued) or failed.
    fn take(&self) -> Option<DirJob> {
        let mut work = self.lock();
        loop {
            if work.failed || work.done {
                return None;
            }
            if let Some(job) = work.dirs.pop() {
                return Some(job);
            }
            if work.idle + 1 >= work.walkers {
                work.done = true;
                self.more.notify_all();
                return None;
            }
            work.idle += 1;
            self.waiting.store(work.idle, Ordering::Relaxed);
            work = self.more.wait(work).unwrap_or_else(PoisonError::into_inner);
            work.idle -= 1;
            self.waiting.store(work.idle, Ordering::Relaxed);
        }
    }

    /// Hands the shallowest half of `stack` to walkers waiting for work.
    fn share(&self, stack: &mut Vec<DirJob>) {
        if stack.len() < 2 || self.waiting.load(Ordering::Relaxed) == 0 {
            return;
        }
        let given: Vec<DirJob> = stack.drain(..stack.len() / 2).collect();
        self.lock().dirs.extend(given);
        self.more.notify_all();
    }
}

/// Marks the walk failed when its walker panics, so nobody waits for the directories it held.
struct FailOnPanic<'s>(&'s Shared);

impl Drop for FailOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lock().failed = true;
            self.0.more.notify_all();
        }
    }
}

/// Lists every directory below `root` on `threads` threads; `None` when one of them failed.
fn walk(root: &Path, store: &Path, threads: usize) -> Option<Walked> {
    let shared = Shared {
        work: Mutex::new(Work {
            dirs: vec![DirJob {
                parent: None,
                name: CString::default(),
                path: root.to_path_buf(),
            }],
            walkers: 1,
            idle: 0,
            done: false,
            failed: false,
        }),
        more: Condvar::new(),
        waiting: AtomicUsize::new(0),
        held: Arc::new(AtomicUsize::new(0)),
    };
    let mut parts: Vec<Walked> = Vec::new();
    let mut failed = false;
    std::thread::scope(|scope| {
        let mut helpers = Vec::new();
        for i in 1..threads.max(1) {
            // Counted before it starts, so no walker ends the walk while it is still coming.
            shared.lock().walkers += 1;
            match std::thread::Builder::new()
                .name(format!("agentdiff-gitdirs-{i}"))
                .spawn_scoped(scope, || walker(&shared, root, store))
            {
                Ok(h) => helpers.push(h),
                // Fewer threads only make the walk slower, never less complete.
                Err(_) => {
                    shared.lock().walkers -= 1;
                    shared.more.notify_all();
                }
            }
        }
        parts.push(walker(&shared, root, store));
        for h in helpers {
            match h.join() {
                Ok(part) => parts.push(part),
                Err(_) => failed = true,
            }
        }
    });
    if failed || shared.lock().failed {
        return None;
    }
    let mut all = Walked::default();
    for mut part in parts {
        all.found.append(&mut part.found);
        all.pointed.append(&mut part.pointed);
        all.unreadable.append(&mut part.unreadable);
    }
    Some(all)
}

/// Lists directories depth-first from its own stack, taking handed-over ones when it is empty,
/// until every walker is out of directories.
fn walker(shared: &Shared, root: &Path, store: &Path) -> Walked {
    let _failing = FailOnPanic(shared);
    let mut mine = Walked::default();
    let mut stack: Vec<DirJob> = Vec::new();
    let mut buf = Vec::new();
    loop {
        let Some(job) = stack.pop().or_else(|| shared.take()) else {
            return mine;
        };
        list_dir(
            job,
            root,
            store,
            &shared.held,
            &mut mine,
            &mut stack,
            &mut buf,
        );
        shared.share(&mut stack);
    }
}

/// Lists one directory: a git layout is recorded (and not descended into), `.git` entries are
/// recorded with what they point at, other directories go to `subdirs`. The types come with
/// the listing (`d_type`): an `fstatat` only where the filesystem gives none.
fn list_dir(
    job: DirJob,
    root: &Path,
    store: &Path,
    held: &Arc<AtomicUsize>,
    out: &mut Walked,
    subdirs: &mut Vec<DirJob>,
    buf: &mut Vec<u8>,
) {
    let DirJob { parent, name, path } = job;
    let opened = match &parent {
        Some(p) => dir::open_dir_at(&p.fd, &name).map_err(io::Error::from),
        None => dir::open_dir_path(&path),
    };
    drop(parent);
    let Ok(fd) = opened else {
        out.unreadable.push(path);
        return;
    };
    let (names, error) = dir::list_names(&fd, buf);
    if error.is_some() {
        out.unreadable.push(path.clone());
    }
    let entries: Vec<(CString, EntryType)> = names
        .into_iter()
        .filter_map(|Listed { name: n, kind, .. }| {
            // A name gone since the listing is left out.
            let t = kind.or_else(|| dir::listed_type_at(&fd, &n))?;
            Some((n, EntryType::of(Some(t))))
        })
        .collect();
    let layout = has_layout(|name, kind| {
        entries
            .iter()
            .any(|(n, t)| n.as_bytes() == name.as_bytes() && kind.admits_entry(*t))
    });
    if path != root && layout {
        out.pointed.push((path.join("commondir"), Found::Commondir));
        out.found.push((path, Found::Layout));
        return;
    }
    let fd = if held.fetch_add(1, Ordering::Relaxed) < HELD_DESCRIPTORS {
        Some(Arc::new(Parent {
            fd,
            held: Arc::clone(held),
        }))
    } else {
        held.fetch_sub(1, Ordering::Relaxed);
        None
    };
    for (name, kind) in entries {
        let child = path.join(OsStr::from_bytes(name.as_bytes()));
        if name.as_bytes() == b".git" {
            match kind {
                EntryType::Dir => {
                    out.pointed
                        .push((child.join("commondir"), Found::Commondir));
                    out.found.push((child, Found::DotGit));
                }
                EntryType::File => {
                    out.found.push((child.clone(), Found::DotGit));
                    out.pointed.push((child, Found::GitdirFile));
                }
                EntryType::Symlink => out.pointed.push((child, Found::Symlink)),
                EntryType::Other => {}
            }
            continue;
        }
        if kind == EntryType::Dir && child != store {
            subdirs.push(DirJob {
                parent: fd.clone(),
                name,
                path: child,
            });
        }
    }
}

/// Follow `.git` files and `commondir` files (each target's own `commondir` too).
fn follow_pointers(root: &Path, mut pointed: Vec<(PathBuf, Found)>, out: &mut GitDirs) {
    while let Some((file, found)) = pointed.pop() {
        let target = match found {
            Found::GitdirFile => gitdir_target(&file),
            Found::Symlink => Ok(Some(file.clone())),
            _ => commondir_target(&file),
        };
        let target = match target {
            Ok(Some(t)) => t,
            Ok(None) => continue,
            Err(e) => {
                out.ignored.push(format!("{}: {e}", file.display()));
                continue;
            }
        };
        let what = match found {
            Found::GitdirFile => "gitdir",
            Found::Symlink => "symlink",
            _ => "commondir",
        };
        match accept_target(root, &target, what) {
            Ok(dir) => {
                if out.push(dir.clone(), found) {
                    pointed.push((dir.join("commondir"), Found::Commondir));
                }
            }
            Err(why) => out.ignored.push(format!("{}: {why}", file.display())),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn git_layout(dir: &Path) {
        fs::create_dir_all(dir.join("refs")).unwrap();
        fs::create_dir_all(dir.join("objects")).unwrap();
        fs::write(dir.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    }

    fn paths(d: &GitDirs) -> Vec<PathBuf> {
        d.dirs.iter().map(|g| g.path.clone()).collect()
    }

    #[test]
    fn separate_git_dir_worktree_and_outside_gitdir_are_found() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        git_layout(&root.join(".repo"));
        fs::write(root.join(".git"), "gitdir: .repo\n").unwrap();
        // A worktree's git dir, whose commondir names the shared one outside the root.
        let wt = outside.path().canonicalize().unwrap().join("wt");
        fs::create_dir_all(wt.join("refs")).unwrap();
        fs::write(wt.join("HEAD"), "x\n").unwrap();
        let common = outside.path().canonicalize().unwrap().join("common");
        git_layout(&common);
        fs::write(wt.join("commondir"), "../common\n").unwrap();
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("sub/.git"), format!("gitdir: {}\n", wt.display())).unwrap();
        // A bare repository with another name.
        git_layout(&root.join("vendor/thing.bare"));
        let found = paths(&discover(&root));
        for p in [
            root.join(".git"),
            root.join(".repo"),
            root.join("sub/.git"),
            wt.clone(),
            common.clone(),
            root.join("vendor/thing.bare"),
        ] {
            assert!(found.contains(&p), "{p:?} not in {found:?}");
        }
    }

    #[test]
    fn a_layout_made_of_symlinks_is_a_git_directory_and_a_partial_one_is_not() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        let links = root.join("links");
        fs::create_dir_all(root.join("store/refs/heads")).unwrap();
        fs::create_dir_all(root.join("store/objects")).unwrap();
        fs::create_dir_all(&links).unwrap();
        std::os::unix::fs::symlink("refs/heads/main", links.join("HEAD")).unwrap();
        std::os::unix::fs::symlink("../store/refs", links.join("refs")).unwrap();
        std::os::unix::fs::symlink("../store/objects", links.join("objects")).unwrap();
        fs::create_dir_all(root.join("partial/refs")).unwrap();
        fs::write(root.join("partial/HEAD"), "x\n").unwrap();
        fs::create_dir_all(root.join("partial/objects.bak")).unwrap();
        let found = paths(&discover(&root));
        assert!(found.contains(&links), "{found:?}");
        assert!(!found.contains(&root.join("partial")), "{found:?}");
        assert!(has_git_layout(&links));
    }

    /// A chain of `depth` directories below `root` where every level also has a leaf directory
    /// listed after the chain's next level (so the walk, depth-first, still has it to list when
    /// it goes down), and a git directory at the bottom. The bottom's path.
    fn deep_tree_with_a_sibling_left_at_every_level(root: &Path, depth: usize) -> PathBuf {
        let mut dir = root.to_path_buf();
        for level in 0..depth {
            fs::create_dir(dir.join("leaf")).unwrap();
            // The walk pushes in listing order and pops the last: find a name listed last.
            let next = (0..200)
                .map(|i| dir.join(format!("c{level}-{i}")))
                .find(|c| {
                    fs::create_dir(c).unwrap();
                    let order: Vec<_> = fs::read_dir(&dir)
                        .unwrap()
                        .map(|e| e.unwrap().path())
                        .collect();
                    let last = order.last() == Some(c);
                    if !last {
                        fs::remove_dir(c).unwrap();
                    }
                    last
                })
                .unwrap();
            dir = next;
        }
        git_layout(&dir.join(".git"));
        dir.join(".git")
    }

    /// Run by `a_deep_tree_does_not_run_the_walk_out_of_descriptors` in a process of its own,
    /// whose descriptor limit it lowers.
    #[test]
    #[ignore = "run in a process of its own by a_deep_tree_does_not_run_the_walk_out_of_descriptors"]
    fn deep_tree_walk_under_a_low_descriptor_limit() {
        let limit = libc::rlimit {
            rlim_cur: (HELD_DESCRIPTORS + 36) as libc::rlim_t,
            rlim_max: (HELD_DESCRIPTORS + 36) as libc::rlim_t,
        };
        // SAFETY: setrlimit with a valid struct; this process runs this one test only.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        let bottom = deep_tree_with_a_sibling_left_at_every_level(&root, 3 * HELD_DESCRIPTORS);
        let found = discover_with(&root, 1);
        assert!(
            found.unreadable.is_empty(),
            "{:?}",
            found.unreadable.first()
        );
        assert!(paths(&found).contains(&bottom), "{:?}", found.dirs);
    }

    #[test]
    fn a_deep_tree_does_not_run_the_walk_out_of_descriptors() {
        agentdiff_test_support::run_ignored_in_own_process(
            "git_dirs::tests::deep_tree_walk_under_a_low_descriptor_limit",
            &[],
        );
    }

    #[test]
    fn the_result_does_not_depend_on_the_number_of_walkers() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        for i in 0..40 {
            let dir = root.join(format!("d{i}/e{}/f", i % 7));
            fs::create_dir_all(&dir).unwrap();
            match i % 5 {
                0 => git_layout(&dir.join(".git")),
                1 => git_layout(&dir.join(format!("bare{i}"))),
                2 => fs::write(dir.join(".git"), "gitdir: ../../../d0/e0/f/.git\n").unwrap(),
                3 => fs::write(dir.join(".git"), "gitdir: /nowhere\n").unwrap(),
                _ => {}
            }
        }
        fs::create_dir_all(root.join(".agentdiff/runs")).unwrap();
        git_layout(&root.join(".agentdiff/runs/not-searched"));
        let one = discover_with(&root, 1);
        assert_eq!(one.dirs.len(), 8 * 4, "{:?}", one.dirs);
        assert_eq!(one.ignored.len(), 8, "{:?}", one.ignored);
        assert!(!paths(&one)
            .iter()
            .any(|p| p.starts_with(root.join(".agentdiff"))));
        for threads in [2, 3, 4, 8] {
            assert_eq!(discover_with(&root, threads), one, "{threads} walkers");
        }
    }

    #[test]
    fn a_pointer_to_a_non_git_directory_or_above_the_root_is_ignored() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap().join("p");
        fs::create_dir_all(root.join("a")).unwrap();
        let plain = tempfile::tempdir().unwrap();
        fs::write(
            root.join("a/.git"),
            format!("gitdir: {}\n", plain.path().display()),
        )
        .unwrap();
        fs::create_dir_all(root.join("b")).unwrap();
        fs::write(root.join("b/.git"), "gitdir: ../..\n").unwrap();
        fs::create_dir_all(root.join("c")).unwrap();
        fs::write(root.join("c/.git"), "gitdir: /proc/self/cwd\n").unwrap();
        // The root itself made to look like a git directory is not accepted as a target.
        git_layout(&root);
        fs::create_dir_all(root.join("d")).unwrap();
        fs::write(root.join("d/.git"), "gitdir: ..\n").unwrap();
        let d = discover(&root);
        let found = paths(&d);
        assert!(!found.contains(&plain.path().canonicalize().unwrap()));
        assert!(!found.iter().any(|p| root.starts_with(p)), "{found:?}");
        assert_eq!(d.ignored.len(), 4, "{:?}", d.ignored);
    }
}
