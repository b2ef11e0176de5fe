//! Report and attestation files that agentdiff writes after a run (`--summary-file`, `--attest`,
//! `attest --out`). They are opened before anything runs and written through the descriptor
//! kept from then on: the wrapped command may plant a symlink, a FIFO or a device at the path,
//! and agentdiff must neither write through it nor block on it.

use std::fs::File;
use std::io::{Seek as _, Write as _};
use std::path::Path;

/// How an output file is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Appended to (a CI step summary collects several reports).
    Append,
    /// Replaced: truncated through the descriptor when written.
    Replace,
}

/// Opens `path` (created if missing, never truncated here) and checks that what was opened is a
/// regular file. A final symlink is refused (`O_NOFOLLOW`), not followed; a FIFO is opened
/// without blocking (`O_NONBLOCK`) and then refused, as is any other non-regular file.
pub fn open(path: &Path, mode: Mode) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    match mode {
        Mode::Append => options.append(true),
        Mode::Replace => options.write(true),
    };
    options.create(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
    }
    // The open's own error (ELOOP for a symlink, ENXIO for a FIFO without a reader, EISDIR)
    // says less than what is at the path: name that when it is not a regular file.
    let file = options
        .open(path)
        .map_err(|e| match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_file() => not_regular(&m.file_type()),
            _ => e,
        })?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(not_regular(&kind));
    }
    #[cfg(unix)]
    clear_nonblocking(&file)?;
    Ok(file)
}

/// Writes `bytes` through `file` as `mode` says: appended, or replacing its content.
pub fn write(file: &mut File, mode: Mode, bytes: &[u8]) -> std::io::Result<()> {
    if mode == Mode::Replace {
        file.set_len(0)?;
        file.rewind()?;
    }
    file.write_all(bytes)?;
    file.flush()
}

fn not_regular(kind: &std::fs::FileType) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("it is not a regular file (it is a {})", kind_name(kind)),
    )
}

fn kind_name(kind: &std::fs::FileType) -> &'static str {
    if kind.is_symlink() {
        return "symbolic link, which is never followed";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt as _;
        if kind.is_fifo() {
            return "FIFO";
        }
        if kind.is_socket() {
            return "socket";
        }
        if kind.is_char_device() {
            return "character device";
        }
        if kind.is_block_device() {
            return "block device";
        }
    }
    if kind.is_dir() {
        "directory"
    } else {
        "special file"
    }
}

/// Regular files ignore O_NONBLOCK; cleared anyway so later writes behave as plain blocking ones.
#[cfg(unix)]
fn clear_nonblocking(file: &File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function borrows; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    #[test]
    fn a_regular_or_new_file_opens_and_is_replaced_or_appended() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.json");
        std::fs::write(&path, "old content that is longer").unwrap();
        let mut f = open(&path, Mode::Replace).unwrap();
        write(&mut f, Mode::Replace, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let fresh = dir.path().join("fresh.md");
        let mut f = open(&fresh, Mode::Append).unwrap();
        write(&mut f, Mode::Append, b"a").unwrap();
        let mut f = open(&fresh, Mode::Append).unwrap();
        write(&mut f, Mode::Append, b"b").unwrap();
        assert_eq!(std::fs::read(&fresh).unwrap(), b"ab");
    }

    #[test]
    fn a_symlink_fifo_directory_or_device_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("victim");
        std::fs::write(&target, "keep").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let err = open(&link, Mode::Replace).unwrap_err();
        assert!(err.to_string().contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");

        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        for mode in [Mode::Replace, Mode::Append] {
            let err = open(&fifo, mode).unwrap_err();
            assert!(err.to_string().contains("FIFO"), "{err}");
        }
        let err = open(dir.path(), Mode::Append).unwrap_err();
        assert!(!err.to_string().is_empty());
        let err = open(Path::new("/dev/null"), Mode::Replace).unwrap_err();
        assert!(err.to_string().contains("character device"), "{err}");
    }
}
