//! The start gate: a wrapper (bwrap) started before the transaction is ready, whose exec shim
//! waits at this gate before it marks the start and `exec`s the command. The sandbox's setup
//! (namespaces, mounts) then runs while agentdiff captures the tree; the command itself starts
//! only once the before-state and the store snapshot are recorded.
//!
//! The gate is a FIFO in the run capsule, which the sandbox shows read-only: opening a FIFO for
//! reading works on a read-only mount. The host creates it and holds it open read-write, so the
//! shim's open never blocks and its read waits until the host writes the release line
//! `release TOKEN` ([`super::marker_token`], which the command never sees).
//! When the host closes the gate without releasing it (the run was abandoned before the start),
//! the shim reads end-of-file and refuses: nothing of the command runs.
//!
//! Invariants: the shim waits after its argv, namespace and terminal checks and before the start
//! mark, so a held run has never started the command; the host keeps its end open until the
//! wrapper has ended, so a release written before the shim opened the gate is not lost.
//!
//! The token is derived from the salt the shim reads from the secret FIFO (see the parent module):
//! it is in no process's environment or argv, and the command does not exist before the release.
//!
//! Not defended: another process of the same user outside the sandbox that opens the FIFOs before
//! the shim does; such a process can change the tree itself at any time, which the transaction
//! does not defend against either.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::{create_fifo, MarkerError};

/// Environment variable carrying the gate's path to the shim; removed before `exec`. Without
/// it the shim does not wait.
pub const ENV_START_GATE: &str = "AGENTDIFF_EXEC_SHIM_START_GATE";

/// The longest release line the shim reads (`release ` and a 32-digit token, then a newline).
const MAX_LINE: usize = 128;

/// Errors of the host side of the gate.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("the start gate: {0}")]
    Fifo(#[from] MarkerError),
    #[error("could not release the command through the start gate {path}: {source}")]
    Release {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The release line for `token`.
fn release_line(token: &str) -> String {
    format!("release {token}\n")
}

/// The host's end of the gate. Dropping it closes the gate (a shim still waiting refuses) and
/// removes the FIFO.
#[derive(Debug)]
pub struct StartGate {
    path: PathBuf,
    holder: Option<std::fs::File>,
}

impl StartGate {
    /// Create the FIFO at `path` (which must not exist) and hold it open.
    pub fn create(path: &Path) -> Result<StartGate, GateError> {
        // Read-write: the FIFO then always has a writer, so the shim's read waits for the line
        // (or for this end to close) instead of seeing end-of-file at once.
        let holder = create_fifo(path, true)?;
        Ok(StartGate {
            path: path.to_path_buf(),
            holder: Some(holder),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Let the shim start the command. The end stays open until the gate is dropped.
    pub fn release(&mut self, token: &str) -> Result<(), GateError> {
        let failed = |source| GateError::Release {
            path: self.path.clone(),
            source,
        };
        let holder = self
            .holder
            .as_mut()
            .ok_or_else(|| failed(std::io::ErrorKind::BrokenPipe.into()))?;
        // One short write into an empty pipe: atomic, and never blocks.
        holder
            .write_all(release_line(token).as_bytes())
            .map_err(failed)
    }

    /// Close the gate without releasing it: a waiting shim refuses to start the command.
    pub fn close(&mut self) {
        self.holder = None;
    }
}

impl Drop for StartGate {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The shim's side: wait until the host releases the run with `token`. `Err` says why the
/// command must not start (the gate is not a FIFO, the host closed it, a wrong line).
pub fn await_release(path: &Path, token: &str) -> Result<(), String> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    use std::os::fd::AsRawFd;
    // Non-blocking open (a FIFO opens for reading at once), then a blocking read.
    let mut gate = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot open the start gate {}: {e}", path.display()))?;
    let is_fifo = gate.metadata().map(|m| m.file_type().is_fifo());
    if !matches!(is_fifo, Ok(true)) {
        return Err(format!("the start gate {} is not a FIFO", path.display()));
    }
    fcntl(gate.as_raw_fd(), FcntlArg::F_SETFL(OFlag::empty()))
        .map_err(|e| format!("cannot wait at the start gate: {e}"))?;
    // What follows the first line is ignored, as if it were never read: the gate is read once.
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut chunk = [0u8; MAX_LINE];
    while line.len() < MAX_LINE && !line.contains(&b'\n') {
        let room = MAX_LINE - line.len();
        match gate.read(&mut chunk[..room]) {
            Ok(0) => {
                return Err(
                    "agentdiff closed the start gate without releasing the run (it ended the run \
                     before the start)"
                        .into(),
                )
            }
            Ok(n) => line.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("waiting at the start gate failed: {e}")),
        }
    }
    if let Some(end) = line.iter().position(|b| *b == b'\n') {
        line.truncate(end + 1);
    }
    if line == release_line(token).as_bytes() {
        Ok(())
    } else {
        Err("the start gate carried a line that is not this run's release".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(path: PathBuf, token: &'static str) -> std::thread::JoinHandle<Result<(), String>> {
        std::thread::spawn(move || await_release(&path, token))
    }

    #[test]
    fn the_shim_waits_until_the_host_releases_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut gate = StartGate::create(&dir.path().join("gate.fifo")).unwrap();
        let waiting = waiter(gate.path().to_path_buf(), "t0k");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiting.is_finished(),
            "the shim went on before the release"
        );
        gate.release("t0k").unwrap();
        assert_eq!(waiting.join().unwrap(), Ok(()));
    }

    #[test]
    fn a_release_written_before_the_shim_opens_the_gate_is_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let mut gate = StartGate::create(&dir.path().join("gate.fifo")).unwrap();
        gate.release("t0k").unwrap();
        assert_eq!(await_release(gate.path(), "t0k"), Ok(()));
    }

    #[test]
    fn a_closed_gate_or_a_foreign_line_never_releases() {
        let dir = tempfile::tempdir().unwrap();
        let mut gate = StartGate::create(&dir.path().join("gate.fifo")).unwrap();
        let waiting = waiter(gate.path().to_path_buf(), "t0k");
        std::thread::sleep(std::time::Duration::from_millis(50));
        gate.close();
        let refused = waiting.join().unwrap().unwrap_err();
        assert!(refused.contains("without releasing"), "{refused}");
        // Closed before the shim came: end-of-file at once.
        assert!(await_release(gate.path(), "t0k").is_err());

        let mut other = StartGate::create(&dir.path().join("other.fifo")).unwrap();
        other.release("someone-else").unwrap();
        let refused = await_release(other.path(), "t0k").unwrap_err();
        assert!(refused.contains("not this run's release"), "{refused}");
    }

    /// A raw FIFO at `path` that another thread writes `pieces` into, pausing between them. Held
    /// open for writing before it returns, as the host holds its gate.
    fn raw_gate(path: &Path, pieces: Vec<Vec<u8>>) -> std::thread::JoinHandle<()> {
        nix::unistd::mkfifo(path, nix::sys::stat::Mode::S_IRWXU).unwrap();
        // Read-write: opening a FIFO so does not wait for a reader (Linux).
        let mut w = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        std::thread::spawn(move || {
            for piece in pieces {
                std::io::Write::write_all(&mut w, &piece).unwrap();
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        })
    }

    #[test]
    fn the_release_line_counts_however_it_arrives_and_nothing_after_it_does() {
        let dir = tempfile::tempdir().unwrap();
        let line = release_line("t0k").into_bytes();
        let (head, tail) = line.split_at(3);
        // Split over two writes.
        let split = dir.path().join("split.fifo");
        let writer = raw_gate(&split, vec![head.to_vec(), tail.to_vec()]);
        assert_eq!(await_release(&split, "t0k"), Ok(()));
        writer.join().unwrap();
        // Followed by more bytes in the same write: the first line decides.
        let trailing = dir.path().join("trailing.fifo");
        let writer = raw_gate(&trailing, vec![[line.as_slice(), b"junk\n"].concat()]);
        assert_eq!(await_release(&trailing, "t0k"), Ok(()));
        writer.join().unwrap();
        // A longer token that starts with this run's is not its release.
        let longer = dir.path().join("longer.fifo");
        let writer = raw_gate(&longer, vec![release_line("t0kX").into_bytes()]);
        assert!(await_release(&longer, "t0k").is_err());
        writer.join().unwrap();
    }

    #[test]
    fn anything_but_a_fifo_is_refused_and_the_gate_is_removed_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "release t0k\n").unwrap();
        assert!(await_release(&file, "t0k")
            .unwrap_err()
            .contains("not a FIFO"));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(await_release(&link, "t0k").is_err());

        let path = dir.path().join("gate.fifo");
        drop(StartGate::create(&path).unwrap());
        assert!(!path.exists());
    }
}
