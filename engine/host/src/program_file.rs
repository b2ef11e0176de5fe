//! Writing a program file that can be executed at once, from a process with other threads.
//!
//! A file this process holds open for writing is inherited by every child another thread forks
//! meanwhile, and stays open in that child until it execs (the descriptor is close-on-exec,
//! nothing longer). Until then executing the file fails with ETXTBSY ("text file busy"), and a
//! caller would read a fine program as a broken one. So the bytes are written by a short-lived
//! `/bin/sh`, whose descriptors no other process inherits: this process only sends them through a
//! pipe (or names the file to copy) and sets the mode by path.
//!
//! Not defended: a program file written by someone else (an upgrade in progress); a caller that
//! runs such a file retries on ETXTBSY itself (the srt version probe does).

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Why a program file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ProgramFileError {
    #[error("could not {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("could not write {path}: the writer exited with {status}")]
    Writer {
        path: PathBuf,
        status: std::process::ExitStatus,
    },
}

/// Writes `body` at `path` (created or truncated) with permission bits `mode`.
pub fn write(path: &Path, body: &[u8], mode: u32) -> Result<(), ProgramFileError> {
    in_child(path, "cat > \"$1\"", None, Some(body), mode)
}

/// Copies the file `from` to `to` (created or truncated) with permission bits `mode`.
pub fn copy(from: &Path, to: &Path, mode: u32) -> Result<(), ProgramFileError> {
    in_child(to, "cat -- \"$2\" > \"$1\"", Some(from), None, mode)
}

/// Runs `script` in `sh` with `path` as `$1` and `from` as `$2`, `stdin` on its standard input,
/// then sets `path`'s mode.
fn in_child(
    path: &Path,
    script: &str,
    from: Option<&Path>,
    stdin: Option<&[u8]>,
    mode: u32,
) -> Result<(), ProgramFileError> {
    let io = |what| {
        move |source| ProgramFileError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    };
    let mut writer = Command::new("/bin/sh")
        .args(["-c", script, "sh"])
        .arg(path)
        .args(from)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .spawn()
        .map_err(io("start a writer for"))?;
    let sent = match (stdin, writer.stdin.take()) {
        (Some(bytes), Some(mut pipe)) => pipe.write_all(bytes),
        _ => Ok(()),
    };
    // Waited for even when the pipe broke, so no writer outlives the call.
    let status = writer.wait().map_err(io("wait for the writer of"))?;
    // A writer that failed (it could not create the file) may have exited before the bytes were
    // sent: its exit is the cause, the broken pipe only a consequence.
    if !status.success() {
        return Err(ProgramFileError::Writer {
            path: path.to_path_buf(),
            status,
        });
    }
    sent.map_err(io("send the bytes of"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io("set the mode of"))
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// Programs written or copied while other threads keep forking children run at once, every
    /// time. (With `fs::write` or `fs::copy` in their place, some of these execs fail with
    /// ETXTBSY: 2–7 of 100 writes and 1 of 100 copies when measured, so enough rounds that a
    /// regression is all but certain to show.)
    #[test]
    fn a_program_written_while_other_threads_fork_runs_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let forkers: Vec<_> = (0..4)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let _ = std::process::Command::new("/bin/true").status();
                    }
                })
            })
            .collect();
        const ROUNDS: usize = 600;
        let mut busy = 0;
        for i in 0..ROUNDS {
            let p = dir.path().join(format!("s{i}"));
            if i % 2 == 0 {
                super::write(&p, b"#!/bin/sh\nexit 0\n", 0o755).unwrap();
            } else {
                super::copy(Path::new("/bin/true"), &p, 0o755).unwrap();
            }
            match std::process::Command::new(&p).status() {
                Ok(s) => assert!(s.success(), "{s}"),
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => busy += 1,
                Err(e) => panic!("{e}"),
            }
        }
        stop.store(true, Ordering::Relaxed);
        for f in forkers {
            f.join().unwrap();
        }
        assert_eq!(busy, 0, "{busy} of {ROUNDS} programs were busy");
    }

    #[test]
    fn failures_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let inside_a_file = dir.path().join("f");
        std::fs::write(&inside_a_file, "").unwrap();
        let e = super::write(&inside_a_file.join("p"), b"x", 0o755).unwrap_err();
        assert!(matches!(e, super::ProgramFileError::Writer { .. }), "{e}");
        assert!(e.to_string().contains("f/p"), "{e}");
        let e = super::copy(
            &dir.path().join("absent"),
            &dir.path().join("copy-target"),
            0o755,
        )
        .unwrap_err();
        assert!(e.to_string().contains("copy-target"), "{e}");
    }
}
