//! Small per-user cache files in agentdiff's state directory, for answers that change only when
//! a program on the host changes: srt's version, whether bwrap can start a sandbox here. An entry
//! is keyed by the [`FileIdentity`] of the programs it is about (device, inode, size,
//! modification and status-change times; the status-change time cannot be set back by a user, so
//! a replaced or edited file never matches an old entry) plus whatever else the caller puts in
//! its key (the boot, the kernel).
//!
//! Invariants: a cache file is read only when it is a regular file (not a symlink), owned by this
//! user and writable by nobody else; anything else, and anything unparsable, reads as empty.
//! Writes are atomic (temporary file, then rename; mode 0600 in a 0700 directory). A failure to
//! read or write costs only a fresh probe.
//!
//! Not defended: a process of the same user outside every sandbox can write these files. Callers
//! therefore cache only answers whose staleness fails closed later (a cached "bwrap starts" for a
//! bwrap that no longer does is caught at launch as a setup failure), never an evidence label.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// Identity of one file: a change to the file gives a different identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub path: PathBuf,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
}

impl FileIdentity {
    /// The identity of the file `path` resolves to (symlinks followed).
    pub fn of(path: &Path) -> std::io::Result<FileIdentity> {
        let canonical = std::fs::canonicalize(path)?;
        let m = std::fs::metadata(&canonical)?;
        Ok(FileIdentity {
            path: canonical,
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

/// The cache file at `path`, or `T::default()` when it is absent, untrusted or unreadable.
pub fn read<T: DeserializeOwned + Default>(path: &Path) -> T {
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    else {
        return T::default();
    };
    let trusted = file.metadata().is_ok_and(|m| {
        m.is_file() && m.uid() == crate::system::euid() && m.permissions().mode() & 0o022 == 0
    });
    if !trusted {
        return T::default();
    }
    serde_json::from_reader(std::io::BufReader::new(file)).unwrap_or_default()
}

/// Write `value` as `dir/name` atomically; a failure is ignored (the next call probes again).
pub fn write<T: Serialize>(dir: &Path, name: &str, value: &T) {
    if std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .is_err()
    {
        return;
    }
    let Ok(text) = serde_json::to_vec(value) else {
        return;
    };
    let mut salt = [0u8; 8];
    if crate::random::fill(&mut salt).is_err() {
        return;
    }
    let tmp = dir.join(format!(".{name}.{}", crate::hex::encode(salt)));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&text));
    if written.is_err() || std::fs::rename(&tmp, dir.join(name)).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    struct Cache {
        entries: Vec<String>,
    }

    #[test]
    fn written_then_read_and_untrusted_files_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let value = Cache {
            entries: vec!["a".into()],
        };
        write(&state, "c.json", &value);
        assert_eq!(read::<Cache>(&state.join("c.json")), value);
        // Writable by others: ignored.
        std::fs::set_permissions(state.join("c.json"), std::fs::Permissions::from_mode(0o666))
            .unwrap();
        assert_eq!(read::<Cache>(&state.join("c.json")), Cache::default());
        // A symlink is not followed.
        std::fs::write(dir.path().join("other.json"), r#"{"entries":["x"]}"#).unwrap();
        std::os::unix::fs::symlink(dir.path().join("other.json"), state.join("l.json")).unwrap();
        assert_eq!(read::<Cache>(&state.join("l.json")), Cache::default());
        // Garbage: empty.
        std::fs::write(state.join("g.json"), "{").unwrap();
        assert_eq!(read::<Cache>(&state.join("g.json")), Cache::default());
    }

    #[test]
    fn an_edited_file_has_another_identity() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("prog");
        std::fs::write(&p, "one").unwrap();
        let a = FileIdentity::of(&p).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&p, "two").unwrap();
        assert_ne!(a, FileIdentity::of(&p).unwrap());
    }
}
