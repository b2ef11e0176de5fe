//! Private workspaces for backends whose command must never see the host tree.
//!
//! [`materialize`] rebuilds the captured before-state — not the live tree — from the run's
//! before-manifest and the verified objects in the object store, so the command sees exactly what
//! the evidence says it saw:
//!
//! ```text
//! ROOT/.agentdiff/workspaces/            0700, owned by the invoking user, never a symlink
//! └── <run-id>/                          0700: the workspace (mounted at /workspace)
//! ```
//!
//! - Directories are created with their recorded modes (applied deepest first, after their
//!   children were written, so a 0555 directory can still be filled).
//! - Regular files are streamed from their objects and their SHA-256 is re-checked while copying
//!   (`ObjectStore::copy_verified_to`); a missing or corrupt object fails the whole workspace.
//!   Their recorded mode (without setuid/setgid, which a private copy has no use for) and mtime
//!   are applied.
//! - Symlinks are re-created as symlinks with their recorded targets. They are part of the
//!   project, and nothing on the host follows them: the after-scan uses `lstat`, the hand-over to
//!   the container user uses `lchown`, and promote never changes symlinks. Inside the container
//!   an absolute or `..` target resolves in the container's own filesystem, not the host's.
//! - A regular file without a verified backup (hardlinked, too large, changed during capture)
//!   cannot be copied faithfully; materialising refuses rather than leave it out, because a
//!   missing file would look deleted and promote would delete it on the host.
//! - Paths the scan excluded (`.agentdiff`, default generated directories, `.agentdiffignore`)
//!   or could not capture are absent from the workspace, exactly as they are absent from the
//!   evidence.
//!
//! Copies, not hardlinks into the object store: a hardlinked object would be writable through the
//! workspace (and handed to the container user), so the content-addressed store could be
//! corrupted by the command. Overlay mounts need privileges the engine does not have here and a
//! lower layer shaped like the tree. Copying is parallel and verified; see
//! `examples/materialize_bench.rs` for its cost against `cp -a`.
//!
//! The workspace is written only by agentdiff before the launch (nothing else can enter the 0700
//! parent), so creating entries by path below it cannot be redirected: every parent of an entry is
//! a directory created here, never a symlink.
//!
//! Lifetime: the workspace lives until the after-scan has stored the after-state in the object
//! store (promote needs only those objects); the transaction then calls [`discard`]. A run that
//! crashed leaves it behind, and `agentdiff cleanup RUN` removes it with [`discard`].

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use agentdiff_scan::{unsupported_kind, BackupState, Entry, EntryKind, Manifest};
use agentdiff_store::{Capsule, ObjectStore, RunId, Store, StoreError};

/// Directory below `ROOT/.agentdiff` holding one workspace per run.
pub const WORKSPACES_DIR_NAME: &str = "workspaces";

/// Permission bits a workspace entry may keep: setuid/setgid are dropped from private copies.
const KEPT_MODE_BITS: u32 = 0o1777;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("could not {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a safe workspace directory: {reason}; remove it and run again")]
    Unsafe { path: PathBuf, reason: String },
    #[error("the workspace {0} already exists; a run's workspace is created once (remove it with `agentdiff cleanup`)")]
    Exists(PathBuf),
    #[error(
        "the workspace cannot be an exact copy of the captured tree: {count} regular file(s) have no verified backup (e.g. {examples}); \
         hardlinked, oversized or changing files cannot be copied faithfully — exclude them with .agentdiffignore, break the hard link, or use an in-place runtime"
    )]
    Incomplete { count: usize, examples: String },
    #[error("recorded path {path:?} cannot be materialised: {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("backup object for {path} could not be copied: {source}")]
    Object {
        path: String,
        #[source]
        source: StoreError,
    },
    #[error("run id {0:?} is not valid")]
    RunId(String),
    #[error("private workspaces need POSIX file calls, which this platform lacks")]
    UnsupportedPlatform,
}

fn io_err<'p>(
    action: &'static str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> WorkspaceError + 'p {
    move |source| WorkspaceError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// What materialising did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct MaterializeStats {
    pub directories: u64,
    pub files: u64,
    pub symlinks: u64,
    pub bytes: u64,
    pub threads: usize,
    pub duration_ms: u64,
}

/// `ROOT/.agentdiff/workspaces/<run-id>`.
pub fn workspace_dir(store: &Store, run_id: &RunId) -> PathBuf {
    store.dir().join(WORKSPACES_DIR_NAME).join(run_id.as_str())
}

/// Materialise `before` (the run's before-manifest) into the run's private workspace and return
/// its path. Fails closed: on any error nothing is left behind.
pub fn materialize(
    store: &Store,
    capsule: &Capsule,
    before: &Manifest,
) -> Result<PathBuf, WorkspaceError> {
    let base = store.dir().join(WORKSPACES_DIR_NAME);
    ensure_private_base(&base)?;
    let dest = workspace_dir(store, capsule.id());
    materialize_into(store.objects(), before, &dest, 0)?;
    Ok(dest)
}

/// Materialise `before` into `dest`, which must not exist (it is created 0700). `threads` = 0
/// uses every core. Public for embedders and the benchmark.
pub fn materialize_into(
    objects: &ObjectStore,
    before: &Manifest,
    dest: &Path,
    threads: usize,
) -> Result<MaterializeStats, WorkspaceError> {
    #[cfg(unix)]
    {
        let started = Instant::now();
        create_private_dir(dest)?;
        match fill(objects, before, dest, threads) {
            Ok(mut stats) => {
                stats.duration_ms = duration_ms(started.elapsed());
                Ok(stats)
            }
            Err(e) => {
                // Fail closed: never leave a partial workspace that could be mistaken for a copy.
                let _ = std::fs::remove_dir_all(dest);
                Err(e)
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (objects, before, dest, threads);
        Err(WorkspaceError::UnsupportedPlatform)
    }
}

/// Remove a run's workspace. Returns whether there was one.
pub fn discard(store: &Store, run_id: &RunId) -> Result<bool, WorkspaceError> {
    let dir = workspace_dir(store, run_id);
    match std::fs::symlink_metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("inspect", &dir)(e)),
        Ok(meta) if !meta.is_dir() => Err(WorkspaceError::Unsafe {
            path: dir,
            reason: "it is not a directory".into(),
        }),
        Ok(_) => {
            // remove_dir_all never follows symlinks below the directory.
            std::fs::remove_dir_all(&dir).map_err(io_err("remove", &dir))?;
            Ok(true)
        }
    }
}

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The workspaces directory: a real directory, 0700, owned by the current user.
fn ensure_private_base(base: &Path) -> Result<(), WorkspaceError> {
    match std::fs::symlink_metadata(base) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            create_private_dir(base).or_else(|e| match e {
                // Created concurrently by another run: check what is there.
                WorkspaceError::Exists(_) => Ok(()),
                other => Err(other),
            })?;
        }
        Err(e) => return Err(io_err("inspect", base)(e)),
        Ok(_) => {}
    }
    let meta = std::fs::symlink_metadata(base).map_err(io_err("inspect", base))?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(WorkspaceError::Unsafe {
            path: base.to_path_buf(),
            reason: "it is not a real directory".into(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let euid = nix::unistd::geteuid().as_raw();
        if meta.uid() != euid {
            return Err(WorkspaceError::Unsafe {
                path: base.to_path_buf(),
                reason: format!("it is owned by uid {}, not by uid {euid}", meta.uid()),
            });
        }
        if meta.mode() & 0o077 != 0 {
            return Err(WorkspaceError::Unsafe {
                path: base.to_path_buf(),
                reason: format!(
                    "its mode {:o} lets other users in (expected 0700)",
                    meta.mode() & 0o7777
                ),
            });
        }
    }
    Ok(())
}

fn create_private_dir(path: &Path) -> Result<(), WorkspaceError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        match std::fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(WorkspaceError::Exists(path.to_path_buf()))
            }
            Err(e) => Err(io_err("create", path)(e)),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Err(WorkspaceError::UnsupportedPlatform)
    }
}

/// Checks every entry and splits the manifest into the three kinds, parents first.
struct Layout<'m> {
    dirs: Vec<(&'m str, &'m Entry)>,
    files: Vec<(&'m str, &'m Entry, &'m str)>,
    links: Vec<(&'m str, &'m str)>,
}

fn layout(before: &Manifest) -> Result<Layout<'_>, WorkspaceError> {
    let invalid = |path: &str, reason: &str| WorkspaceError::InvalidPath {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    let bad_link_targets: BTreeSet<&str> = before
        .unsupported
        .iter()
        .filter(|u| u.kind == unsupported_kind::NON_UTF8_SYMLINK_TARGET)
        .map(|u| u.path.as_str())
        .collect();
    let mut dirs = Vec::new();
    let mut files = Vec::new();
    let mut links = Vec::new();
    let mut missing = Vec::new();
    // BTreeMap order puts every directory before the paths below it.
    let mut dir_set: BTreeSet<&str> = BTreeSet::new();
    for (path, entry) in &before.entries {
        agentdiff_scan::validate_recorded_path(path).map_err(|r| invalid(path, r))?;
        if let Some((parent, _)) = path.rsplit_once('/') {
            if !dir_set.contains(parent) {
                return Err(invalid(
                    path,
                    "its parent is not a recorded directory (a symlink or a missing entry)",
                ));
            }
        }
        match entry.kind {
            EntryKind::Directory => {
                dir_set.insert(path);
                dirs.push((path.as_str(), entry));
            }
            EntryKind::File => match (&entry.sha256, &entry.backup) {
                (Some(sha), BackupState::Stored) => {
                    files.push((path.as_str(), entry, sha.as_str()))
                }
                _ => missing.push(path.as_str()),
            },
            EntryKind::Symlink => {
                let Some(target) = entry.symlink_target.as_deref() else {
                    return Err(invalid(path, "the symlink's target was not recorded"));
                };
                if bad_link_targets.contains(path.as_str()) {
                    return Err(invalid(
                        path,
                        "the symlink's target is not UTF-8 and was recorded escaped, so it cannot be re-created exactly",
                    ));
                }
                links.push((path.as_str(), target));
            }
        }
    }
    if !missing.is_empty() {
        let examples: Vec<&str> = missing.iter().take(5).copied().collect();
        return Err(WorkspaceError::Incomplete {
            count: missing.len(),
            examples: examples.join(", "),
        });
    }
    Ok(Layout { dirs, files, links })
}

#[cfg(unix)]
fn fill(
    objects: &ObjectStore,
    before: &Manifest,
    dest: &Path,
    threads: usize,
) -> Result<MaterializeStats, WorkspaceError> {
    use std::os::unix::fs::DirBuilderExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;

    let plan = layout(before)?;
    let mut stats = MaterializeStats::default();
    for (path, _) in &plan.dirs {
        let p = dest.join(path);
        // Owner-writable while filling; the recorded mode is applied at the end.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&p)
            .map_err(io_err("create directory", &p))?;
        stats.directories += 1;
    }
    for (path, target) in &plan.links {
        let p = dest.join(path);
        std::os::unix::fs::symlink(target, &p).map_err(io_err("create symlink", &p))?;
        stats.symlinks += 1;
    }

    let threads = if threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    } else {
        threads
    }
    .clamp(1, 64)
    .min(plan.files.len().max(1));
    stats.threads = threads;
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<WorkspaceError>> = Mutex::new(None);
    let bytes = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if first_error.lock().map(|g| g.is_some()).unwrap_or(true) {
                    return;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((path, entry, sha)) = plan.files.get(i) else {
                    return;
                };
                match write_file(objects, dest, path, entry, sha) {
                    Ok(n) => {
                        bytes.fetch_add(n, Ordering::Relaxed);
                    }
                    Err(e) => {
                        if let Ok(mut g) = first_error.lock() {
                            g.get_or_insert(e);
                        }
                        return;
                    }
                }
            });
        }
    });
    match first_error.into_inner() {
        Ok(None) => {}
        Ok(Some(e)) => return Err(e),
        Err(_) => {
            return Err(WorkspaceError::Io {
                action: "copy files into",
                path: dest.to_path_buf(),
                source: io::Error::other("a copy thread panicked"),
            })
        }
    }
    stats.files = plan.files.len() as u64;
    stats.bytes = bytes.into_inner();

    // Recorded directory modes, deepest first so a read-only parent is closed last.
    for (path, entry) in plan.dirs.iter().rev() {
        let p = dest.join(path);
        set_mode(&p, entry.mode & KEPT_MODE_BITS)?;
    }
    Ok(stats)
}

#[cfg(unix)]
fn set_mode(p: &Path, mode: u32) -> Result<(), WorkspaceError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(io_err("chmod", p))
}

#[cfg(unix)]
fn write_file(
    objects: &ObjectStore,
    dest: &Path,
    path: &str,
    entry: &Entry,
    sha: &str,
) -> Result<u64, WorkspaceError> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let p = dest.join(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&p)
        .map_err(io_err("create", &p))?;
    let n = objects
        .copy_verified_to(sha, &mut file)
        .map_err(|source| WorkspaceError::Object {
            path: path.to_string(),
            source,
        })?;
    if n != entry.size {
        return Err(WorkspaceError::Object {
            path: path.to_string(),
            source: StoreError::ObjectCorrupt {
                hex: sha.to_string(),
                actual: format!("{n} bytes instead of {}", entry.size),
            },
        });
    }
    file.set_permissions(std::fs::Permissions::from_mode(entry.mode & KEPT_MODE_BITS))
        .map_err(io_err("chmod", &p))?;
    if let Some(mtime) = system_time(entry.mtime_ns) {
        file.set_modified(mtime)
            .map_err(io_err("set the mtime of", &p))?;
    }
    Ok(n)
}

fn system_time(ns: i64) -> Option<std::time::SystemTime> {
    let ns = u64::try_from(ns).ok()?;
    std::time::UNIX_EPOCH.checked_add(Duration::from_nanos(ns))
}

#[cfg(all(test, unix))]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use agentdiff_scan::{scan, BackupRequest, ScanOptions};

    fn captured(root: &Path, store: &Store) -> Manifest {
        let mut opts = ScanOptions::new();
        opts.backup = Some(BackupRequest {
            sink: store.objects(),
            max_file_bytes: agentdiff_scan::DEFAULT_MAX_HASH_BYTES,
        });
        scan(root, &opts).unwrap()
    }

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("p");
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::write(root.join("README"), b"hello\n").unwrap();
        std::fs::write(root.join("src/main.rs"), b"fn main() {}\n").unwrap();
        std::fs::write(root.join("src/deep/run.sh"), b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(
            root.join("src/deep/run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        std::fs::write(root.join("empty"), b"").unwrap();
        std::os::unix::fs::symlink("../README", root.join("src/readme-link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("abs-link")).unwrap();
        std::fs::create_dir(root.join("ro")).unwrap();
        std::fs::write(root.join("ro/f"), b"r").unwrap();
        std::fs::set_permissions(root.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
        (d, root)
    }

    #[test]
    fn materialises_the_captured_tree_exactly() {
        let (_d, root) = tree();
        let store = Store::open(&root).unwrap();
        let before = captured(&root, &store);
        let capsule = store.create_run(None).unwrap();
        // The live tree changes after the capture: the workspace must still show the capture.
        std::fs::write(root.join("README"), b"edited later\n").unwrap();
        let ws = materialize(&store, &capsule, &before).unwrap();
        assert_eq!(
            ws,
            root.join(".agentdiff/workspaces")
                .join(capsule.id().as_str())
        );
        assert_eq!(std::fs::metadata(&ws).unwrap().mode() & 0o7777, 0o700);
        let base = std::fs::metadata(root.join(".agentdiff/workspaces")).unwrap();
        assert_eq!(base.mode() & 0o7777, 0o700);
        assert_eq!(std::fs::read(ws.join("README")).unwrap(), b"hello\n");
        assert_eq!(
            std::fs::read_link(ws.join("src/readme-link")).unwrap(),
            PathBuf::from("../README")
        );
        assert_eq!(
            std::fs::read_link(ws.join("abs-link")).unwrap(),
            PathBuf::from("/etc/passwd")
        );
        // A scan of the workspace equals the before-manifest in kind, content and mode.
        let again = scan(&ws, &ScanOptions::new()).unwrap();
        assert_eq!(again.entries.len(), before.entries.len());
        for (p, e) in &before.entries {
            let a = &again.entries[p];
            assert_eq!(
                (a.kind, &a.sha256, a.mode, &a.symlink_target),
                (e.kind, &e.sha256, e.mode, &e.symlink_target),
                "{p}"
            );
            if e.kind == EntryKind::File {
                assert_eq!(a.mtime_ns, e.mtime_ns, "{p}");
            }
        }
        assert!(agentdiff_scan::diff(&before, &again).is_empty());
        // A second materialisation of the same run is refused.
        assert!(matches!(
            materialize(&store, &capsule, &before),
            Err(WorkspaceError::Exists(_))
        ));
        assert!(discard(&store, capsule.id()).unwrap());
        assert!(!ws.exists());
        assert!(!discard(&store, capsule.id()).unwrap());
        std::fs::set_permissions(root.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn a_corrupt_object_fails_closed_and_leaves_nothing() {
        let (_d, root) = tree();
        let store = Store::open(&root).unwrap();
        let before = captured(&root, &store);
        let sha = before.entries["src/main.rs"].sha256.clone().unwrap();
        let obj = store.objects().object_path(&sha).unwrap();
        let mut perms = std::fs::metadata(&obj).unwrap().permissions();
        perms.set_mode(0o600);
        std::fs::set_permissions(&obj, perms).unwrap();
        std::fs::write(&obj, b"fn evil() {}\n").unwrap();
        let capsule = store.create_run(None).unwrap();
        match materialize(&store, &capsule, &before) {
            Err(WorkspaceError::Object { path, .. }) => assert_eq!(path, "src/main.rs"),
            other => panic!("expected a corrupt-object error, got {other:?}"),
        }
        assert!(!workspace_dir(&store, capsule.id()).exists());
        std::fs::set_permissions(root.join("ro"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn files_without_backups_refuse_the_workspace() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("p");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("a"), b"x").unwrap();
        std::fs::hard_link(root.join("a"), root.join("b")).unwrap();
        let store = Store::open(&root).unwrap();
        let before = captured(&root, &store);
        let capsule = store.create_run(None).unwrap();
        assert!(matches!(
            materialize(&store, &capsule, &before),
            Err(WorkspaceError::Incomplete { count: 2, .. })
        ));
        assert!(!workspace_dir(&store, capsule.id()).exists());
    }

    #[test]
    fn adversarial_manifests_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("p");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(root.join("f"), b"x").unwrap();
        std::os::unix::fs::symlink("/tmp", root.join("l")).unwrap();
        let store = Store::open(&root).unwrap();
        let before = captured(&root, &store);
        let file = before.entries["f"].clone();
        for bad in [
            "../escape",
            "/abs",
            "a//b",
            "l/through-link",
            "missing-parent/x",
            ".agentdiff/x",
        ] {
            let mut m = before.clone();
            m.entries.insert(bad.to_string(), file.clone());
            let dest = d.path().join(format!("ws-{}", bad.len()));
            let res = materialize_into(store.objects(), &m, &dest, 1);
            assert!(
                matches!(res, Err(WorkspaceError::InvalidPath { .. })),
                "{bad}: {res:?}"
            );
            assert!(!dest.exists());
        }
        assert!(!d.path().join("escape").exists());
    }

    #[test]
    fn an_unsafe_workspaces_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("p");
        std::fs::create_dir(&root).unwrap();
        let store = Store::open(&root).unwrap();
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, root.join(".agentdiff/workspaces")).unwrap();
        let before = captured(&root, &store);
        let capsule = store.create_run(None).unwrap();
        assert!(matches!(
            materialize(&store, &capsule, &before),
            Err(WorkspaceError::Unsafe { .. })
        ));
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }
}
