//! Which directory is the project root, found the way git finds a repository.
//!
//! Without an explicit root, the walk goes up from the current directory to the nearest
//! directory holding a store (`.agentdiff/`) or a policy (`agentdiff.yaml`); when there is none,
//! to the nearest version-control root (`.git`, `.hg`, `.jj`); when there is none either, the
//! current directory is the root, so a first run in a plain folder keeps working.
//!
//! An in-place command started from a subdirectory still works in that subdirectory
//! ([`invocation_dir`]); only the observed tree grows to the project.
//!
//! `$HOME` and `/` are never chosen implicitly: a run there would capture and back up everything
//! below them. The walk passes over them, and a current directory that is one of them is refused
//! unless the root is named explicitly.
//!
//! Not defended: a marker planted higher up by someone who can write there moves the root up;
//! the chosen root is printed whenever it is not the current directory, so this is visible.

use std::path::{Path, PathBuf};

/// Directory names that mark a project already used with agentdiff.
const STORE_MARKER: &str = agentdiff_store::STORE_DIR_NAME;
/// Version-control metadata that marks a project root (file or directory: a git worktree or
/// submodule has a `.git` file).
const VCS_MARKERS: [&str; 3] = [".git", ".hg", ".jj"];

/// Why this directory is the root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// `--root` named it.
    Explicit,
    /// It holds `.agentdiff/` or `agentdiff.yaml` (the name found).
    Project(&'static str),
    /// It is the nearest version-control root (the marker found).
    Vcs(&'static str),
    /// Nothing marked a project; the current directory is used.
    CurrentDir,
}

/// A chosen project root (canonical) and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    pub path: PathBuf,
    pub reason: Reason,
}

impl Root {
    /// One sentence for users: `found agentdiff.yaml`, `nearest .git root`, ...
    pub fn describe(&self) -> String {
        match &self.reason {
            Reason::Explicit => "named by --root".to_owned(),
            Reason::Project(marker) => format!("nearest directory holding {marker}"),
            Reason::Vcs(marker) => format!("nearest version-control root ({marker})"),
            Reason::CurrentDir => "the current directory (no project marker above it)".to_owned(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error("project root {}: {source}; pass an existing directory with --root", path.display())]
    Unresolvable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("project root {} is not a directory; pass the project directory with --root", path.display())]
    NotADirectory { path: PathBuf },
    #[error(
        "refusing to use {} as the project root: it is {what}, and a run would capture and back \
         up everything below it; run agentdiff inside a project, or pass --root {} explicitly",
        path.display(),
        path.display()
    )]
    Refused { path: PathBuf, what: &'static str },
}

/// Finds the root: `explicit` (resolved against `cwd` when relative) if given, else the walk
/// described in the module docs. `home` is the user's home directory, if known.
pub fn discover(
    explicit: Option<&Path>,
    cwd: &Path,
    home: Option<&Path>,
) -> Result<Root, RootError> {
    if let Some(path) = explicit {
        let joined = cwd.join(path);
        let path = canonical_dir(&joined)?;
        return Ok(Root {
            path,
            reason: Reason::Explicit,
        });
    }
    let cwd = canonical_dir(cwd)?;
    let home = home.and_then(|h| std::fs::canonicalize(h).ok());
    let refused = |dir: &Path| -> Option<&'static str> {
        if dir.parent().is_none() {
            Some("the filesystem root")
        } else if home.as_deref() == Some(dir) {
            Some("your home directory")
        } else {
            None
        }
    };
    let candidates = || cwd.ancestors().filter(|d| refused(d).is_none());
    for dir in candidates() {
        if is_dir(&dir.join(STORE_MARKER)) {
            return Ok(found(dir, Reason::Project(".agentdiff/")));
        }
        if exists(&dir.join(agentdiff_policy::POLICY_FILE_NAME)) {
            return Ok(found(
                dir,
                Reason::Project(agentdiff_policy::POLICY_FILE_NAME),
            ));
        }
    }
    for dir in candidates() {
        if let Some(marker) = VCS_MARKERS.iter().find(|m| exists(&dir.join(m))) {
            return Ok(found(dir, Reason::Vcs(marker)));
        }
    }
    if let Some(what) = refused(&cwd) {
        return Err(RootError::Refused { path: cwd, what });
    }
    Ok(Root {
        path: cwd,
        reason: Reason::CurrentDir,
    })
}

/// The current directory when it lies strictly below `root` (and outside the store): a command
/// run from a subdirectory works there, while the whole project is observed. `None` otherwise.
pub fn invocation_dir(root: &Path) -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?.canonicalize().ok()?;
    let rel = cwd.strip_prefix(root).ok()?;
    let first = rel.components().next()?;
    (first.as_os_str() != STORE_MARKER).then_some(cwd)
}

fn found(dir: &Path, reason: Reason) -> Root {
    Root {
        path: dir.to_path_buf(),
        reason,
    }
}

fn canonical_dir(path: &Path) -> Result<PathBuf, RootError> {
    let canon = std::fs::canonicalize(path).map_err(|source| RootError::Unresolvable {
        path: path.to_path_buf(),
        source,
    })?;
    if !canon.is_dir() {
        return Err(RootError::NotADirectory { path: canon });
    }
    Ok(canon)
}

fn exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

fn is_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tree() -> (tempfile::TempDir, PathBuf) {
        let t = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(t.path()).unwrap();
        std::fs::create_dir_all(base.join("proj/src/deep")).unwrap();
        (t, base)
    }

    #[test]
    fn a_policy_or_store_above_wins_over_a_nearer_vcs_root() {
        let (_t, base) = tree();
        std::fs::write(base.join("proj/agentdiff.yaml"), "version: 1\n").unwrap();
        std::fs::create_dir(base.join("proj/src/.git")).unwrap();
        let r = discover(None, &base.join("proj/src/deep"), None).unwrap();
        assert_eq!(r.path, base.join("proj"));
        assert_eq!(r.reason, Reason::Project("agentdiff.yaml"));
        std::fs::create_dir(base.join("proj/src/.agentdiff")).unwrap();
        let r = discover(None, &base.join("proj/src/deep"), None).unwrap();
        assert_eq!(r.path, base.join("proj/src"));
    }

    #[test]
    fn the_nearest_vcs_root_else_the_current_directory() {
        let (_t, base) = tree();
        let r = discover(None, &base.join("proj/src"), None).unwrap();
        assert_eq!(
            (r.path, r.reason),
            (base.join("proj/src"), Reason::CurrentDir)
        );
        std::fs::write(base.join("proj/.git"), "gitdir: elsewhere\n").unwrap();
        let r = discover(None, &base.join("proj/src/deep"), None).unwrap();
        assert_eq!((r.path, r.reason), (base.join("proj"), Reason::Vcs(".git")));
    }

    #[test]
    fn home_is_refused_implicitly_and_skipped_by_the_walk_but_explicit_works() {
        let (_t, base) = tree();
        let home = base.join("proj");
        std::fs::create_dir(home.join(".agentdiff")).unwrap();
        let err = discover(None, &home, Some(&home)).unwrap_err();
        assert!(matches!(err, RootError::Refused { .. }), "{err}");
        // From below, the store in $HOME is not a project marker.
        let r = discover(None, &home.join("src"), Some(&home)).unwrap();
        assert_eq!(r.path, home.join("src"));
        let r = discover(Some(Path::new("..")), &home.join("src"), Some(&home)).unwrap();
        assert_eq!((r.path, r.reason), (home, Reason::Explicit));
        assert!(matches!(
            discover(None, Path::new("/"), None).unwrap_err(),
            RootError::Refused { .. }
        ));
    }
}
