//! Where a project's git metadata lives, derived from the tree rather than from the name `.git`.
//!
//! Git runs code from its metadata (hooks, `core.fsmonitor`, filters), so a command that can
//! write any git directory the user later works in can run code outside every sandbox. A git
//! directory is not always `ROOT/.git`: `git init --separate-git-dir`, `git worktree add` and
//! submodules leave a `.git` *file* (`gitdir: PATH`) whose target may be anywhere, a worktree's
//! git directory names the shared one in `commondir`, and a bare repository or a nested one can
//! sit anywhere below the root.
//!
//! [`discover`] walks the directories below the root once (it lists them, it reads no file but
//! `.git` files and `commondir`; the evidence store `ROOT/.agentdiff` is not searched) and
//! returns:
//! - every directory git itself would take for a git directory (a `HEAD` file, a `refs`
//!   directory, and an `objects` directory or a `commondir` file), whatever its name;
//! - every `.git` entry (a directory, or a file, which is returned as well so that the pointer
//!   itself can be protected);
//! - the target of each `.git` file's `gitdir:` line (relative paths against the file's
//!   directory), inside or outside the root, and the `commondir` of every git directory found.
//!
//! Invariants: symlinks are never followed during the walk; a target named by a `.git` file or
//! a `commondir` is accepted only when it is a directory git would take for a git directory, is
//! not the root or one of its ancestors, and is not below `/proc`, `/sys` or `/dev` — so a
//! pointer a command planted can only ever add protection to what already is a git directory,
//! never make agentdiff protect (or trust) an arbitrary path. Ignored pointers are listed in
//! [`GitDirs::ignored`].
//!
//! Not defended: metadata created or re-pointed while the command runs (the walk happens before
//! the launch; the planted `.git` entry is itself a change below a `.git` name and decided as
//! git metadata after the run); directories the walk cannot read (listed in `unreadable`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

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

/// Whether `dir` has git's layout of a git directory (symlinks inside it are not followed).
fn has_git_layout(dir: &Path) -> bool {
    let is = |name: &str, want_dir: bool| {
        fs::symlink_metadata(dir.join(name)).is_ok_and(|m| {
            if want_dir {
                m.is_dir()
            } else {
                m.is_file()
            }
        })
    };
    is("HEAD", false) && is("refs", true) && (is("objects", true) || is("commondir", false))
}

/// [`has_git_layout`] from a directory's entries (their types as listed, symlinks not followed).
fn layout_of(entries: &[(std::ffi::OsString, fs::FileType)]) -> bool {
    let is = |name: &str, want_dir: bool| {
        entries
            .iter()
            .any(|(n, t)| n == name && if want_dir { t.is_dir() } else { t.is_file() })
    };
    is("HEAD", false) && is("refs", true) && (is("objects", true) || is("commondir", false))
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
/// there names. Never fails: what cannot be read is listed.
pub fn discover(root: &Path) -> GitDirs {
    let mut out = GitDirs::default();
    let Ok(root) = root.canonicalize() else {
        out.unreadable.push(root.to_path_buf());
        return out;
    };
    let mut stack = vec![root.clone()];
    let mut pointed: Vec<(PathBuf, Found)> = Vec::new();
    // The evidence store holds no repository and many directories (objects, runs); the sandbox
    // re-binds it read-only and the engine checks it after the command.
    let store = root.join(STORE_DIR);
    while let Some(dir) = stack.pop() {
        let entries: Vec<(std::ffi::OsString, fs::FileType)> = match fs::read_dir(&dir) {
            // The type comes with the directory entry: no `stat` per entry.
            Ok(e) => e
                .flatten()
                .filter_map(|e| Some((e.file_name(), e.file_type().ok()?)))
                .collect(),
            Err(_) => {
                out.unreadable.push(dir);
                continue;
            }
        };
        if dir != root && layout_of(&entries) {
            out.push(dir.clone(), Found::Layout);
            pointed.push((dir.join("commondir"), Found::Commondir));
            continue;
        }
        for (name, kind) in entries {
            let path = dir.join(&name);
            if name == ".git" {
                if kind.is_dir() {
                    out.push(path.clone(), Found::DotGit);
                    pointed.push((path.join("commondir"), Found::Commondir));
                } else if kind.is_file() {
                    out.push(path.clone(), Found::DotGit);
                    pointed.push((path, Found::GitdirFile));
                } else if kind.is_symlink() {
                    pointed.push((path, Found::Symlink));
                }
                continue;
            }
            if kind.is_dir() && path != store {
                stack.push(path);
            }
        }
    }
    follow_pointers(&root, pointed, &mut out);
    out
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
