//! The verified-object cache: which objects were found intact, and the file identity each had then,
//! kept between runs in `objects/verified-cache` so a run does not read every reused backup again.
//!
//! Invariants:
//! - an entry is trusted only when the file's current (device, inode, size, mtime, ctime) equals
//!   the recorded one; any write to an object moves its ctime forward, and no unprivileged process
//!   can set a ctime back, so a replaced or rewritten object is hashed again;
//! - the file is MAC'd with the per-user key ([`MacPurpose::ObjectCache`]): a cache written
//!   without the key (a planted or edited file, one from a cloned repository or another machine)
//!   is ignored as a whole, and every object is hashed again;
//! - a missing, unreadable or unauthenticated cache only costs time, never trust.
//!
//! Not defended: a process holding the key (under the `local` backend the command runs as the
//! same user and can read it, see docs/security-model.md), and a same-size rewrite of an object
//! within one ctime tick of agentdiff's own check of it (the limit of `super::tamper` as well).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::PoisonError;

use super::atomic;
use super::objects::{validate_object_id, ObjectStat, ObjectStore};
use super::seal::{MacPurpose, SealKey};
use super::StoreError;

/// File name below `objects/`.
pub(crate) const CACHE_FILE_NAME: &str = "verified-cache";
const MAGIC: &str = "agentdiff-verified-objects v1";
/// Far above any real store (an entry is ~120 bytes); a larger file is ignored, not read.
const MAX_CACHE_BYTES: u64 = 256 << 20;

impl ObjectStore {
    fn cache_path(&self) -> PathBuf {
        self.dir().join(CACHE_FILE_NAME)
    }

    /// Adds the entries of the cache file that `key` authenticates; returns how many. A file
    /// that is missing, malformed or not MAC'd with `key` adds nothing.
    pub fn load_verified_cache(&self, key: &SealKey) -> usize {
        let Ok(bytes) = atomic::read_bounded(&self.cache_path(), MAX_CACHE_BYTES) else {
            return 0;
        };
        let Some(entries) = parse(&bytes, key) else {
            return 0;
        };
        let n = entries.len();
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        for (hex, stat) in entries {
            verified.entry(hex).or_insert(stat);
        }
        n
    }

    /// Writes what this process knows to be verified, MAC'd with `key`. Entries of objects that
    /// were since changed or removed never match again and are dropped on the next prune.
    pub fn save_verified_cache(&self, key: &SealKey) -> Result<(), StoreError> {
        let entries: Vec<(String, ObjectStat)> = {
            let verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
            verified.iter().map(|(h, s)| (h.clone(), *s)).collect()
        };
        let bytes = render(entries, key);
        atomic::write_atomic(
            self.dir(),
            CACHE_FILE_NAME,
            &bytes,
            atomic::Durability::AtSeal,
        )
    }

    /// Removes the cache file (after pruning: it may name removed objects).
    pub(crate) fn drop_verified_cache(&self) -> Result<(), StoreError> {
        match std::fs::remove_file(self.cache_path()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io("remove", self.cache_path(), e)),
        }
    }
}

fn render(mut entries: Vec<(String, ObjectStat)>, key: &SealKey) -> Vec<u8> {
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut body = String::with_capacity(entries.len() * 128);
    for (hex, s) in &entries {
        let _ = writeln!(
            body,
            "{hex} {} {} {} {} {}",
            s.dev, s.ino, s.size, s.mtime_ns, s.ctime_ns
        );
    }
    let mac = key.mac(MacPurpose::ObjectCache, body.as_bytes());
    format!("{MAGIC} {} {mac}\n{body}", key.id()).into_bytes()
}

fn parse(bytes: &[u8], key: &SealKey) -> Option<HashMap<String, ObjectStat>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (header, body) = text.split_once('\n')?;
    let rest = header.strip_prefix(MAGIC)?.strip_prefix(' ')?;
    let (key_id, mac) = rest.split_once(' ')?;
    if key_id != key.id() || !key.verify_mac(MacPurpose::ObjectCache, body.as_bytes(), mac) {
        return None;
    }
    let mut out = HashMap::new();
    for line in body.lines() {
        let mut f = line.split(' ');
        let hex = f.next()?;
        validate_object_id(hex).ok()?;
        let stat = ObjectStat {
            dev: f.next()?.parse().ok()?,
            ino: f.next()?.parse().ok()?,
            size: f.next()?.parse().ok()?,
            mtime_ns: f.next()?.parse().ok()?,
            ctime_ns: f.next()?.parse().ok()?,
        };
        if f.next().is_some() {
            return None;
        }
        out.insert(hex.to_string(), stat);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::io::Write;

    fn key(b: u8) -> SealKey {
        SealKey::from_bytes([b; 32])
    }

    fn store_with(content: &[u8]) -> (tempfile::TempDir, ObjectStore, String) {
        let dir = tempfile::tempdir().unwrap();
        let objects = ObjectStore::new(dir.path().join("objects"));
        objects.ensure_layout().unwrap();
        let hex = objects.put_bytes(content).unwrap();
        (dir, objects, hex)
    }

    /// A fresh store over the same directory knows nothing this process verified.
    fn reopened(objects: &ObjectStore) -> ObjectStore {
        ObjectStore::new(objects.dir().to_path_buf())
    }

    fn known(objects: &ObjectStore, hex: &str) -> bool {
        objects
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(hex)
    }

    #[test]
    fn an_authenticated_cache_is_loaded_and_its_entries_are_used() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.save_verified_cache(&key(1)).unwrap();
        let next = reopened(&objects);
        assert_eq!(next.load_verified_cache(&key(1)), 1);
        assert!(known(&next, &hex));
        assert!(next.contains_verified(&hex, 12));
    }

    #[test]
    fn a_cache_of_another_key_or_edited_is_ignored() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.save_verified_cache(&key(1)).unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(2)), 0);
        let path = objects.dir().join(CACHE_FILE_NAME);
        let text = fs::read_to_string(&path).unwrap();
        // Another inode number for the same object: the MAC no longer matches.
        let (header, body) = text.split_once('\n').unwrap();
        let mut fields: Vec<String> = body.split(' ').map(str::to_string).collect();
        fields[2] = "1".into();
        fs::write(&path, format!("{header}\n{}", fields.join(" "))).unwrap();
        let next = reopened(&objects);
        assert_eq!(next.load_verified_cache(&key(1)), 0);
        assert!(!known(&next, &hex));
        // Appending a line, or whitespace, breaks it too.
        objects.save_verified_cache(&key(1)).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b" \n")
            .unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 0);
    }

    #[test]
    fn a_rewritten_object_is_hashed_again_despite_a_cache_entry() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.save_verified_cache(&key(1)).unwrap();
        let path = objects.object_path(&hex).unwrap();
        // Same size, other content, mtime put back: only the ctime shows the write.
        let mtime = fs::metadata(&path).unwrap().modified().unwrap();
        fs::write(&path, b"BACKUP BYTES").unwrap();
        fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let next = reopened(&objects);
        assert_eq!(next.load_verified_cache(&key(1)), 1);
        assert!(
            !next.contains_verified(&hex, 12),
            "a rewritten object was trusted"
        );
        assert!(!path.exists(), "the rewritten object was not quarantined");
    }

    #[test]
    fn a_replaced_object_file_is_hashed_again() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.save_verified_cache(&key(1)).unwrap();
        let path = objects.object_path(&hex).unwrap();
        let planted = objects.dir().join("planted");
        fs::write(&planted, b"xxxxxxxxxxxx").unwrap();
        fs::rename(&planted, &path).unwrap();
        let next = reopened(&objects);
        next.load_verified_cache(&key(1));
        assert!(!next.contains_verified(&hex, 12));
    }

    #[test]
    fn garbage_and_oversized_lines_are_ignored() {
        let (_d, objects, _hex) = store_with(b"x");
        let path = objects.dir().join(CACHE_FILE_NAME);
        for junk in [
            &b""[..],
            b"\n",
            b"agentdiff-verified-objects v1\n",
            &[0xff, 0xfe, b'\n'],
        ] {
            fs::write(&path, junk).unwrap();
            assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 0);
        }
    }
}
