//! Room to seal on a full disk: a file of [`RESERVE_BYTES`] kept in the store (created before the
//! launch when missing) and removed only when a write after the command fails for lack of space,
//! so the run can still record its `error` result and seal instead of being left unsealed.
//!
//! Invariants: the file lies in the store directory (never in a capsule, whose entries the seal
//! lists) and is a regular file of this user created without following links; it exists before
//! the store snapshot, so a command that removes or changes it is a tamper finding.
//!
//! A disk too full to hold the reserve before the launch refuses the launch (nothing runs): a
//! command started then could not be recorded.
//!
//! Not defended: a filesystem that compresses or deduplicates zeros gives back less than it
//! seems to hold.

use std::fs;
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;

use agentdiff_store::Store;

/// The reserve's name in the store directory.
pub const RESERVE_FILE_NAME: &str = "seal-reserve";
/// Enough for an error result, runtime.json, the last events and the seal (none lists changes).
pub const RESERVE_BYTES: u64 = 1 << 20;

/// The store's reserve, while this run holds it.
pub(super) struct Reserve {
    path: PathBuf,
    /// Why the reserve could not be made for lack of space, if so.
    full: Option<String>,
}

impl Reserve {
    /// Makes sure the store holds its reserve. Only a lack of space is kept (see
    /// [`Reserve::refusal`]); a reserve that cannot be made for another reason is left out.
    pub fn hold(store: &Store) -> Reserve {
        let path = store.dir().join(RESERVE_FILE_NAME);
        let ready = fs::symlink_metadata(&path)
            .is_ok_and(|m| m.file_type().is_file() && m.len() == RESERVE_BYTES);
        let mut full = None;
        if !ready {
            if let Err(e) = fill(&path) {
                let _ = fs::remove_file(&path);
                full = is_no_space(&e).then(|| e.to_string());
            }
        }
        Reserve { path, full }
    }

    /// Why the command must not be launched: the disk holding the store cannot even hold the
    /// reserve, so what the command does could not be recorded.
    pub fn refusal(&self) -> Option<String> {
        self.full.as_ref().map(|e| {
            format!(
                "the disk holding the store is full ({e}): agentdiff keeps {} KiB free there to \
                 record and seal a run, so nothing was launched; free space on that disk and run \
                 again",
                RESERVE_BYTES >> 10
            )
        })
    }

    /// Gives the reserve's room back to the disk, when `error` is a lack of space; whether it
    /// did (a later run makes the reserve again).
    pub fn release_for(&self, error: &(dyn std::error::Error + 'static)) -> bool {
        is_no_space(error) && fs::remove_file(&self.path).is_ok()
    }
}

fn fill(path: &std::path::Path) -> io::Result<()> {
    let _ = fs::remove_file(path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    // Written, not just sized: a sparse file would give no room back.
    let block = vec![0u8; 64 << 10];
    let mut left = RESERVE_BYTES;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        file.write_all(&block[..n])?;
        left -= n as u64;
    }
    file.sync_all()
}

/// Whether `error` (or an error it wraps) is ENOSPC or EDQUOT: no room left for this user.
pub fn is_no_space(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if matches!(io.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_enospc_is_no_space_and_other_errors_are_not() {
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        let wrapped = agentdiff_store::StoreError::Io {
            action: "write",
            path: "/x".into(),
            source: full,
        };
        assert!(is_no_space(&wrapped));
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert!(!is_no_space(&denied));
    }

    #[test]
    fn the_reserve_is_made_once_and_released_only_for_a_full_disk() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let reserve = Reserve::hold(&store);
        let path = store.dir().join(RESERVE_FILE_NAME);
        assert_eq!(fs::metadata(&path).unwrap().len(), RESERVE_BYTES);
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert!(!reserve.release_for(&denied));
        assert!(path.exists());
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(reserve.release_for(&full));
        assert!(!path.exists());
    }
}
