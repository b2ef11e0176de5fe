//! Capturing one regular file: open it relative to its parent directory fd without following
//! links, check it is the file the walk saw, hash it, check it did not change while read, and
//! (before-scan) hand the still-open file to the backup sink.

use std::ffi::CStr;
use std::fs::File;
use std::io::{ErrorKind, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};
use sha2::{Digest, Sha256};

use super::manifest::{unsupported_kind, BackupSkip, BackupState};
use super::BackupRequest;

/// Read size per `read` call; one buffer of this size per worker is reused for every file.
pub(crate) const CHUNK: usize = 256 * 1024;

/// The metadata the walk records for a path (from `fstatat(AT_SYMLINK_NOFOLLOW)` or `fstat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta {
    /// `st_mode & S_IFMT`.
    pub fmt: u32,
    /// `st_mode & 0o7777`.
    pub perm: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub dev: u64,
    pub ino: u64,
    pub nlink: u64,
}

impl Meta {
    // `stat` field types differ between platforms (e.g. `st_mode` is u16 on macOS).
    #[allow(clippy::useless_conversion, clippy::unnecessary_cast)]
    pub(crate) fn from_stat(st: &FileStat) -> Self {
        let mode = u32::from(st.st_mode);
        Self {
            fmt: mode & (SFlag::S_IFMT.bits() as u32),
            perm: mode & 0o7777,
            size: u64::try_from(st.st_size).unwrap_or(0),
            mtime_ns: ns(st.st_mtime as i64, st.st_mtime_nsec as i64),
            ctime_ns: ns(st.st_ctime as i64, st.st_ctime_nsec as i64),
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
            nlink: st.st_nlink as u64,
        }
    }

    pub(crate) fn is(&self, flag: SFlag) -> bool {
        #[allow(clippy::unnecessary_cast)]
        let bits = flag.bits() as u32;
        self.fmt == bits
    }

    /// Same object (device, inode, type).
    fn same_identity(&self, other: &Meta) -> bool {
        self.dev == other.dev && self.ino == other.ino && self.fmt == other.fmt
    }

    /// Same object with the same size, mtime and ctime (content presumed unchanged).
    fn same_content_stamp(&self, other: &Meta) -> bool {
        self.same_identity(other)
            && self.size == other.size
            && self.mtime_ns == other.mtime_ns
            && self.ctime_ns == other.ctime_ns
    }
}

fn ns(sec: i64, nsec: i64) -> i64 {
    sec.saturating_mul(1_000_000_000).saturating_add(nsec)
}

/// What capturing one file produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Captured {
    pub sha256: Option<String>,
    pub backup: BackupState,
    /// `(kind, reason)` for `Manifest::unsupported` when the content was not captured.
    pub problem: Option<(&'static str, String)>,
    pub bytes_hashed: u64,
    pub backup_stored: bool,
    pub backup_reused: bool,
}

impl Captured {
    fn failed(
        kind: &'static str,
        reason: String,
        backup: Option<&BackupRequest>,
        skip: BackupSkip,
    ) -> Self {
        Self {
            sha256: None,
            backup: if backup.is_some() {
                BackupState::Skipped {
                    reason: skip,
                    detail: None,
                }
            } else {
                BackupState::NotRequested
            },
            problem: Some((kind, reason)),
            bytes_hashed: 0,
            backup_stored: false,
            backup_reused: false,
        }
    }
}

/// Captures the regular file `name` in the directory `parent`, expected to match `seen` (the
/// walk's lstat). `after_read` runs between hashing and the final fstat (a test hook).
pub(crate) fn capture(
    parent: &OwnedFd,
    name: &CStr,
    seen: &Meta,
    backup: Option<&BackupRequest>,
    buf: &mut [u8],
    after_read: &dyn Fn(),
) -> Captured {
    use unsupported_kind::{CHANGED_DURING_CAPTURE as CHANGED, UNREADABLE};
    let changed = |reason: String| {
        Captured::failed(CHANGED, reason, backup, BackupSkip::ChangedDuringCapture)
    };
    let unreadable =
        |reason: String| Captured::failed(UNREADABLE, reason, backup, BackupSkip::NotHashed);

    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY;
    let fd = match openat(Some(parent.as_raw_fd()), name, flags, Mode::empty()) {
        // SAFETY: `openat` just returned this descriptor and nothing else owns it.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(Errno::ELOOP) => {
            return changed("replaced by a symlink before it could be opened".into())
        }
        Err(Errno::ENOENT) => return changed("removed before it could be opened".into()),
        Err(e) => return unreadable(format!("cannot open: {}", e.desc())),
    };
    let opened = match fstat(fd.as_raw_fd()) {
        Ok(st) => Meta::from_stat(&st),
        Err(e) => return unreadable(format!("cannot fstat: {}", e.desc())),
    };
    if !opened.same_content_stamp(seen) {
        return changed("replaced or modified between lstat and open".into());
    }
    let mut file = File::from(fd);

    let mut hasher = Sha256::new();
    let mut total: u64 = 0;
    // Read at most one byte more than expected: enough to notice growth, never unbounded.
    let limit = seen.size.saturating_add(1);
    loop {
        let want = usize::try_from(limit - total).map_or(buf.len(), |r| r.min(buf.len()));
        if want == 0 {
            break;
        }
        match file.read(&mut buf[..want]) {
            Ok(0) => break,
            Ok(n) => {
                hasher.update(&buf[..n]);
                total += n as u64;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return unreadable(format!("read failed: {e}")),
        }
    }
    after_read();
    let after = match fstat(file.as_raw_fd()) {
        Ok(st) => Meta::from_stat(&st),
        Err(e) => return unreadable(format!("cannot fstat: {}", e.desc())),
    };
    if total != seen.size || !after.same_content_stamp(&opened) {
        return changed(format!(
            "size, mtime or ctime changed while hashing (expected {} bytes, read {total})",
            seen.size
        ));
    }
    let sha = hex::encode(hasher.finalize());

    let mut out = Captured {
        sha256: None,
        backup: BackupState::NotRequested,
        problem: None,
        bytes_hashed: total,
        backup_stored: false,
        backup_reused: false,
    };
    if let Some(req) = backup {
        out.backup = backup_state(req, seen, &sha, &mut out, Some(&mut file));
    }
    out.sha256 = Some(sha);
    out
}

/// Decides (and, with an open `file`, performs) the backup of a hashed file.
pub(crate) fn backup_state(
    req: &BackupRequest,
    seen: &Meta,
    sha: &str,
    out: &mut Captured,
    file: Option<&mut File>,
) -> BackupState {
    let skip = |reason, detail| BackupState::Skipped { reason, detail };
    if seen.nlink > 1 {
        return skip(BackupSkip::Hardlinked, None);
    }
    if seen.size > req.max_file_bytes {
        return skip(BackupSkip::TooLarge, None);
    }
    if req.sink.contains(sha, seen.size) {
        out.backup_reused = true;
        return BackupState::Stored;
    }
    let Some(file) = file else {
        return skip(BackupSkip::StoreFailed, Some("file not open".into()));
    };
    match req.sink.store_from(file, sha, seen.size) {
        Ok(()) => {
            out.backup_stored = true;
            BackupState::Stored
        }
        Err(e) => skip(BackupSkip::StoreFailed, Some(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    fn dirfd(p: &std::path::Path) -> OwnedFd {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(p)
            .unwrap();
        OwnedFd::from(f)
    }

    fn lstat(p: &std::path::Path) -> Meta {
        Meta::from_stat(&nix::sys::stat::lstat(p).unwrap())
    }

    #[test]
    fn hashes_a_file() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("f"), b"abc").unwrap();
        let mut buf = vec![0u8; 7]; // tiny buffer: exercises the chunk loop
        let c = capture(
            &dirfd(d.path()),
            &CString::new("f").unwrap(),
            &lstat(&d.path().join("f")),
            None,
            &mut buf,
            &|| {},
        );
        assert_eq!(
            c.sha256.as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert_eq!(c.problem, None);
        assert_eq!(c.bytes_hashed, 3);
        assert_eq!(c.backup, BackupState::NotRequested);
    }

    #[test]
    fn growth_during_hashing_is_changed_during_capture() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, vec![1u8; 1000]).unwrap();
        let seen = lstat(&p);
        let mut buf = vec![0u8; CHUNK];
        let grow = || {
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(b"more").unwrap();
        };
        let c = capture(
            &dirfd(d.path()),
            &CString::new("f").unwrap(),
            &seen,
            None,
            &mut buf,
            &grow,
        );
        assert_eq!(c.sha256, None);
        assert_eq!(c.problem.map(|p| p.0), Some("changed_during_capture"));
    }

    #[test]
    fn in_place_rewrite_during_hashing_is_changed_during_capture() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"aaaa").unwrap();
        let seen = lstat(&p);
        let mut buf = vec![0u8; CHUNK];
        // Same size; mtime may even stay within the same tick, but ctime/mtime stamps move on write
        // or we force a different mtime to be certain.
        let rewrite = || {
            std::fs::write(&p, b"bbbb").unwrap();
            let t = std::fs::FileTimes::new().set_modified(std::time::SystemTime::UNIX_EPOCH);
            std::fs::File::options()
                .write(true)
                .open(&p)
                .unwrap()
                .set_times(t)
                .unwrap();
        };
        let c = capture(
            &dirfd(d.path()),
            &CString::new("f").unwrap(),
            &seen,
            None,
            &mut buf,
            &rewrite,
        );
        assert_eq!(c.problem.map(|p| p.0), Some("changed_during_capture"));
    }

    #[test]
    fn replaced_by_symlink_before_open_is_not_followed() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let seen = lstat(&p);
        std::fs::remove_file(&p).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
        let mut buf = vec![0u8; CHUNK];
        let c = capture(
            &dirfd(d.path()),
            &CString::new("f").unwrap(),
            &seen,
            None,
            &mut buf,
            &|| {},
        );
        assert_eq!(c.sha256, None);
        assert_eq!(c.problem.map(|p| p.0), Some("changed_during_capture"));
    }

    #[test]
    fn replaced_by_fifo_before_open_does_not_hang() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"abc").unwrap();
        let seen = lstat(&p);
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, Mode::from_bits_truncate(0o600)).unwrap();
        let mut buf = vec![0u8; CHUNK];
        let c = capture(
            &dirfd(d.path()),
            &CString::new("f").unwrap(),
            &seen,
            None,
            &mut buf,
            &|| {},
        );
        assert_eq!(c.problem.map(|p| p.0), Some("changed_during_capture"));
    }
}
