//! Directory-handle file operations that never follow symlinks.
//!
//! Every operation is relative to an open directory file descriptor ([`DirHandle`]), and a path
//! below the root is reached one component at a time with `openat(O_NOFOLLOW | O_DIRECTORY)`. A
//! directory replaced by a symlink after it was checked therefore makes the next `openat` fail
//! (`ELOOP`/`ENOTDIR`) instead of redirecting a write outside the root, and a handle already open
//! keeps referring to the directory that was checked. Names are single path components: `/`,
//! `.`, `..` and NUL are refused.
//!
//! Used by rollback (restore the before-state) and promote (apply the after-state). The
//! openers below ([`open_dir_at`], [`open_path_at`], [`open_dir_path`]) are the one way any
//! agentdiff crate opens a directory it works below (the scanner's walk, the hook's path
//! resolution, the object store): never through a symlink, never inherited by a child.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};

/// How every directory agentdiff works below is opened: for reading, only if it is a directory,
/// never through a symlink in the last component, never inherited across `exec`.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// The same for a directory that is only walked through, not listed (`O_PATH` where the kernel
/// has it: a directory the user may search but not read can still be passed).
#[cfg(target_os = "linux")]
const PATH_FLAGS: OFlag = OFlag::O_PATH
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);
#[cfg(not(target_os = "linux"))]
const PATH_FLAGS: OFlag = DIR_FLAGS;

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open call and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Opens the directory `name` (one component, or `..`) below `parent` for listing, refusing a
/// symlink. The kernel's errno is returned as it is: callers tell a swapped entry (`ELOOP`,
/// `ENOTDIR`) from a vanished one (`ENOENT`) in their own terms.
pub fn open_dir_at(parent: &impl AsRawFd, name: &CStr) -> Result<OwnedFd, Errno> {
    nix::fcntl::openat(Some(parent.as_raw_fd()), name, DIR_FLAGS, Mode::empty()).map(owned)
}

/// Opens the directory `name` below `parent` to walk through it only (see [`PATH_FLAGS`]),
/// refusing a symlink.
pub fn open_path_at(parent: &impl AsRawFd, name: &CStr) -> Result<OwnedFd, Errno> {
    nix::fcntl::openat(Some(parent.as_raw_fd()), name, PATH_FLAGS, Mode::empty()).map(owned)
}

/// Opens the directory at `path` to walk through it only, refusing a symlink as its last
/// component (earlier components are resolved by the kernel: pass a resolved path).
pub fn open_path(path: &Path) -> Result<OwnedFd, Errno> {
    nix::fcntl::open(path, PATH_FLAGS, Mode::empty()).map(owned)
}

/// Opens the directory at `path` for listing, refusing a symlink as its last component.
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(path, DIR_FLAGS, Mode::empty())
        .map(owned)
        .map_err(io::Error::from)
}

/// Prefix of every temporary name this module creates. A name with this prefix inside the
/// project tree is a leftover of an interrupted restore and may be removed by [`DirHandle::remove_stale_temps`].
pub const TEMP_PREFIX: &str = ".agentdiff-tmp-";

/// True when `name` is one of this module's temporary names.
pub fn is_temp_name(name: &OsStr) -> bool {
    name.as_bytes().starts_with(TEMP_PREFIX.as_bytes())
}

/// What an entry is, by `lstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    File,
    Directory,
    Symlink,
    /// FIFO, socket, device or anything else.
    Other,
}

impl NodeKind {
    pub fn describe(self) -> &'static str {
        match self {
            NodeKind::File => "a regular file",
            NodeKind::Directory => "a directory",
            NodeKind::Symlink => "a symlink",
            NodeKind::Other => "a special file (FIFO, socket or device)",
        }
    }
}

/// The metadata this module compares (from `fstat`/`fstatat(AT_SYMLINK_NOFOLLOW)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMeta {
    pub kind: NodeKind,
    /// Permission bits including setuid/setgid/sticky (`st_mode & 0o7777`).
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl NodeMeta {
    fn from_stat(st: &FileStat) -> NodeMeta {
        let fmt = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        let kind = if fmt == SFlag::S_IFREG {
            NodeKind::File
        } else if fmt == SFlag::S_IFDIR {
            NodeKind::Directory
        } else if fmt == SFlag::S_IFLNK {
            NodeKind::Symlink
        } else {
            NodeKind::Other
        };
        #[allow(clippy::unnecessary_cast)] // field widths differ between platforms
        NodeMeta {
            kind,
            mode: (st.st_mode as u32) & 0o7777,
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            nlink: st.st_nlink as u64,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_ns: (st.st_mtime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_mtime_nsec as i64),
            ctime_ns: (st.st_ctime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(st.st_ctime_nsec as i64),
        }
    }

    /// Same inode on the same device.
    pub fn same_identity(&self, other: &NodeMeta) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    /// Same inode, and nothing observable about its content changed (size, mtime, ctime).
    pub fn unchanged_since(&self, earlier: &NodeMeta) -> bool {
        self.same_identity(earlier)
            && self.size == earlier.size
            && self.mtime_ns == earlier.mtime_ns
            && self.ctime_ns == earlier.ctime_ns
    }
}

/// `fstat` of an open file.
pub fn file_meta(file: &File) -> io::Result<NodeMeta> {
    let st = nix::sys::stat::fstat(file.as_raw_fd()).map_err(io::Error::from)?;
    Ok(NodeMeta::from_stat(&st))
}

/// `fchmod` of an open file (permission bits only).
pub fn chmod_file(file: &File, mode: u32) -> io::Result<()> {
    nix::sys::stat::fchmod(file.as_raw_fd(), Mode::from_bits_truncate(mode as _))
        .map_err(io::Error::from)
}

/// One validated path component as a C string.
fn component(name: &OsStr) -> io::Result<CString> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single path component"),
        ));
    }
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "a path component contains a NUL byte",
        )
    })
}

/// True for the errors `openat(O_NOFOLLOW | O_DIRECTORY)` gives when a component is a symlink or
/// not a directory.
pub fn is_not_a_directory(err: &io::Error) -> bool {
    matches!(
        err.raw_os_error().map(Errno::from_raw),
        Some(Errno::ELOOP) | Some(Errno::ENOTDIR)
    )
}

/// An open directory.
#[derive(Debug)]
pub struct DirHandle {
    fd: OwnedFd,
}

impl DirHandle {
    fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Opens the root directory itself. The final component must not be a symlink (pass the
    /// resolved root).
    pub fn open_root(path: &Path) -> io::Result<DirHandle> {
        Ok(DirHandle {
            fd: open_dir_path(path)?,
        })
    }

    /// Another handle to the same directory.
    pub fn try_clone(&self) -> io::Result<DirHandle> {
        Ok(DirHandle {
            fd: self.fd.try_clone()?,
        })
    }

    /// Opens the child directory `name` without following a symlink.
    pub fn open_dir(&self, name: &OsStr) -> io::Result<DirHandle> {
        let c = component(name)?;
        Ok(DirHandle {
            fd: open_dir_at(&self.fd, c.as_c_str()).map_err(io::Error::from)?,
        })
    }

    /// Opens the directory at the `/`-separated relative path `rel` one component at a time,
    /// never following a symlink. An empty `rel` is this directory.
    pub fn open_relative(&self, rel: &str) -> io::Result<DirHandle> {
        let mut dir = self.try_clone()?;
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            dir = dir.open_dir(OsStr::new(part))?;
        }
        Ok(dir)
    }

    /// `fstat` of the directory itself.
    pub fn meta(&self) -> io::Result<NodeMeta> {
        let st = nix::sys::stat::fstat(self.raw()).map_err(io::Error::from)?;
        Ok(NodeMeta::from_stat(&st))
    }

    /// `fstatat(AT_SYMLINK_NOFOLLOW)` of a child; `None` when it does not exist.
    pub fn stat(&self, name: &OsStr) -> io::Result<Option<NodeMeta>> {
        let c = component(name)?;
        match nix::sys::stat::fstatat(Some(self.raw()), c.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            Ok(st) => Ok(Some(NodeMeta::from_stat(&st))),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(io::Error::from(e)),
        }
    }

    /// Opens a child for reading without following a symlink and without blocking on a FIFO.
    /// The caller must check that the result is a regular file (see [`file_meta`]).
    pub fn open_file(&self, name: &OsStr) -> io::Result<File> {
        let c = component(name)?;
        let fd = nix::fcntl::openat(
            Some(self.raw()),
            c.as_c_str(),
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        // SAFETY: a fresh descriptor from a successful openat.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Creates a new, empty, private (0600) temporary file in this directory with a random
    /// [`TEMP_PREFIX`] name (`O_CREAT | O_EXCL | O_NOFOLLOW`). Returns the file and its name.
    pub fn create_temp(&self) -> io::Result<(File, OsString)> {
        let mut last = None;
        for _ in 0..16 {
            let name = random_temp_name()?;
            let c = component(&name)?;
            match nix::fcntl::openat(
                Some(self.raw()),
                c.as_c_str(),
                OFlag::O_WRONLY
                    | OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(0o600),
            ) {
                // SAFETY: a fresh descriptor from a successful openat.
                Ok(fd) => return Ok((unsafe { File::from_raw_fd(fd) }, name)),
                Err(Errno::EEXIST) => last = Some(Errno::EEXIST),
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        Err(io::Error::from(last.unwrap_or(Errno::EEXIST)))
    }

    /// `readlinkat` of a child: the target a symlink holds (never followed).
    pub fn read_link(&self, name: &OsStr) -> io::Result<OsString> {
        let c = component(name)?;
        nix::fcntl::readlinkat(Some(self.raw()), c.as_c_str()).map_err(io::Error::from)
    }

    /// Creates a symlink holding `target` under a fresh [`TEMP_PREFIX`] name and returns the name
    /// (the link is made beside its final place, then renamed over it).
    pub fn create_temp_link(&self, target: &OsStr) -> io::Result<OsString> {
        let mut last = None;
        for _ in 0..16 {
            let name = random_temp_name()?;
            let c = component(&name)?;
            match nix::unistd::symlinkat(target, Some(self.raw()), c.as_c_str()) {
                Ok(()) => return Ok(name),
                Err(Errno::EEXIST) => last = Some(Errno::EEXIST),
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        Err(io::Error::from(last.unwrap_or(Errno::EEXIST)))
    }

    /// A fresh [`TEMP_PREFIX`] name that does not exist in this directory right now.
    pub fn unused_temp_name(&self) -> io::Result<OsString> {
        for _ in 0..16 {
            let name = random_temp_name()?;
            if self.stat(&name)?.is_none() {
                return Ok(name);
            }
        }
        Err(io::Error::from(Errno::EEXIST))
    }

    /// `renameat` within this directory; replaces `to` if it exists.
    pub fn rename(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (f, t) = (component(from)?, component(to)?);
        nix::fcntl::renameat(
            Some(self.raw()),
            f.as_c_str(),
            Some(self.raw()),
            t.as_c_str(),
        )
        .map_err(io::Error::from)
    }

    /// `renameat2(RENAME_NOREPLACE)` within this directory: fails with `AlreadyExists` instead of
    /// replacing `to`. Only available on Linux; elsewhere it fails with `Unsupported` (no weaker
    /// check-then-rename fallback).
    pub fn rename_noreplace(&self, from: &OsStr, to: &OsStr) -> io::Result<()> {
        let (f, t) = (component(from)?, component(to)?);
        #[cfg(target_os = "linux")]
        {
            nix::fcntl::renameat2(
                Some(self.raw()),
                f.as_c_str(),
                Some(self.raw()),
                t.as_c_str(),
                nix::fcntl::RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(io::Error::from)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (f, t);
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "renaming without replacing needs renameat2(RENAME_NOREPLACE) (Linux)",
            ))
        }
    }

    /// `unlinkat` of a non-directory child.
    pub fn unlink_file(&self, name: &OsStr) -> io::Result<()> {
        let c = component(name)?;
        nix::unistd::unlinkat(
            Some(self.raw()),
            c.as_c_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        )
        .map_err(io::Error::from)
    }

    /// `unlinkat(AT_REMOVEDIR)`: removes an empty child directory.
    pub fn remove_dir(&self, name: &OsStr) -> io::Result<()> {
        let c = component(name)?;
        nix::unistd::unlinkat(
            Some(self.raw()),
            c.as_c_str(),
            nix::unistd::UnlinkatFlags::RemoveDir,
        )
        .map_err(io::Error::from)
    }

    /// `mkdirat` (the mode is narrowed by the umask; set it afterwards with [`DirHandle::chmod`]).
    pub fn mkdir(&self, name: &OsStr, mode: u32) -> io::Result<()> {
        let c = component(name)?;
        nix::sys::stat::mkdirat(
            Some(self.raw()),
            c.as_c_str(),
            Mode::from_bits_truncate(mode as _),
        )
        .map_err(io::Error::from)
    }

    /// `fchmod` of the directory itself.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        nix::sys::stat::fchmod(self.raw(), Mode::from_bits_truncate(mode as _))
            .map_err(io::Error::from)
    }

    /// `fsync` of the directory (makes renames and unlinks in it durable).
    pub fn sync(&self) -> io::Result<()> {
        nix::unistd::fsync(self.raw()).map_err(io::Error::from)
    }

    /// Names of the directory's entries (without `.` and `..`).
    pub fn entries(&self) -> io::Result<Vec<OsString>> {
        let mut dir = nix::dir::Dir::openat(
            Some(self.raw()),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(io::Error::from)?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(io::Error::from)?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name.to_vec()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Removes regular files and symlinks named with [`TEMP_PREFIX`] (leftovers of an
    /// interrupted restore) and returns how many were removed.
    pub fn remove_stale_temps(&self) -> io::Result<usize> {
        let mut removed = 0;
        for name in self.entries()? {
            let ours = |m: NodeMeta| matches!(m.kind, NodeKind::File | NodeKind::Symlink);
            if is_temp_name(&name) && self.stat(&name)?.is_some_and(ours) {
                match self.unlink_file(&name) {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        if removed > 0 {
            self.sync()?;
        }
        Ok(removed)
    }
}

fn random_temp_name() -> io::Result<OsString> {
    let mut bytes = [0u8; 8];
    crate::random::fill(&mut bytes).map_err(io::Error::other)?;
    Ok(OsString::from(format!(
        "{TEMP_PREFIX}{}",
        crate::hex::encode(bytes)
    )))
}

/// One name of a listing ([`list_names`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub name: CString,
    /// The inode number the listing gives (`d_ino`).
    pub ino: u64,
    /// The type the listing gives (`d_type`, a symlink never followed); `None` where the
    /// filesystem gives none (`DT_UNKNOWN`): [`listed_type_at`] tells it then.
    pub kind: Option<nix::dir::Type>,
}

/// Bytes of directory records one `getdents64` call reads.
#[cfg(target_os = "linux")]
const LIST_BUF: usize = 32 * 1024;

/// The names in the directory open as `fd` (without `.` and `..`) with the inode and type the
/// listing gives each, and the error that stopped the listing, if any (the names read before it are
/// returned). On Linux one `getdents64` call per `buf`-full on the descriptor itself: no `DIR`
/// stream (whose `fdopendir` costs an `fstat` and two `fcntl` calls per directory), no
/// duplicate; the descriptor's read offset is used (the `*at` calls made through it do not use
/// it), so list each descriptor once. The scanner and the git-directory walk both list this way.
#[cfg(target_os = "linux")]
pub fn list_names(fd: &OwnedFd, buf: &mut Vec<u8>) -> (Vec<Listed>, Option<Errno>) {
    /// Offsets of `d_ino` (0), `d_reclen`, `d_type` and `d_name` in a `linux_dirent64` record.
    const RECLEN_AT: usize = 16;
    const TYPE_AT: usize = 18;
    const NAME_AT: usize = 19;
    let mut names = Vec::new();
    buf.resize(LIST_BUF, 0);
    loop {
        // SAFETY: `buf` is valid for writes of `buf.len()` bytes; the kernel writes whole
        // records into it and returns how many bytes it wrote.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd.as_raw_fd(),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let n = match usize::try_from(n) {
            Ok(0) => return (names, None),
            Ok(n) => n.min(buf.len()),
            Err(_) => match Errno::last() {
                Errno::EINTR => continue,
                e => return (names, Some(e)),
            },
        };
        let mut at = 0;
        while at + NAME_AT <= n {
            let len = usize::from(u16::from_ne_bytes([
                buf[at + RECLEN_AT],
                buf[at + RECLEN_AT + 1],
            ]));
            // A record that does not fit is the kernel's or the filesystem's bug: stop there.
            if len <= NAME_AT || at + len > n {
                return (names, Some(Errno::EIO));
            }
            let field = &buf[at + NAME_AT..at + len];
            let name = &field[..field.iter().position(|b| *b == 0).unwrap_or(field.len())];
            if name != b"." && name != b".." {
                if let Ok(name) = CString::new(name) {
                    let mut ino = [0u8; 8];
                    ino.copy_from_slice(&buf[at..at + 8]);
                    names.push(Listed {
                        name,
                        ino: u64::from_ne_bytes(ino),
                        kind: d_type(buf[at + TYPE_AT]),
                    });
                }
            }
            at += len;
        }
    }
}

/// The type a directory record gives (`None` for `DT_UNKNOWN` or anything else).
#[cfg(target_os = "linux")]
fn d_type(t: u8) -> Option<nix::dir::Type> {
    use nix::dir::Type;
    match t {
        libc::DT_DIR => Some(Type::Directory),
        libc::DT_REG => Some(Type::File),
        libc::DT_LNK => Some(Type::Symlink),
        libc::DT_FIFO => Some(Type::Fifo),
        libc::DT_SOCK => Some(Type::Socket),
        libc::DT_CHR => Some(Type::CharacterDevice),
        libc::DT_BLK => Some(Type::BlockDevice),
        _ => None,
    }
}

/// [`list_names`] through a `DIR` stream on a duplicate of `fd` (elsewhere than Linux; the
/// duplicate keeps `fd` usable for `*at` calls).
#[cfg(not(target_os = "linux"))]
pub fn list_names(fd: &OwnedFd, _buf: &mut Vec<u8>) -> (Vec<Listed>, Option<Errno>) {
    let mut names = Vec::new();
    let dup = match nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(0)) {
        Ok(d) => d,
        Err(e) => return (names, Some(e)),
    };
    // `Dir::from_fd` owns (and on failure closes) the duplicate.
    let mut dir = match nix::dir::Dir::from_fd(dup) {
        Ok(d) => d,
        Err(e) => return (names, Some(e)),
    };
    for item in dir.iter() {
        match item {
            Ok(ent) => {
                let n = ent.file_name();
                if n.to_bytes() != b"." && n.to_bytes() != b".." {
                    names.push(Listed {
                        name: n.to_owned(),
                        ino: ent.ino(),
                        kind: ent.file_type(),
                    });
                }
            }
            Err(e) => return (names, Some(e)),
        }
    }
    (names, None)
}

/// The type of `name` below `parent` as `fstatat(AT_SYMLINK_NOFOLLOW)` gives it, for a listing
/// that gave none; `None` when the name is gone or cannot be inspected.
pub fn listed_type_at(parent: &impl AsRawFd, name: &CStr) -> Option<nix::dir::Type> {
    use nix::dir::Type;
    let st = nix::sys::stat::fstatat(Some(parent.as_raw_fd()), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()?;
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    Some(match fmt {
        SFlag::S_IFDIR => Type::Directory,
        SFlag::S_IFREG => Type::File,
        SFlag::S_IFLNK => Type::Symlink,
        SFlag::S_IFIFO => Type::Fifo,
        SFlag::S_IFSOCK => Type::Socket,
        SFlag::S_IFCHR => Type::CharacterDevice,
        _ => Type::BlockDevice,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn components_are_validated() {
        for bad in ["", ".", "..", "a/b", "a\0b"] {
            assert!(component(OsStr::new(bad)).is_err(), "{bad:?}");
        }
        assert!(component(OsStr::new("a.txt")).is_ok());
    }

    #[test]
    fn open_relative_refuses_a_symlinked_component() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("real")).unwrap();
        std::os::unix::fs::symlink(outside.path(), tmp.path().join("link")).unwrap();
        let root = DirHandle::open_root(tmp.path()).unwrap();
        assert!(root.open_relative("real").is_ok());
        let err = root.open_relative("link").unwrap_err();
        assert!(is_not_a_directory(&err), "{err}");
    }

    #[test]
    fn temp_write_rename_noreplace_and_cleanup() {
        let tmp = tempfile::tempdir().unwrap();
        let root = DirHandle::open_root(tmp.path()).unwrap();
        let (mut f, name) = root.create_temp().unwrap();
        f.write_all(b"hello").unwrap();
        assert!(is_temp_name(&name));
        std::fs::write(tmp.path().join("taken"), b"x").unwrap();
        let err = root
            .rename_noreplace(&name, OsStr::new("taken"))
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(tmp.path().join("taken")).unwrap(), b"x");
        assert_eq!(root.remove_stale_temps().unwrap(), 1);
        assert_eq!(root.entries().unwrap(), vec![OsString::from("taken")]);
        let meta = root.stat(OsStr::new("taken")).unwrap().unwrap();
        assert_eq!(meta.kind, NodeKind::File);
        assert!(root.stat(OsStr::new("absent")).unwrap().is_none());
    }

    #[test]
    fn list_names_gives_every_name_with_its_type_and_inode() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::fs::write(t.path().join("f"), "x").unwrap();
        std::os::unix::fs::symlink("f", t.path().join("l")).unwrap();
        let fd = open_dir_path(t.path()).unwrap();
        let (mut names, error) = list_names(&fd, &mut Vec::new());
        assert!(error.is_none());
        names.sort_by(|a, b| a.name.cmp(&b.name));
        use nix::dir::Type;
        let want = [
            ("d", Type::Directory),
            ("f", Type::File),
            ("l", Type::Symlink),
        ];
        assert_eq!(names.len(), want.len());
        for (listed, (name, kind)) in names.iter().zip(want) {
            assert_eq!(listed.name.to_str().unwrap(), name);
            // A filesystem may give no type; the fallback then tells it.
            let got = listed
                .kind
                .or_else(|| listed_type_at(&fd, &listed.name))
                .unwrap();
            assert_eq!(got, kind, "{name}");
            let ino = std::fs::symlink_metadata(t.path().join(name))
                .unwrap()
                .ino();
            assert_eq!(listed.ino, ino, "{name}");
        }
        // More names than one call's buffer holds.
        let many = t.path().join("d");
        for i in 0..2000 {
            let name = format!("a-name-long-enough-to-need-several-buffers-{i:05}");
            std::fs::write(many.join(name), "").unwrap();
        }
        let fd = open_dir_path(&many).unwrap();
        let (names, error) = list_names(&fd, &mut Vec::new());
        assert!(error.is_none());
        assert_eq!(names.len(), 2000);
    }
}
