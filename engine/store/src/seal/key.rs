//! The per-user seal key and the state directory that holds it (and the ledger).
//!
//! The key is 32 random bytes in `<state dir>/seal.key`, created on first use with
//! `O_CREAT|O_EXCL` semantics (written to a private temp file, then hard-linked into place so it is
//! never seen half-written and two first runs cannot install different keys). The state directory
//! is, in order: `$AGENTDIFF_STATE_DIR`, `$XDG_STATE_HOME/agentdiff`, `$HOME/.local/state/agentdiff`.
//! It must be absolute, a real directory owned by the current user with mode 0700 (created so), and
//! outside the project root being run.
//!
//! Not defended: anything running as the same user can read the key (under the `local` backend
//! that includes the wrapped command); root can read everything. The key authenticates "sealed by
//! this user's agentdiff", not "the command could not have forged it", unless the backend hides the
//! state directory from the command.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use hmac::digest::generic_array::GenericArray;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use super::super::atomic;
use super::super::StoreError;

pub use agentdiff_host::state_dir::STATE_DIR_ENV;
pub const KEY_FILE_NAME: &str = "seal.key";
const KEY_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Where this user's seal key and ledger live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateDir {
    path: PathBuf,
}

impl StateDir {
    /// An explicit location (must be absolute).
    pub fn at(path: impl Into<PathBuf>) -> Result<StateDir, StoreError> {
        let path = path.into();
        if !path.is_absolute() {
            return Err(StoreError::StateDir {
                path,
                reason: "it is not an absolute path".into(),
            });
        }
        Ok(StateDir { path })
    }

    /// Resolves the location from the environment, by the one rule every crate uses
    /// ([`agentdiff_host::state_dir::locate`]).
    pub fn from_env() -> Result<StateDir, StoreError> {
        match agentdiff_host::state_dir::locate() {
            Ok(path) => StateDir::at(path),
            Err(agentdiff_host::state_dir::StateDirError::NotAbsolute { path }) => {
                StateDir::at(path)
            }
            Err(agentdiff_host::state_dir::StateDirError::Unset) => Err(StoreError::StateDir {
                path: PathBuf::from("~/.local/state/agentdiff"),
                reason: format!("neither {STATE_DIR_ENV}, XDG_STATE_HOME nor HOME is set"),
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn key_path(&self) -> PathBuf {
        self.path.join(KEY_FILE_NAME)
    }

    /// Refuses a state directory inside `project_root`: the command could then rewrite it in
    /// place, and every scan would see it.
    pub fn check_outside(&self, project_root: &Path) -> Result<(), StoreError> {
        let resolved = resolve_existing_prefix(&self.path);
        let root = project_root
            .canonicalize()
            .unwrap_or_else(|_| project_root.to_path_buf());
        if resolved.starts_with(&root) {
            return Err(StoreError::StateDir {
                path: self.path.clone(),
                reason: format!(
                    "it lies inside the project root {}; the seal key must live outside every \
                     project",
                    root.display()
                ),
            });
        }
        Ok(())
    }

    /// Creates the directory (parents with default modes, the directory itself 0700) and checks
    /// it is private.
    fn ensure(&self) -> Result<(), StoreError> {
        if let Some(parent) = self.path.parent() {
            fs::create_dir_all(parent)
                .map_err(|e| StoreError::io("create state directory parent", parent, e))?;
        }
        atomic::ensure_private_dir(&self.path, true)
    }

    /// Checks an existing directory; `Ok(false)` when it does not exist.
    pub(crate) fn check_existing(&self) -> Result<bool, StoreError> {
        match fs::symlink_metadata(&self.path) {
            Ok(meta) => atomic::check_private_dir(&self.path, &meta).map(|()| true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(StoreError::io("inspect", &self.path, e)),
        }
    }
}

/// Canonicalises the longest existing prefix of `path` (the rest may not exist yet).
fn resolve_existing_prefix(path: &Path) -> PathBuf {
    let mut rest = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        if let Ok(real) = cur.canonicalize() {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return out;
        }
        match (cur.file_name().map(|n| n.to_os_string()), cur.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name);
                cur = parent.to_path_buf();
            }
            _ => return path.to_path_buf(),
        }
    }
}

/// The per-user secret. Its bytes are never printed; [`SealKey::id`] names it.
#[derive(Clone)]
pub struct SealKey {
    bytes: [u8; KEY_LEN],
    id: String,
}

impl fmt::Debug for SealKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SealKey").field("id", &self.id).finish()
    }
}

/// What a MAC is computed for; each purpose uses its own derived key so a MAC of one kind can
/// never be replayed as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MacPurpose {
    Seal,
    Ledger,
    LaunchEvent,
    EnvFingerprint,
    ObjectCache,
    ScanRecord,
}

impl MacPurpose {
    fn label(self) -> &'static [u8] {
        match self {
            MacPurpose::Seal => b"agentdiff/v1/seal",
            MacPurpose::Ledger => b"agentdiff/v1/ledger",
            MacPurpose::LaunchEvent => b"agentdiff/v1/launched-event",
            MacPurpose::EnvFingerprint => b"agentdiff/v1/env-fingerprint",
            MacPurpose::ObjectCache => b"agentdiff/v1/verified-objects",
            MacPurpose::ScanRecord => b"agentdiff/v1/scan-record",
        }
    }
}

impl SealKey {
    /// A key from raw bytes (tests and embedders that manage keys themselves).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> SealKey {
        let mut h = Sha256::new();
        h.update(b"agentdiff/v1/key-id\0");
        h.update(bytes);
        let id = hex::encode(h.finalize())[..16].to_string();
        SealKey { bytes, id }
    }

    /// Public name of the key: 16 hex digits of a hash of it. Recorded in every seal so `verify`
    /// can say "sealed with another key" instead of "forged".
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The key of `state`, created on first use.
    pub fn load_or_create(state: &StateDir) -> Result<SealKey, StoreError> {
        load_or_create_secret(state, &state.key_path(), "seal key").map(SealKey::from_bytes)
    }

    /// The key of `state` if it exists (never creates anything). A key file that is a symlink,
    /// not owned by the current user, readable by others or of the wrong size is an error.
    pub fn load(state: &StateDir) -> Result<Option<SealKey>, StoreError> {
        Ok(load_secret(state, &state.key_path())?.map(SealKey::from_bytes))
    }

    fn mac_state(&self, purpose: MacPurpose) -> HmacSha256 {
        let mut derive = hmac_with(&self.bytes);
        derive.update(purpose.label());
        hmac_with(&derive.finalize().into_bytes())
    }

    /// Lowercase hex HMAC-SHA256 of `data` under the key derived for `purpose`.
    pub fn mac(&self, purpose: MacPurpose, data: &[u8]) -> String {
        let mut m = self.mac_state(purpose);
        m.update(data);
        hex::encode(m.finalize().into_bytes())
    }

    /// Constant-time check of a hex MAC.
    pub fn verify_mac(&self, purpose: MacPurpose, data: &[u8], mac_hex: &str) -> bool {
        // Only the canonical form: upper-case hex decodes to the same bytes, and accepting it
        // would let a sealed file change without the MAC noticing.
        let canonical = mac_hex.len() == 64
            && mac_hex
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !canonical {
            return false;
        }
        let Ok(expected) = hex::decode(mac_hex) else {
            return false;
        };
        let mut m = self.mac_state(purpose);
        m.update(data);
        m.verify_slice(&expected).is_ok()
    }
}

/// HMAC keyed with a 32-byte key. HMAC zero-pads a short key to the block size, so handing it the
/// padded block is the same MAC without the fallible variable-length constructor.
fn hmac_with(key: &[u8]) -> HmacSha256 {
    let mut block = [0u8; 64];
    let n = key.len().min(block.len());
    block[..n].copy_from_slice(&key[..n]);
    <HmacSha256 as hmac::digest::KeyInit>::new(GenericArray::from_slice(&block))
}

/// The 32 secret bytes at `path` in `state`, created on first use: random bytes written to a
/// private temp file, then hard-linked into place, so the file is never seen half-written and two
/// first runs cannot install different secrets (the second finds the first one's file).
pub(crate) fn load_or_create_secret(
    state: &StateDir,
    path: &Path,
    what: &str,
) -> Result<[u8; KEY_LEN], StoreError> {
    state.ensure()?;
    if let Some(bytes) = load_secret(state, path)? {
        return Ok(bytes);
    }
    let mut bytes = [0u8; KEY_LEN];
    getrandom::getrandom(&mut bytes).map_err(|e| StoreError::Random(e.to_string()))?;
    let (mut tmp, tmp_path) = atomic::create_temp_in(state.path(), "key")?;
    let written = tmp.write_all(&bytes).and_then(|()| tmp.sync_all());
    drop(tmp);
    let linked = written.and_then(|()| fs::hard_link(&tmp_path, path));
    let _ = fs::remove_file(&tmp_path);
    match linked {
        Ok(()) => atomic::sync_dir(state.path())?,
        // Another first run installed its secret first: use that one.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StoreError::io("create the key file", path, e)),
    }
    load_secret(state, path)?.ok_or_else(|| StoreError::StateDir {
        path: path.to_path_buf(),
        reason: format!("the {what} vanished right after it was created"),
    })
}

/// The 32 secret bytes at `path` in `state` if the file exists (never creates anything). A file
/// that is a symlink, not owned by the current user, readable by others or of the wrong size is
/// an error.
pub(crate) fn load_secret(
    state: &StateDir,
    path: &Path,
) -> Result<Option<[u8; KEY_LEN]>, StoreError> {
    if !state.check_existing()? {
        return Ok(None);
    }
    read_private_secret(path)
}

/// The 32 bytes of the private file at `path` (`None` when absent); see [`load_secret`].
pub(crate) fn read_private_secret(path: &Path) -> Result<Option<[u8; KEY_LEN]>, StoreError> {
    let path = path.to_path_buf();
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(StoreError::StateDir {
                path,
                reason: format!("the key file cannot be opened ({e}); it must be a regular file"),
            })
        }
    };
    let meta = file
        .metadata()
        .map_err(|e| StoreError::io("inspect", &path, e))?;
    let bad = |reason: String| StoreError::StateDir {
        path: path.clone(),
        reason,
    };
    if !meta.is_file() {
        return Err(bad("the key is not a regular file".into()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(bad(format!("the key is owned by uid {}", meta.uid())));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "the key has mode {:o}; it must be 600 (chmod 600 it, or delete it to start a new \
             key — capsules sealed with the old key then verify as not authenticated)",
            meta.mode() & 0o7777
        )));
    }
    let bytes = atomic::read_bounded(&path, KEY_LEN as u64 + 1)?;
    let bytes: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
        bad(format!(
            "the key holds {} bytes, not {KEY_LEN}",
            bytes.len()
        ))
    })?;
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn key_is_created_private_once_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::at(dir.path().join("a/agentdiff")).unwrap();
        let k1 = SealKey::load_or_create(&state).unwrap();
        let k2 = SealKey::load_or_create(&state).unwrap();
        assert_eq!(k1.id(), k2.id());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(state.path()), 0o700);
        assert_eq!(mode(&state.key_path()), 0o600);
        assert!(!format!("{k1:?}").contains(&hex::encode(k1.bytes)));
        let mac = k1.mac(MacPurpose::Seal, b"x");
        assert!(k2.verify_mac(MacPurpose::Seal, b"x", &mac));
        assert!(!k2.verify_mac(MacPurpose::Ledger, b"x", &mac));
        assert!(!k2.verify_mac(MacPurpose::Seal, b"y", &mac));
        assert!(!k2.verify_mac(MacPurpose::Seal, b"x", "zz"));
        assert!(!k2.verify_mac(MacPurpose::Seal, b"x", &mac.to_uppercase()));
    }

    #[test]
    fn unsafe_keys_and_locations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::at(dir.path().join("s")).unwrap();
        assert!(SealKey::load(&state).unwrap().is_none());
        SealKey::load_or_create(&state).unwrap();
        fs::set_permissions(state.key_path(), fs::Permissions::from_mode(0o644)).unwrap();
        assert!(SealKey::load(&state).is_err());
        fs::set_permissions(state.key_path(), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(state.path(), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(SealKey::load(&state).is_err());
        assert!(StateDir::at("relative").is_err());
        let inside = StateDir::at(dir.path().join("proj/.state")).unwrap();
        fs::create_dir(dir.path().join("proj")).unwrap();
        assert!(inside.check_outside(&dir.path().join("proj")).is_err());
        assert!(state.check_outside(&dir.path().join("proj")).is_ok());
    }
}
