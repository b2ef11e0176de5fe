//! The workspace as a tar stream, both ways, for engines that share no filesystem with this
//! machine (remote mode): [`pack`] builds the archive agentdiff uploads into the container;
//! [`unpack`] checks and writes the archive the engine sends back.
//!
//! Invariants of [`pack`]: the walk uses `lstat` only and never follows a symlink (a link is
//! archived as a link); only directories, regular files and symlinks are archived, anything else
//! (FIFO, socket, device) refuses the whole pack rather than leaving a path out; every entry is
//! owned by the container user (numeric ids in the headers), so the command can write what it
//! was given.
//!
//! Invariants of [`unpack`] (the archive is untrusted, written by whatever ran in the container
//! and relayed by the engine): it writes only into `dest`, which must be a fresh empty directory;
//! an entry name is relative, has no `..` component and is at most [`Limits::max_path_bytes`]
//! long; every ancestor of an entry is a directory this archive created (never a symlink, never
//! a directory that was there before); a path appears once; a symlink is created as a symlink with
//! its target verbatim and is never followed; a hard link may only name a regular file written
//! earlier from this archive; character and block devices, FIFOs and unknown entry types are
//! refused; the entry count (PAX global headers included), the sum of file sizes (the effective
//! size, a PAX `size` record included, checked before writing, and the bytes actually written)
//! and the raw stream length are bounded ([`Limits`]); an archive without its end-of-archive
//! marker or with an entry shorter than its size is refused (a cut stream would make the missing
//! files look deleted); a modification time past 9999-12-31 is clamped to it. setuid and setgid
//! bits are dropped (files are written by this process's user, possibly root) and the paths
//! reported. On any refusal the caller discards `dest`. No header makes the parser panic.
//!
//! Not defended: another process of the same user writing into `dest` while it is unpacked (the
//! caller creates it 0700 inside agentdiff's private store); ownership and timestamps of
//! symlinks; the mode and timestamps of the workspace root itself (the caller keeps its own).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::options::UserSpec;

/// Bounds on an archive coming back from an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Entries of any kind.
    pub max_entries: u64,
    /// Sum of the sizes of regular files.
    pub max_file_bytes: u64,
    /// Length of one entry name or symlink target, in bytes.
    pub max_path_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_entries: 1_000_000,
            max_file_bytes: 16 << 30,
            max_path_bytes: 4096,
        }
    }
}

impl Limits {
    /// The raw stream may exceed the file bytes by headers and padding: 3 KiB per entry covers a
    /// header, a long-name or PAX record and the padding of each.
    fn max_stream_bytes(&self) -> u64 {
        self.max_file_bytes
            .saturating_add(self.max_entries.saturating_mul(3072))
            .saturating_add(1 << 20)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the archive could not be read: {0}")]
    Read(#[source] io::Error),
    #[error("the archive could not be written: {0}")]
    Write(#[source] io::Error),
    #[error("refused archive entry {0:?}: absolute name")]
    Absolute(String),
    #[error("refused archive entry {0:?}: a `..` component")]
    Traversal(String),
    #[error("refused archive entry {0:?}: name or link target longer than {1} bytes")]
    TooLong(String, usize),
    #[error("refused archive entry {0:?}: the path appears twice")]
    Duplicate(String),
    #[error("refused archive entry {path:?}: its ancestor {ancestor:?} is not a directory of this archive")]
    NotUnderDirectory { path: String, ancestor: String },
    #[error("refused archive entry {path:?}: hard link to {target:?}, which is not a regular file earlier in the archive")]
    HardLinkOutside { path: String, target: String },
    #[error("refused archive entry {path:?}: {kind} entries are not accepted")]
    Special { path: String, kind: String },
    #[error("refused archive entry {0:?}: symlink without a target")]
    EmptyLink(String),
    #[error("the archive has more than {0} entries")]
    TooManyEntries(u64),
    #[error("the archive's files exceed {0} bytes in total")]
    TooLarge(u64),
    #[error("refused archive entry {path:?}: it holds {got} bytes of content where its header says {declared}")]
    ShortEntry {
        path: String,
        declared: u64,
        got: u64,
    },
    #[error("the archive ends without its end-of-archive marker: the stream was cut short, so entries may be missing")]
    Truncated,
    #[error("{0} is a FIFO, socket or device; remote runs ship only directories, regular files and symlinks")]
    Unshippable(String),
}

/// What one direction of shipping moved.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shipped {
    pub entries: u64,
    /// Bytes of the tar stream itself.
    pub stream_bytes: u64,
    /// Sum of the sizes of the regular files.
    pub file_bytes: u64,
    /// Files whose setuid/setgid bits were dropped on unpack.
    pub dropped_special_bits: Vec<String>,
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// A writer that counts what passes through it.
struct Counting<W> {
    inner: W,
    count: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.count += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Archive the contents of `dir` (not `dir` itself) into `out`, entries owned by `owner`.
pub fn pack<W: Write>(dir: &Path, owner: UserSpec, out: W) -> Result<Shipped, ArchiveError> {
    let mut builder = tar::Builder::new(Counting {
        inner: out,
        count: 0,
    });
    let mut shipped = Shipped::default();
    let root_meta = std::fs::symlink_metadata(dir).map_err(io_at(dir))?;
    let mut header = entry_header(&root_meta, owner, tar::EntryType::Directory);
    builder
        .append_data(&mut header, ".", io::empty())
        .map_err(ArchiveError::Write)?;
    shipped.entries += 1;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        let mut names: Vec<_> = std::fs::read_dir(&abs)
            .map_err(io_at(&abs))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<io::Result<_>>()
            .map_err(io_at(&abs))?;
        names.sort();
        for name in names {
            let rel_path = rel.join(&name);
            let path = dir.join(&rel_path);
            let meta = std::fs::symlink_metadata(&path).map_err(io_at(&path))?;
            let ft = meta.file_type();
            if ft.is_dir() {
                let mut h = entry_header(&meta, owner, tar::EntryType::Directory);
                builder
                    .append_data(&mut h, &rel_path, io::empty())
                    .map_err(ArchiveError::Write)?;
                stack.push(rel_path);
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&path).map_err(io_at(&path))?;
                let mut h = entry_header(&meta, owner, tar::EntryType::Symlink);
                builder
                    .append_link(&mut h, &rel_path, &target)
                    .map_err(ArchiveError::Write)?;
            } else if ft.is_file() {
                // O_NOFOLLOW: the entry was a regular file at lstat; a swap to a link is an error.
                let file = OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&path)
                    .map_err(io_at(&path))?;
                let meta = file.metadata().map_err(io_at(&path))?;
                let mut h = entry_header(&meta, owner, tar::EntryType::Regular);
                h.set_size(meta.len());
                builder
                    .append_data(&mut h, &rel_path, file.take(meta.len()))
                    .map_err(ArchiveError::Write)?;
                shipped.file_bytes += meta.len();
            } else {
                return Err(ArchiveError::Unshippable(rel_path.display().to_string()));
            }
            shipped.entries += 1;
        }
    }
    let counting = builder.into_inner().map_err(ArchiveError::Write)?;
    shipped.stream_bytes = counting.count;
    let mut inner = counting.inner;
    inner.flush().map_err(ArchiveError::Write)?;
    Ok(shipped)
}

fn entry_header(meta: &std::fs::Metadata, owner: UserSpec, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(meta.mode() & 0o7777);
    h.set_uid(owner.uid.into());
    h.set_gid(owner.gid.into());
    h.set_mtime(meta.mtime().max(0) as u64);
    h.set_size(0);
    h
}

/// A reader that fails once more than `limit` bytes were read (bounds memory the tar parser
/// spends on long names and PAX records as well as the time spent on an endless stream).
/// It also notes whether the stream ended: the tar parser treats an end of stream on a header
/// boundary like the end-of-archive marker, and a cut stream must not pass for a complete one.
struct Bounded<R> {
    inner: R,
    count: u64,
    limit: u64,
    ended: bool,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.ended = true;
        }
        self.count += n as u64;
        if self.count > self.limit {
            return Err(io::Error::other(format!(
                "the stream exceeds {} bytes",
                self.limit
            )));
        }
        Ok(n)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Link,
}

/// Check and write the archive `input` into `dest` (an empty directory this process created).
pub fn unpack<R: Read>(input: R, dest: &Path, limits: &Limits) -> Result<Shipped, ArchiveError> {
    let mut archive = tar::Archive::new(Bounded {
        inner: input,
        count: 0,
        limit: limits.max_stream_bytes(),
        ended: false,
    });
    let mut state = Unpacker {
        dest,
        limits,
        kinds: HashMap::new(),
        dirs: Vec::new(),
        implicit: Default::default(),
        shipped: Shipped::default(),
    };
    for entry in archive.entries().map_err(ArchiveError::Read)? {
        let entry = entry.map_err(ArchiveError::Read)?;
        state.entry(entry)?;
    }
    // The parser stops at the first zero block (the marker) or at the end of the stream; only
    // the first leaves the stream unfinished.
    let stream = archive.into_inner();
    if stream.ended {
        return Err(ArchiveError::Truncated);
    }
    // Directory modes and times last, deepest first: a read-only directory is filled before it
    // becomes read-only.
    let mut dirs = std::mem::take(&mut state.dirs);
    dirs.sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
    for (rel, mode, mtime) in dirs {
        let path = dest.join(&rel);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .map_err(io_at(&path))?;
        if let Ok(dir) = File::open(&path) {
            // Best effort: a directory's time is evidence of nothing the scan relies on.
            let _ = dir.set_modified(mtime);
        }
    }
    state.shipped.stream_bytes = stream.count;
    Ok(state.shipped)
}

struct Unpacker<'a> {
    dest: &'a Path,
    limits: &'a Limits,
    kinds: HashMap<PathBuf, Kind>,
    dirs: Vec<(PathBuf, u32, SystemTime)>,
    /// Directories created for an entry below them before (or without) their own entry.
    implicit: std::collections::HashSet<PathBuf>,
    shipped: Shipped,
}

impl Unpacker<'_> {
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), ArchiveError> {
        let kind = entry.header().entry_type();
        // Counted before anything else: a global header is an entry the parser reads too.
        self.shipped.entries += 1;
        if self.shipped.entries > self.limits.max_entries {
            return Err(ArchiveError::TooManyEntries(self.limits.max_entries));
        }
        if kind == tar::EntryType::XGlobalHeader {
            return Ok(());
        }
        let raw = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw).into_owned();
        let Some(rel) = checked_name(&raw, self.limits)? else {
            // The archive's root is the workspace itself, which the caller owns.
            return if kind == tar::EntryType::Directory {
                Ok(())
            } else {
                Err(ArchiveError::Special {
                    path: shown,
                    kind: "non-directory root".into(),
                })
            };
        };
        if self.kinds.contains_key(&rel) {
            // A directory created implicitly for an earlier entry may still be listed itself.
            if kind == tar::EntryType::Directory && self.implicit.remove(&rel) {
                let header = entry.header();
                let mode = header.mode().map_err(ArchiveError::Read)? & 0o1777;
                let mtime = entry_mtime(header);
                if let Some(d) = self.dirs.iter_mut().find(|(p, _, _)| *p == rel) {
                    (d.1, d.2) = (mode, mtime);
                }
                return Ok(());
            }
            return Err(ArchiveError::Duplicate(shown));
        }
        self.ancestors(&rel, &shown)?;
        let path = self.dest.join(&rel);
        let header = entry.header();
        let mode = header.mode().map_err(ArchiveError::Read)? & 0o7777;
        let mtime = entry_mtime(header);
        match kind {
            tar::EntryType::Directory => {
                std::fs::create_dir(&path).map_err(io_at(&path))?;
                self.dirs.push((rel.clone(), mode & 0o1777, mtime));
                self.kinds.insert(rel, Kind::Dir);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if mode & 0o6000 != 0 {
                    self.shipped.dropped_special_bits.push(shown.clone());
                }
                self.write_file(&mut entry, &path, &shown, mode, mtime)?;
                self.kinds.insert(rel, Kind::File);
            }
            tar::EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| ArchiveError::EmptyLink(shown.clone()))?;
                if target.len() > self.limits.max_path_bytes {
                    return Err(ArchiveError::TooLong(shown, self.limits.max_path_bytes));
                }
                // Created, never followed: the scan records it as a link with this target.
                std::os::unix::fs::symlink(OsStr::from_bytes(&target), &path)
                    .map_err(io_at(&path))?;
                self.kinds.insert(rel, Kind::Link);
            }
            tar::EntryType::Link => {
                let raw_target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let target = checked_name(&raw_target, self.limits)?;
                let inside = target
                    .as_ref()
                    .filter(|t| self.kinds.get(*t) == Some(&Kind::File));
                let Some(target) = inside else {
                    return Err(ArchiveError::HardLinkOutside {
                        path: shown,
                        target: String::from_utf8_lossy(&raw_target).into_owned(),
                    });
                };
                // linkat(2) without AT_SYMLINK_FOLLOW; the target is a file this archive wrote.
                std::fs::hard_link(self.dest.join(target), &path).map_err(io_at(&path))?;
                self.kinds.insert(rel, Kind::File);
            }
            other => {
                return Err(ArchiveError::Special {
                    path: shown,
                    kind: entry_kind_name(other),
                })
            }
        }
        Ok(())
    }

    /// Write one regular file. The size that counts is the entry's effective size (a PAX `size`
    /// record overrides the header's), checked before writing, and the bytes actually written
    /// are what the limit and the evidence add up.
    fn write_file<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        path: &Path,
        shown: &str,
        mode: u32,
        mtime: SystemTime,
    ) -> Result<(), ArchiveError> {
        let declared = entry.size();
        let budget = self
            .limits
            .max_file_bytes
            .saturating_sub(self.shipped.file_bytes);
        if declared > budget {
            return Err(ArchiveError::TooLarge(self.limits.max_file_bytes));
        }
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(io_at(path))?;
        // One byte past the budget is enough to know it was exceeded.
        let written = io::copy(&mut entry.take(budget.saturating_add(1)), &mut file)
            .map_err(ArchiveError::Read)?;
        self.shipped.file_bytes = self.shipped.file_bytes.saturating_add(written);
        if self.shipped.file_bytes > self.limits.max_file_bytes {
            return Err(ArchiveError::TooLarge(self.limits.max_file_bytes));
        }
        if written != declared {
            return Err(ArchiveError::ShortEntry {
                path: shown.to_string(),
                declared,
                got: written,
            });
        }
        file.set_permissions(std::fs::Permissions::from_mode(mode & 0o1777))
            .map_err(io_at(path))?;
        file.set_modified(mtime).map_err(io_at(path))
    }

    /// Every ancestor is a directory of this archive; missing ones are created (engines list
    /// directories first, but the format does not require it).
    fn ancestors(&mut self, rel: &Path, shown: &str) -> Result<(), ArchiveError> {
        let mut prefix = PathBuf::new();
        let parts: Vec<_> = rel.components().collect();
        for part in &parts[..parts.len().saturating_sub(1)] {
            prefix.push(part);
            match self.kinds.get(&prefix) {
                Some(Kind::Dir) => {}
                Some(_) => {
                    return Err(ArchiveError::NotUnderDirectory {
                        path: shown.to_string(),
                        ancestor: prefix.display().to_string(),
                    })
                }
                None => {
                    let path = self.dest.join(&prefix);
                    std::fs::create_dir(&path).map_err(io_at(&path))?;
                    self.dirs.push((prefix.clone(), 0o755, SystemTime::now()));
                    self.kinds.insert(prefix.clone(), Kind::Dir);
                    self.implicit.insert(prefix.clone());
                }
            }
        }
        Ok(())
    }
}

/// Latest modification time written (9999-12-31T23:59:59Z): a header may encode any 64-bit
/// time (GNU base-256), far past what `SystemTime` or a filesystem holds.
const MAX_MTIME_SECS: u64 = 253_402_300_799;

/// The entry's modification time, clamped to [`MAX_MTIME_SECS`]; an unreadable field is the
/// epoch. Never overflows.
fn entry_mtime(header: &tar::Header) -> SystemTime {
    let secs = header.mtime().unwrap_or(0).min(MAX_MTIME_SECS);
    UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .unwrap_or(UNIX_EPOCH)
}

fn entry_kind_name(kind: tar::EntryType) -> String {
    match kind {
        tar::EntryType::Char => "character device".into(),
        tar::EntryType::Block => "block device".into(),
        tar::EntryType::Fifo => "FIFO".into(),
        tar::EntryType::GNUSparse => "sparse file".into(),
        other => format!("type {:?}", other.as_byte() as char),
    }
}

/// The relative path an entry name denotes; `None` for the archive's root (`.`, `./`).
fn checked_name(raw: &[u8], limits: &Limits) -> Result<Option<PathBuf>, ArchiveError> {
    let shown = || String::from_utf8_lossy(raw).into_owned();
    if raw.len() > limits.max_path_bytes {
        return Err(ArchiveError::TooLong(shown(), limits.max_path_bytes));
    }
    if raw.first() == Some(&b'/') {
        return Err(ArchiveError::Absolute(shown()));
    }
    let mut rel = PathBuf::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(ArchiveError::Traversal(shown())),
            p => rel.push(OsStr::from_bytes(p)),
        }
    }
    Ok((!rel.as_os_str().is_empty()).then_some(rel))
}

#[cfg(test)]
mod tests;
