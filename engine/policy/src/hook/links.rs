//! Finding the other names of a hard-linked file inside the project root.
//!
//! The walk lists directories through their descriptors (`openat(O_NOFOLLOW | O_DIRECTORY)`,
//! `fstatat(AT_SYMLINK_NOFOLLOW)`), never follows a symlink, and does not leave the file's
//! device (a hard link cannot cross one). It stops as soon as every link is found. It visits at
//! most [`MAX_ENTRIES`] entries; past that the search is reported incomplete, and the caller
//! must not treat the names found as all of them.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use nix::dir::Dir;
use nix::fcntl::{fcntl, open, openat, AtFlags, FcntlArg, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};

use super::resolve::FileId;

/// Entries visited before the search gives up.
pub const MAX_ENTRIES: usize = 200_000;

/// The names found and whether they are all the file's links.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Links {
    /// Project-relative names of the file (including the one asked about).
    pub names: Vec<String>,
    /// True when the walk finished or found `nlink` names.
    pub complete: bool,
}

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// Every name of the file `id` below `root` (a symlink-free absolute directory).
pub fn names_in_root(root: &Path, id: FileId) -> Links {
    let search = walk(root, Want::Names(id));
    let complete = search.done() || (search.walked_all && search.budget > 0);
    let mut names = search.names;
    names.sort();
    Links { names, complete }
}

/// Regular files with more than one link below the directory `dir` (symlink-free, absolute):
/// a content search of `dir` reads them, and their other names may be anywhere. At most
/// `limit` are returned (names relative to `dir`, with their identities); `complete` is false
/// when the walk stopped early (the limit, [`MAX_ENTRIES`], an unreadable directory).
pub fn linked_below(dir: &Path, limit: usize) -> (Vec<(String, FileId)>, bool) {
    let search = walk(dir, Want::Linked(limit));
    let complete = search.walked_all && search.budget > 0 && search.found.len() < limit;
    (search.found, complete)
}

fn walk(root: &Path, want: Want) -> Search {
    let mut search = Search {
        want,
        budget: MAX_ENTRIES,
        names: Vec::new(),
        found: Vec::new(),
        walked_all: true,
        // Pending directories hold their parent's descriptor, so open descriptors stay bounded
        // by the depth of the tree, not its width.
        pending: Vec::new(),
    };
    match open(root, DIR_FLAGS, Mode::empty()) {
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        Ok(fd) => search.list(&unsafe { OwnedFd::from_raw_fd(fd) }, ""),
        Err(_) => search.walked_all = false,
    }
    while let Some((parent, name, rel)) = search.pending.pop() {
        if search.done() || search.budget == 0 {
            break;
        }
        match openat(
            Some(parent.as_raw_fd()),
            name.as_c_str(),
            DIR_FLAGS,
            Mode::empty(),
        ) {
            // SAFETY: `openat` just returned this descriptor and nothing else owns it.
            Ok(fd) => search.list(&unsafe { OwnedFd::from_raw_fd(fd) }, &rel),
            Err(_) => search.walked_all = false,
        }
    }
    search
}

/// What a walk looks for.
#[derive(Clone, Copy)]
enum Want {
    /// The names of one file (on its device only: a hard link cannot cross one).
    Names(FileId),
    /// Up to this many regular files with more than one link, on any device.
    Linked(usize),
}

struct Search {
    want: Want,
    budget: usize,
    names: Vec<String>,
    found: Vec<(String, FileId)>,
    walked_all: bool,
    pending: Vec<(Arc<OwnedFd>, CString, String)>,
}

impl Search {
    fn done(&self) -> bool {
        match self.want {
            Want::Names(id) => self.names.len() as u64 >= id.nlink,
            Want::Linked(limit) => self.found.len() >= limit,
        }
    }

    fn list(&mut self, fd: &OwnedFd, rel: &str) {
        let Ok(dup) = fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(0)) else {
            self.walked_all = false;
            return;
        };
        // `Dir::from_fd` owns (and on failure closes) the duplicate.
        let Ok(mut dir) = Dir::from_fd(dup) else {
            self.walked_all = false;
            return;
        };
        let Ok(shared) = fd.try_clone().map(Arc::new) else {
            self.walked_all = false;
            return;
        };
        for entry in dir.iter() {
            let Ok(entry) = entry else {
                self.walked_all = false;
                return;
            };
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            if self.budget == 0 {
                return;
            }
            self.budget -= 1;
            let Ok(st) = fstatat(Some(fd.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW) else {
                self.walked_all = false;
                continue;
            };
            let seen = FileId::of(&st);
            if let Want::Names(id) = self.want {
                if seen.dev != id.dev {
                    continue;
                }
            }
            let child = join(rel, name.to_bytes());
            let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
            if kind == SFlag::S_IFDIR {
                self.pending
                    .push((Arc::clone(&shared), name.to_owned(), child));
                continue;
            }
            match self.want {
                Want::Names(id) if seen.ino == id.ino => self.names.push(child),
                Want::Linked(limit) if seen.regular && seen.nlink > 1 => {
                    self.found.push((child, seen));
                    if self.found.len() >= limit {
                        return;
                    }
                }
                _ => {}
            }
        }
    }
}

fn join(rel: &str, name: &[u8]) -> String {
    let name = OsStr::from_bytes(name).to_string_lossy();
    if rel.is_empty() {
        name.into_owned()
    } else {
        format!("{rel}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hook::resolve::resolve;

    #[test]
    fn finds_every_name_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("src/deep")).unwrap();
        std::fs::write(root.join(".env"), "A=1").unwrap();
        std::fs::hard_link(root.join(".env"), root.join("src/deep/envhl")).unwrap();
        std::os::unix::fs::symlink(".", root.join("src/self")).unwrap();
        let r = resolve(&root, Path::new("src/deep/envhl")).unwrap();
        let links = names_in_root(&root, r.file.unwrap());
        assert!(links.complete);
        assert_eq!(links.names, [".env", "src/deep/envhl"]);
    }
}
