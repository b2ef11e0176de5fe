//! Regular files with more than one hard link below a set of paths.
//!
//! A read-only bind mount protects a path, not the file behind it: a file that also has a name in
//! a writable place (`src/alias` made with `ln .claude/settings.json src/alias` by an earlier,
//! unsandboxed command) is written through that name whatever covers the protected one. A sandbox
//! cannot make the link itself during its run (`link(2)` across mounts fails with `EXDEV`), so
//! what matters is what exists when it starts: [`find`] lists it, for the transaction to refuse
//! the launch.
//!
//! Invariants: no symlink is followed (a symlinked directory is not entered, a symlinked path is
//! not a file); a directory `skip` accepts ([`object_stores`]: a git directory's `objects/`, as a
//! local clone hard-links its objects to the repository it was cloned from) is not entered; the walk stops
//! after [`MAX_ENTRIES`] entries and says so instead of claiming the rest was checked.
//!
//! Not defended: a link made after the walk by another process while the sandbox is being set up
//! (the command itself has not started).

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The most entries one walk looks at.
pub const MAX_ENTRIES: usize = 50_000;

/// What the walk found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Found {
    /// Each multiply-linked regular file and its link count, in walk order.
    pub linked: Vec<(PathBuf, u64)>,
    /// The walk stopped at [`MAX_ENTRIES`]: paths after that were not looked at.
    pub truncated: bool,
}

/// Multiply-linked regular files at or below each of `paths` (missing paths are skipped), not
/// entering a directory `skip` accepts.
pub fn find(paths: &[PathBuf], skip: &dyn Fn(&Path) -> bool) -> Found {
    let mut found = Found::default();
    let mut seen = 0usize;
    let mut stack: Vec<PathBuf> = paths.iter().rev().cloned().collect();
    while let Some(path) = stack.pop() {
        seen += 1;
        if seen > MAX_ENTRIES {
            found.truncated = true;
            break;
        }
        let Ok(meta) = fs::symlink_metadata(&path) else {
            continue; // gone or unreadable: nothing a write could reach through it now
        };
        if meta.file_type().is_file() && meta.nlink() > 1 {
            found.linked.push((path, meta.nlink()));
        } else if meta.is_dir() && !skip(&path) {
            match children(&path) {
                Ok(mut names) => {
                    names.sort();
                    stack.extend(names.into_iter().rev());
                }
                Err(_) => continue, // the command cannot list it either (same user)
            }
        }
    }
    found
}

fn children(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::read_dir(dir)?.map(|e| e.map(|e| e.path())).collect()
}

/// `skip` for [`find`]: a git directory's object store (`GITDIR/objects`), for each of
/// `git_dirs`.
pub fn object_stores(git_dirs: &[PathBuf]) -> impl Fn(&Path) -> bool + '_ {
    move |p: &Path| {
        p.file_name().is_some_and(|n| n == "objects")
            && p.parent()
                .is_some_and(|parent| git_dirs.iter().any(|g| g == parent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_linked_file_below_a_directory_and_a_linked_file_itself() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join(".claude")).unwrap();
        fs::write(root.join(".claude/settings.json"), "{}").unwrap();
        fs::write(root.join("agentdiff.yaml"), "version: 1").unwrap();
        fs::write(root.join(".claude/plain.json"), "{}").unwrap();
        fs::create_dir_all(root.join("src")).unwrap();
        fs::hard_link(root.join(".claude/settings.json"), root.join("src/a")).unwrap();
        fs::hard_link(root.join("agentdiff.yaml"), root.join("src/b")).unwrap();
        let found = find(
            &[
                root.join(".claude"),
                root.join("agentdiff.yaml"),
                root.join("missing"),
            ],
            &|_| false,
        );
        assert_eq!(
            found.linked,
            vec![
                (root.join(".claude/settings.json"), 2),
                (root.join("agentdiff.yaml"), 2)
            ]
        );
        assert!(!found.truncated);
    }

    #[test]
    fn symlinks_are_not_followed_and_object_stores_are_skipped() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("elsewhere")).unwrap();
        fs::write(root.join("elsewhere/f"), "x").unwrap();
        fs::hard_link(root.join("elsewhere/f"), root.join("elsewhere/g")).unwrap();
        fs::create_dir_all(root.join(".git/objects/ab")).unwrap();
        fs::hard_link(root.join("elsewhere/f"), root.join(".git/objects/ab/cd")).unwrap();
        fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere"), root.join(".git/hooks/dir")).unwrap();
        std::os::unix::fs::symlink(root.join("elsewhere/f"), root.join(".git/hooks/file")).unwrap();
        let git = [root.join(".git")];
        let found = find(&[root.join(".git")], &object_stores(&git));
        assert!(found.linked.is_empty(), "{found:?}");
        // Without the skip, the object is found.
        let found = find(&[root.join(".git")], &|_| false);
        assert_eq!(found.linked, vec![(root.join(".git/objects/ab/cd"), 3)]);
    }
}
