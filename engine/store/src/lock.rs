//! One writer per project: `run`, `rollback` and `promote` hold an exclusive `flock` on
//! `ROOT/.agentdiff/lock` for their whole duration.
//!
//! Two runs in one root at once would each record the other's writes as their own changes, and a
//! rollback of one would then delete the other's files. The lock is advisory and kernel-held: it
//! is released when the holding agentdiff exits or is killed (no stale lock file to clean up), and
//! the descriptor is close-on-exec so a wrapped command never inherits it (it could otherwise
//! release or outlive the lock). The holder writes its pid into the file for the waiting message;
//! the pid is informative only.
//!
//! Not defended: a process that ignores the advisory lock (the wrapped command itself, or a
//! second user-level tool) can still write to the tree; this serialises agentdiff runs only.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::Store;

/// Name of the lock file inside `.agentdiff/`.
pub const LOCK_FILE_NAME: &str = "lock";
/// Width the holder's pid is written at (right-aligned): a pid has at most 10 digits.
const PID_WIDTH: usize = 10;

/// Whether to wait for a lock another agentdiff holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Fail at once with [`LockError::Busy`].
    No,
    /// Block until the holder finishes; `on_wait` is told once (with the holder's pid, if known).
    Yes,
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error(
        "another agentdiff{} is running in this project ({}); two runs at once would record each \
         other's changes. Wait for it to finish, or pass --wait to wait for it",
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        path.display()
    )]
    Busy { path: PathBuf, holder: Option<u32> },
    #[error("cannot lock {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

/// The held lock; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub struct StoreLock {
    _file: File,
}

impl Store {
    /// Takes the project lock (see the module docs). With [`Wait::Yes`], `on_wait` is called once
    /// before blocking, with the holder's pid when the file names one.
    pub fn lock(
        &self,
        wait: Wait,
        on_wait: impl FnOnce(Option<u32>),
    ) -> Result<StoreLock, LockError> {
        lock_file(&self.dir().join(LOCK_FILE_NAME), wait, on_wait)
    }
}

fn lock_file(
    path: &Path,
    wait: Wait,
    on_wait: impl FnOnce(Option<u32>),
) -> Result<StoreLock, LockError> {
    let io_err = |source| LockError::Io {
        path: path.to_path_buf(),
        source,
    };
    // O_NOFOLLOW: a planted symlink must not make us create or truncate a file elsewhere.
    let open = |write: bool| {
        OpenOptions::new()
            .read(true)
            .write(write)
            .create(write)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    // On a read-only filesystem an existing lock file still locks (flock needs no write access);
    // whatever then needs to write reports its own failure.
    let mut file = match open(true) {
        Err(e) if e.raw_os_error() == Some(libc::EROFS) => open(false).map_err(io_err)?,
        other => other.map_err(io_err)?,
    };
    if !try_flock(&file, false).map_err(io_err)? {
        let holder = read_pid(&mut file);
        if wait == Wait::No {
            return Err(LockError::Busy {
                path: path.to_path_buf(),
                holder,
            });
        }
        on_wait(holder);
        try_flock(&file, true).map_err(io_err)?;
    }
    // Informative only (see the module docs); a failure here does not weaken the lock. Written
    // over the old text at a fixed width, and the file cut only when it is longer: truncating to
    // nothing and writing again frees and allocates a block on every run.
    let line = format!("{:>width$}\n", std::process::id(), width = PID_WIDTH);
    let _ = file
        .write_all_at(line.as_bytes(), 0)
        .and_then(|()| file.metadata())
        .and_then(|meta| match meta.len() > line.len() as u64 {
            true => file.set_len(line.len() as u64),
            false => Ok(()),
        });
    Ok(StoreLock { _file: file })
}

/// `Ok(false)` when another descriptor holds the lock and `block` is false.
fn try_flock(file: &File, block: bool) -> io::Result<bool> {
    let op = if block {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on a descriptor this function borrows; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !block => return Ok(false),
            _ => return Err(err),
        }
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.take(32).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_second_lock_is_busy_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE_NAME);
        let first = lock_file(&path, Wait::No, |_| {}).unwrap();
        match lock_file(&path, Wait::No, |_| {}) {
            Err(LockError::Busy { holder, .. }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("expected Busy, got {other:?}"),
        }
        drop(first);
        // A child another test thread forked while the lock was held shares it until it execs
        // (the descriptor is close-on-exec, nothing longer), so the release can show a moment
        // late; it must show.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while let Err(e) = lock_file(&path, Wait::No, |_| {}) {
            assert!(std::time::Instant::now() < deadline, "never released: {e}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn the_holder_is_written_over_a_longer_old_text() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(LOCK_FILE_NAME);
        std::fs::write(&path, "123456789012345678901234567890\nleftover\n").unwrap();
        let held = lock_file(&path, Wait::No, |_| {}).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.trim().parse::<u32>().unwrap(), std::process::id());
        assert_eq!(text.len(), PID_WIDTH + 1, "{text:?}");
        drop(held);
    }

    #[test]
    fn a_symlinked_lock_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), dir.path().join("lock")).unwrap();
        assert!(lock_file(&dir.path().join("lock"), Wait::No, |_| {}).is_err());
        assert!(!dir.path().join("elsewhere").exists());
    }
}
