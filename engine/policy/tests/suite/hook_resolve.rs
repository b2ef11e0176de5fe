//! The hook's path resolution against the kernel: for random trees of directories, files and
//! symlinks (relative, absolute, dangling, looping, climbing with `..`), the path the hook
//! resolves is the path the kernel opens, read back from `/proc/self/fd` after a real open.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, OpenOptionsExt};
use std::path::{Path, PathBuf};

use agentdiff_policy::hook::{resolve, ResolveError};
use proptest::prelude::*;

/// Names a tree entry may have: top level and one level down.
const ENTRIES: [&str; 7] = ["a", "b", "c", "a/x", "a/y", "b/x", "c/x"];
/// Symlink targets; `ROOT` is replaced by the scratch root.
const TARGETS: [&str; 17] = [
    ".",
    "..",
    "a",
    "b",
    "a/x",
    "../a",
    "../..",
    "x/../..",
    "../b/x",
    "ROOT/a",
    "ROOT/b/x",
    "ROOT/a/..",
    "nowhere",
    "a/../b",
    "c",
    "x",
    "../c/x",
];
/// Path segments of the resolved path.
const SEGMENTS: [&str; 9] = ["a", "b", "c", "x", "y", "..", ".", "nowhere", ""];

#[derive(Debug, Clone)]
enum Kind {
    Absent,
    Dir,
    File,
    Link(usize),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        1 => Just(Kind::Absent),
        3 => Just(Kind::Dir),
        1 => Just(Kind::File),
        4 => (0..TARGETS.len()).prop_map(Kind::Link),
    ]
}

fn build(root: &Path, kinds: &[Kind]) {
    for (name, kind) in ENTRIES.iter().zip(kinds) {
        let path = root.join(name);
        // A nested entry needs a real directory above it.
        if !path
            .parent()
            .is_some_and(|p| p.symlink_metadata().is_ok_and(|m| m.is_dir()))
        {
            continue;
        }
        match kind {
            Kind::Absent => {}
            Kind::Dir => std::fs::create_dir(&path).unwrap(),
            Kind::File => std::fs::write(&path, name).unwrap(),
            Kind::Link(i) => {
                let target = TARGETS[*i].replace("ROOT", &root.to_string_lossy());
                symlink(target, &path).unwrap();
            }
        }
    }
}

fn fd_path(file: &std::fs::File) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap()
}

/// What the kernel opens for `path` (relative to `root`): `Ok(path)` or the error kind/errno.
fn kernel_open(root: &Path, path: &str) -> Result<PathBuf, i32> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(root.join(path))
        .map(|f| fd_path(&f))
        .map_err(|e| e.raw_os_error().unwrap_or(0))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_hook_resolves_where_the_kernel_opens(
        kinds in proptest::collection::vec(kind(), ENTRIES.len()),
        segments in proptest::collection::vec(proptest::sample::select(&SEGMENTS[..]), 1..8),
        absolute in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        // The scratch root sits deep enough that no generated path climbs out of the
        // temporary directory, where this test creates files.
        let top = std::fs::canonicalize(dir.path()).unwrap();
        let root = top.join("1/2/3/4/5/6/7/8/root");
        std::fs::create_dir_all(&root).unwrap();
        build(&root, &kinds);
        // Relative to the scratch root (a leading `/` would leave it).
        let mut rel = segments.join("/").trim_start_matches('/').to_owned();
        if rel.is_empty() {
            rel = ".".to_owned();
        }
        let given = if absolute { format!("{}/{rel}", root.display()) } else { rel.clone() };
        let ours = resolve(&root, Path::new(&given));
        match kernel_open(&root, &rel) {
            Ok(opened) => {
                let ours = ours.unwrap_or_else(|e| panic!("{given}: kernel opened {opened:?}, hook: {e}"));
                prop_assert_eq!(&ours.target, &opened, "{}", given);
                prop_assert!(ours.file.is_some(), "{}: exists for the kernel", given);
            }
            Err(errno) if errno == libc::ELOOP => {
                prop_assert_eq!(ours, Err(ResolveError::Loop), "{}", given);
            }
            Err(errno) if errno == libc::ENOENT => {
                let Ok(ours) = ours else {
                    // ENOTDIR-like failures are reported by both; nothing more to compare.
                    return Ok(());
                };
                // The hook takes a missing component as a directory the tool creates
                // (`mkdir -p`), so a later `..` climbs out of it where the kernel, without
                // that directory, stops. Otherwise the hook must agree the target is missing.
                let climbs = rel.contains("..")
                    || kinds.iter().any(|k| matches!(k, Kind::Link(i) if TARGETS[*i].contains("..")));
                prop_assert!(ours.file.is_none() || climbs, "{}: {:?}", given, ours);
                if ours.file.is_none() && ours.target.starts_with(&top) {
                    // Create it as a writing tool would (following a dangling final symlink):
                    // the kernel must create exactly the hook's target.
                    match OpenOptions::new().write(true).create(true).truncate(false).open(root.join(&rel)) {
                        Ok(created) => {
                            prop_assert_eq!(&ours.target, &fd_path(&created), "{}", given);
                        }
                        Err(e) => prop_assert!(
                            matches!(e.kind(), ErrorKind::NotFound | ErrorKind::IsADirectory)
                                || e.raw_os_error() == Some(libc::ENOTDIR)
                                || e.raw_os_error() == Some(libc::EISDIR),
                            "{}: {}", given, e
                        ),
                    }
                }
            }
            Err(errno) => {
                prop_assert!(ours.is_err() || errno == libc::ENOTDIR, "{}: errno {}, hook {:?}", given, errno, ours);
            }
        }
    }
}
