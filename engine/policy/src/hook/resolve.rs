//! Resolving a tool's path the way the kernel resolves it.
//!
//! The walk starts at `/` with an `O_PATH` directory descriptor and takes one component at a
//! time: `.` is skipped, `..` is `openat(dir, "..")` (so it lands where the kernel lands, also
//! after a symlink and at `/`), a name is `fstatat(AT_SYMLINK_NOFOLLOW)`-ed, a directory is
//! entered with `openat(O_NOFOLLOW | O_DIRECTORY)`, and a symlink's target is read and its
//! components are put in front of the rest (an absolute target restarts at `/`). A symlink as
//! the final component is recorded (a write may replace the link itself) and then followed,
//! as `open(O_CREAT)` follows it. At most [`MAX_SYMLINK_HOPS`] symlinks are followed, as the
//! kernel does before `ELOOP`.
//!
//! Components that do not exist are kept as names: what follows them is resolved lexically
//! until a `..` leads back to a directory that exists (creating the missing directories, as
//! `mkdir -p` does, gives exactly that result).
//!
//! A symlink on `/proc` is not followed ([`ResolveError::ProcLink`]): `/proc/self/…` and
//! `/proc/PID/fd/…` lead wherever the *following* process's state says, which is the hook's
//! here and the tool's later.
//!
//! Cost: every component costs a constant number of system calls and the work list holds at
//! most [`MAX_SYMLINK_HOPS`] + 1 path texts of at most [`PATH_MAX`] bytes each, so resolution
//! is linear in the input.
//!
//! Not defended: a bind mount makes one directory reachable under two names; the walk judges
//! the name it was given (mounting needs privileges the threat model excludes). The answer
//! describes the tree at the time of the walk. A process that swaps a
//! directory for a symlink between this walk and the tool's write wins that race; the walk
//! itself never follows a swapped entry (`O_NOFOLLOW` on every step fails instead).

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{readlinkat, AtFlags};
use nix::sys::stat::{fstat, fstatat, FileStat, SFlag};

/// Longest path accepted, in bytes: the kernel's `PATH_MAX` (a longer path fails there too).
pub const PATH_MAX: usize = 4096;
/// Symlinks followed in one resolution before giving up, as Linux does (`ELOOP`).
pub const MAX_SYMLINK_HOPS: usize = 40;

/// The identity of an existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub regular: bool,
}

impl FileId {
    // `stat` field types differ between platforms.
    #[allow(clippy::unnecessary_cast)]
    pub(crate) fn of(st: &FileStat) -> FileId {
        FileId {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            nlink: st.st_nlink as u64,
            regular: SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFREG,
        }
    }
}

/// Where a path leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    /// The absolute, symlink-free path the kernel would open (final symlinks followed).
    pub target: PathBuf,
    /// The existing file at `target`, or `None` when it (or a directory above it) does not exist.
    pub file: Option<FileId>,
    /// Symlinks met as the final component, in order: a tool that replaces or deletes the
    /// path acts on these rather than on `target`.
    pub final_links: Vec<PathBuf>,
}

/// Why a path cannot be resolved. None of these quote file content.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResolveError {
    #[error("the path is longer than {PATH_MAX} bytes")]
    TooLong,
    #[error("the path is empty or contains a NUL byte")]
    Invalid,
    #[error("more than {MAX_SYMLINK_HOPS} symlinks are followed (a symlink loop)")]
    Loop,
    #[error("{} is not a directory", at.display())]
    NotADirectory { at: PathBuf },
    #[error("cannot look up {}: {errno}", at.display())]
    Io { at: PathBuf, errno: Errno },
    /// `/proc` links (`/proc/self/fd/3`, `/proc/self/cwd`) name the process that follows them:
    /// the hook would resolve its own, not the tool's.
    #[error("{} is a /proc link, which leads somewhere else for the tool's process", at.display())]
    ProcLink { at: PathBuf },
}

/// Resolve `path` (absolute, or relative to the absolute `base`) as the kernel would.
pub fn resolve(base: &Path, path: &Path) -> Result<Resolution, ResolveError> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.contains(&0) {
        return Err(ResolveError::Invalid);
    }
    if bytes.len() > PATH_MAX || base.as_os_str().len() > PATH_MAX {
        return Err(ResolveError::TooLong);
    }
    let mut walk = Walk::start()?;
    // `pending` is a stack: the text walked first is pushed last.
    walk.push_text(bytes);
    if !path.is_absolute() {
        walk.push_text(base.as_os_str().as_bytes());
    }
    walk.run()
}

/// The walk's state: the directory reached so far (an fd and its names from `/`), and the
/// names still to take, innermost text last.
struct Walk {
    dir: OwnedFd,
    /// Names from `/` to the current position; the last `missing` of them do not exist.
    names: Vec<OsString>,
    missing: usize,
    /// Path texts still to walk, each with the offset of its next unread byte.
    pending: Vec<(Vec<u8>, usize)>,
    hops: usize,
    final_links: Vec<PathBuf>,
    /// The identity of the last existing non-directory reached as the final component.
    leaf: Option<FileId>,
}

impl Walk {
    fn start() -> Result<Walk, ResolveError> {
        Ok(Walk {
            dir: open_root()?,
            names: Vec::new(),
            missing: 0,
            pending: Vec::new(),
            hops: 0,
            final_links: Vec::new(),
            leaf: None,
        })
    }

    fn push_text(&mut self, text: &[u8]) {
        self.pending.push((text.to_vec(), 0));
    }

    fn here(&self) -> PathBuf {
        let mut p = PathBuf::from("/");
        p.extend(&self.names);
        p
    }

    /// The next component, and whether it is the last one of the whole walk.
    fn next_component(&mut self) -> Option<(Vec<u8>, bool)> {
        self.skip_separators();
        let (text, at) = self.pending.last_mut()?;
        let rest = text.get(*at..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == b'/').unwrap_or(rest.len());
        let part = rest.get(..end).unwrap_or_default().to_vec();
        *at += end;
        self.skip_separators();
        Some((part, self.pending.is_empty()))
    }

    /// Move past `/` and `.` components and drop finished texts, so the top text (if any)
    /// starts with a real component. Every byte is skipped once: the walk stays linear.
    fn skip_separators(&mut self) {
        while let Some((text, at)) = self.pending.last_mut() {
            loop {
                let rest = text.get(*at..).unwrap_or_default();
                if rest.first() == Some(&b'/') || rest == b"." || rest.starts_with(b"./") {
                    *at += 1;
                } else {
                    break;
                }
            }
            if *at >= text.len() {
                self.pending.pop();
            } else {
                return;
            }
        }
    }

    fn run(mut self) -> Result<Resolution, ResolveError> {
        while let Some((part, last)) = self.next_component() {
            self.leaf = None;
            if part == b".." {
                self.parent()?;
            } else if self.missing > 0 {
                self.names.push(OsString::from_vec(part));
                self.missing += 1;
            } else {
                self.child(part, last)?;
            }
        }
        let file = match (self.missing, self.leaf) {
            (0, Some(leaf)) => Some(leaf),
            (0, None) => Some(FileId::of(&fstat(self.dir.as_raw_fd()).map_err(
                |errno| ResolveError::Io {
                    at: self.here(),
                    errno,
                },
            )?)),
            _ => None,
        };
        Ok(Resolution {
            target: self.here(),
            file,
            final_links: self.final_links,
        })
    }

    fn parent(&mut self) -> Result<(), ResolveError> {
        if self.missing > 0 {
            self.missing -= 1;
            self.names.pop();
            return Ok(());
        }
        self.dir = self.open_dir(b"..")?;
        self.names.pop();
        Ok(())
    }

    fn child(&mut self, part: Vec<u8>, last: bool) -> Result<(), ResolveError> {
        let name = cstring(&part)?;
        let st = match fstatat(
            Some(self.dir.as_raw_fd()),
            name.as_c_str(),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        ) {
            Ok(st) => st,
            Err(Errno::ENOENT) => {
                self.names.push(OsString::from_vec(part));
                self.missing = 1;
                return Ok(());
            }
            Err(errno) => {
                return Err(ResolveError::Io {
                    at: self.here().join(OsStr::from_bytes(&part)),
                    errno,
                })
            }
        };
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFLNK {
            return self.follow(&part, last);
        }
        if kind == SFlag::S_IFDIR {
            self.dir = self.open_dir(&part)?;
            self.names.push(OsString::from_vec(part));
            return Ok(());
        }
        self.names.push(OsString::from_vec(part));
        if !last {
            return Err(ResolveError::NotADirectory { at: self.here() });
        }
        self.leaf = Some(FileId::of(&st));
        Ok(())
    }

    fn follow(&mut self, part: &[u8], last: bool) -> Result<(), ResolveError> {
        self.hops += 1;
        if self.hops > MAX_SYMLINK_HOPS {
            return Err(ResolveError::Loop);
        }
        let at = self.here().join(OsStr::from_bytes(part));
        if on_procfs(&self.dir) {
            return Err(ResolveError::ProcLink { at });
        }
        let target = readlinkat(Some(self.dir.as_raw_fd()), OsStr::from_bytes(part))
            .map_err(|errno| ResolveError::Io {
                at: at.clone(),
                errno,
            })?
            .into_vec();
        if target.is_empty() {
            // The kernel refuses an empty link target; so does this walk.
            return Err(ResolveError::Io {
                at,
                errno: Errno::ENOENT,
            });
        }
        if last {
            self.final_links.push(at);
        }
        if target.first() == Some(&b'/') {
            self.dir = open_root()?;
            self.names.clear();
        }
        self.pending.push((target, 0));
        Ok(())
    }

    fn open_dir(&self, name: &[u8]) -> Result<OwnedFd, ResolveError> {
        let c = cstring(name)?;
        match agentdiff_host::dir::open_path_at(&self.dir, c.as_c_str()) {
            Ok(fd) => Ok(fd),
            Err(errno) => Err(ResolveError::Io {
                at: self.here().join(OsStr::from_bytes(name)),
                errno,
            }),
        }
    }
}

#[cfg(target_os = "linux")]
fn on_procfs(dir: &OwnedFd) -> bool {
    use nix::sys::statfs::{fstatfs, PROC_SUPER_MAGIC};
    // If the file system cannot be told, assume /proc: refusing is the safe side.
    fstatfs(dir).map_or(true, |fs| fs.filesystem_type() == PROC_SUPER_MAGIC)
}

#[cfg(not(target_os = "linux"))]
fn on_procfs(_dir: &OwnedFd) -> bool {
    false
}

fn open_root() -> Result<OwnedFd, ResolveError> {
    match agentdiff_host::dir::open_path(Path::new("/")) {
        Ok(fd) => Ok(fd),
        Err(errno) => Err(ResolveError::Io {
            at: PathBuf::from("/"),
            errno,
        }),
    }
}

fn cstring(bytes: &[u8]) -> Result<CString, ResolveError> {
    CString::new(bytes).map_err(|_| ResolveError::Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn canon(p: &Path) -> PathBuf {
        std::fs::canonicalize(p).unwrap()
    }

    #[test]
    fn dotdot_after_a_symlink_lands_where_the_kernel_lands() {
        let dir = tempfile::tempdir().unwrap();
        let root = canon(dir.path());
        std::fs::create_dir_all(root.join(".git/hooks")).unwrap();
        std::fs::write(root.join(".git/config"), "x").unwrap();
        symlink(".git/hooks", root.join("hookslink")).unwrap();
        let r = resolve(&root, Path::new("hookslink/../config")).unwrap();
        assert_eq!(r.target, root.join(".git/config"));
        assert!(r.file.unwrap().regular);
        assert!(r.final_links.is_empty());
    }

    #[test]
    fn missing_components_are_kept_and_dotdot_returns_to_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = canon(dir.path());
        std::fs::create_dir_all(root.join("a")).unwrap();
        symlink("a", root.join("l")).unwrap();
        let r = resolve(&root, Path::new("new/deeper/../../l/x")).unwrap();
        assert_eq!(r.target, root.join("a/x"));
        assert_eq!(r.file, None);
    }

    #[test]
    fn final_symlinks_are_recorded_and_followed() {
        let dir = tempfile::tempdir().unwrap();
        let root = canon(dir.path());
        symlink("b", root.join("a")).unwrap();
        symlink("/nonexistent-agentdiff-target", root.join("b")).unwrap();
        let r = resolve(&root, Path::new("a")).unwrap();
        assert_eq!(r.target, PathBuf::from("/nonexistent-agentdiff-target"));
        assert_eq!(r.final_links, vec![root.join("a"), root.join("b")]);
        assert_eq!(r.file, None);
    }

    #[test]
    fn loops_too_long_and_not_a_directory_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let root = canon(dir.path());
        symlink("loop", root.join("loop")).unwrap();
        std::fs::write(root.join("f"), "x").unwrap();
        assert_eq!(resolve(&root, Path::new("loop")), Err(ResolveError::Loop));
        assert!(matches!(
            resolve(&root, Path::new("f/x")),
            Err(ResolveError::NotADirectory { .. })
        ));
        let long = "a/".repeat(PATH_MAX);
        assert_eq!(resolve(&root, Path::new(&long)), Err(ResolveError::TooLong));
        assert_eq!(resolve(&root, Path::new("")), Err(ResolveError::Invalid));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_links_are_not_followed() {
        for path in ["/proc/self/cwd/x", "/proc/self/fd/0", "/proc/self/root/etc"] {
            assert!(
                matches!(
                    resolve(Path::new("/"), Path::new(path)),
                    Err(ResolveError::ProcLink { .. })
                ),
                "{path}"
            );
        }
        // `/proc/self` itself is a plain symlink to the pid, also refused: it is per process.
        assert!(resolve(Path::new("/"), Path::new("/proc/cpuinfo")).is_ok());
    }

    #[test]
    fn dotdot_at_the_top_stays_at_the_top() {
        let r = resolve(Path::new("/"), Path::new("../../..")).unwrap();
        assert_eq!(r.target, PathBuf::from("/"));
    }
}
