//! The command's standard streams never reach a host file or directory.
//!
//! `/proc/self/fd/N` is a magic link: a command whose stdin is `~/notes.txt` can open
//! `/proc/self/fd/0` for writing and overwrite it, and one whose stdin is `~` can open files below
//! it, whatever a sandbox's mounts say. So every stream that is not a terminal, a pipe or the null
//! device (a regular file, a directory, a socket, another device, …) is handed to the command as
//! a pipe agentdiff creates, with a thread copying between that pipe and the real stream: the
//! command gets the bytes, never the descriptor.
//!
//! Invariants: a terminal stays the command's terminal (job control, raw mode, the TIOCSTI guard
//! of the wrapping backends); a pipe is passed as it is; so is the null device (character device
//! 1:3, told by its device number, not its path), which reopened reaches nothing but itself. Reopening an inherited pipe through
//! `/proc/self/fd` reaches only that pipe (either of its ends): the command can read what other
//! writers put into it and write into it, but no file or directory of the host.
//!
//! Not defended: a terminal reopened through `/proc` is the same terminal (the command already
//! holds it); a pipe is shared with whoever else holds it. Output relayed after the command
//! ended is flushed before the evidence is returned, except from a process that escaped cleanup
//! and still holds the pipe: its output is dropped after [`DRAIN_LIMIT`].

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How long the output relays may still run after the command and its processes ended.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(2);

/// Which stream a relay serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdin,
    Stdout,
    Stderr,
}

/// One stream handed to the command through a pipe, and what it really was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Relayed {
    pub stream: Stream,
    /// `regular_file`, `directory`, `socket`, `character_device`, `block_device` or `other`.
    pub kind: String,
}

/// Errors setting a relay up.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("could not open {what} as the command's {stream:?}: {source}")]
    Open {
        stream: Stream,
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not inspect the command's {stream:?}: {source}")]
    Inspect {
        stream: Stream,
        #[source]
        source: nix::Error,
    },
    #[error("could not create a pipe to relay the command's {stream:?}: {source}")]
    Pipe {
        stream: Stream,
        #[source]
        source: nix::Error,
    },
    #[error("could not duplicate the command's {stream:?}: {source}")]
    Duplicate {
        stream: Stream,
        #[source]
        source: std::io::Error,
    },
    #[error("could not start the relay thread for the command's {stream:?}: {source}")]
    Thread {
        stream: Stream,
        #[source]
        source: std::io::Error,
    },
}

/// The relays of one launch: the output threads to wait for, and what was relayed.
#[derive(Debug, Default)]
pub struct Relays {
    outputs: Vec<std::sync::mpsc::Receiver<()>>,
    pub relayed: Vec<Relayed>,
}

impl Relays {
    /// `stream: kind` for each relayed stream, as the evidence records them.
    pub fn names(&self) -> Vec<String> {
        self.relayed
            .iter()
            .map(|r| {
                let stream = match r.stream {
                    Stream::Stdin => "stdin",
                    Stream::Stdout => "stdout",
                    Stream::Stderr => "stderr",
                };
                format!("{stream}: {}", r.kind)
            })
            .collect()
    }

    /// Wait (at most [`DRAIN_LIMIT`] in all) until the output relays copied everything the
    /// command's processes wrote. `false` when one still runs (a writer outlived cleanup).
    pub fn drain(&mut self) -> bool {
        let deadline = std::time::Instant::now() + DRAIN_LIMIT;
        self.outputs.drain(..).all(|done| {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            !matches!(
                done.recv_timeout(left),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
            )
        })
    }
}

/// The null device's number (Linux `mem` driver, minor 3): the same device whatever node or
/// path names it.
const NULL_DEVICE: (u64, u64) = (1, 3);

/// What the descriptor is, or `None` for a terminal, a pipe or the null device (passed as they
/// are).
fn needs_relay(fd: BorrowedFd<'_>, stream: Stream) -> Result<Option<&'static str>, RelayError> {
    use nix::sys::stat::{fstat, major, minor, SFlag};
    let st = fstat(fd.as_raw_fd()).map_err(|source| RelayError::Inspect { stream, source })?;
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFIFO || nix::unistd::isatty(fd.as_raw_fd()).unwrap_or(false) {
        return Ok(None);
    }
    // Reopened through `/proc/self/fd`, the null device is the null device: it reaches no file,
    // and every sandbox shows the command one anyway. Relaying it would cost a thread per stream
    // and nothing would be defended.
    if kind == SFlag::S_IFCHR && (major(st.st_rdev), minor(st.st_rdev)) == NULL_DEVICE {
        return Ok(None);
    }
    Ok(Some(match kind {
        SFlag::S_IFREG => "regular_file",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR => "character_device",
        SFlag::S_IFBLK => "block_device",
        _ => "other",
    }))
}

/// Copy `from` into `to` until either ends.
fn copy(from: OwnedFd, to: OwnedFd) {
    let mut from = std::fs::File::from(from);
    let mut to = std::fs::File::from(to);
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A directory (EISDIR) or a socket that failed: the command sees end-of-file.
            Err(_) => return,
        };
        if to.write_all(&buf[..n]).is_err() {
            return;
        }
    }
}

/// Replace every stream of `stdio` (the command's fds 0–2; `None` inherits agentdiff's own)
/// that is not a terminal or a pipe with a relayed pipe.
pub fn relay_stdio(
    stdio: [Option<OwnedFd>; 3],
) -> Result<([Option<OwnedFd>; 3], Relays), RelayError> {
    let streams = [Stream::Stdin, Stream::Stdout, Stream::Stderr];
    let mut relays = Relays::default();
    let mut out: [Option<OwnedFd>; 3] = [None, None, None];
    for (i, given) in stdio.into_iter().enumerate() {
        let stream = streams[i];
        let own = match &given {
            Some(fd) => Some(fd.as_fd()),
            // SAFETY: fds 0–2 of this process; borrowed only for this iteration, and checked
            // with fcntl before use (a closed one is left alone).
            None => Some(unsafe { BorrowedFd::borrow_raw(i as i32) })
                .filter(|fd| nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::F_GETFD).is_ok()),
        };
        let Some(fd) = own else {
            out[i] = given;
            continue;
        };
        let Some(kind) = needs_relay(fd, stream)? else {
            out[i] = given;
            continue;
        };
        let source = match given {
            Some(owned) => owned,
            None => fd
                .try_clone_to_owned()
                .map_err(|source| RelayError::Duplicate { stream, source })?,
        };
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|source| RelayError::Pipe { stream, source })?;
        let (child_end, from, to) = match stream {
            Stream::Stdin => (read, source, write),
            Stream::Stdout | Stream::Stderr => (write, read, source),
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name(format!("agentdiff-relay-{i}"))
            .spawn(move || {
                copy(from, to);
                let _ = done_tx.send(());
            })
            .map_err(|source| RelayError::Thread { stream, source })?;
        if stream != Stream::Stdin {
            relays.outputs.push(done_rx);
        }
        relays.relayed.push(Relayed {
            stream,
            kind: kind.to_string(),
        });
        out[i] = Some(child_end);
    }
    Ok((out, relays))
}

/// The command's fds 0, 1 and 2 for `mode` (`None`: inherit agentdiff's own): the files of
/// [`StdioMode::Files`] (stdin `/dev/null` when none is given), or a duplicate of agentdiff's
/// stderr as stdout for [`StdioMode::StdoutToStderr`]. The one way every launcher opens them.
pub fn open_stdio(
    mode: &agentdiff_backend_api::StdioMode,
) -> Result<[Option<OwnedFd>; 3], RelayError> {
    use agentdiff_backend_api::StdioMode;
    let open = |p: &std::path::Path, write: bool, stream: Stream| {
        let f = if write {
            std::fs::File::create(p)
        } else {
            std::fs::File::open(p)
        };
        f.map(OwnedFd::from).map_err(|source| RelayError::Open {
            stream,
            what: p.display().to_string(),
            source,
        })
    };
    Ok(match mode {
        StdioMode::Inherit => [None, None, None],
        StdioMode::StdoutToStderr => {
            let err = std::io::stderr()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|source| RelayError::Duplicate {
                    stream: Stream::Stderr,
                    source,
                })?;
            [None, Some(err), None]
        }
        StdioMode::Files {
            stdin,
            stdout,
            stderr,
        } => [
            Some(open(
                stdin
                    .as_deref()
                    .unwrap_or(std::path::Path::new("/dev/null")),
                false,
                Stream::Stdin,
            )?),
            Some(open(stdout, true, Stream::Stdout)?),
            Some(open(stderr, true, Stream::Stderr)?),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_directories_are_relayed_and_pipes_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.txt");
        std::fs::write(&input, "hello\n").unwrap();
        let output = dir.path().join("out.txt");
        let (pipe_read, pipe_write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
        drop(pipe_read);
        let stdio = [
            Some(OwnedFd::from(std::fs::File::open(&input).unwrap())),
            Some(OwnedFd::from(std::fs::File::create(&output).unwrap())),
            Some(pipe_write),
        ];
        let (fds, mut relays) = relay_stdio(stdio).unwrap();
        let kinds: Vec<_> = relays
            .relayed
            .iter()
            .map(|r| (r.stream, r.kind.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (Stream::Stdin, "regular_file"),
                (Stream::Stdout, "regular_file")
            ]
        );
        let [stdin, stdout, stderr] = fds;
        let is_fifo = |fd: &OwnedFd| {
            use std::os::unix::fs::FileTypeExt;
            let f = std::fs::File::from(fd.try_clone().unwrap());
            f.metadata().unwrap().file_type().is_fifo()
        };
        assert!(is_fifo(stdin.as_ref().unwrap()));
        assert!(is_fifo(stdout.as_ref().unwrap()));
        assert!(
            is_fifo(stderr.as_ref().unwrap()),
            "a pipe is passed as it is"
        );
        let mut text = String::new();
        std::fs::File::from(stdin.unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "hello\n");
        std::fs::File::from(stdout.unwrap())
            .write_all(b"out\n")
            .unwrap();
        assert!(relays.drain());
        assert_eq!(std::fs::read_to_string(&output).unwrap(), "out\n");
    }

    #[test]
    fn the_null_device_is_passed_and_other_devices_are_relayed() {
        let open = |p: &str, write: bool| {
            let f = std::fs::OpenOptions::new()
                .read(!write)
                .write(write)
                .open(p)
                .unwrap();
            Some(OwnedFd::from(f))
        };
        let null_inode = std::fs::metadata("/dev/null").unwrap();
        let stdio = [
            open("/dev/null", false),
            open("/dev/zero", true),
            open("/dev/null", true),
        ];
        let (fds, relays) = relay_stdio(stdio).unwrap();
        let kinds: Vec<_> = relays
            .relayed
            .iter()
            .map(|r| (r.stream, r.kind.as_str()))
            .collect();
        assert_eq!(kinds, vec![(Stream::Stdout, "character_device")]);
        let [stdin, _, stderr] = fds;
        // The very descriptors given: the null device, not a pipe.
        for fd in [stdin.unwrap(), stderr.unwrap()] {
            let meta = std::fs::File::from(fd).metadata().unwrap();
            use std::os::unix::fs::MetadataExt;
            assert_eq!(meta.rdev(), null_inode.rdev());
            assert_eq!(meta.ino(), null_inode.ino());
        }
    }

    #[test]
    fn a_directory_on_stdin_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let stdio = [
            Some(OwnedFd::from(std::fs::File::open(dir.path()).unwrap())),
            None,
            None,
        ];
        let (fds, relays) = relay_stdio(stdio).unwrap();
        assert_eq!(relays.relayed[0].kind, "directory");
        let [stdin, ..] = fds;
        let mut text = String::new();
        std::fs::File::from(stdin.unwrap())
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "");
    }
}
