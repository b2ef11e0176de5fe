//! The verified-object cache: which objects were found intact, and the file identity each had then,
//! kept between runs in `objects/verified-cache` so a run does not read every reused backup again.
//!
//! Format (v2, binary; docs/capsule-format.md): a header line
//! `agentdiff-verified-objects v2 <key id> <device> <count>\n`, `count` records of 64 bytes in
//! strictly ascending digest order (32-byte SHA-256, then inode, size, mtime_ns, ctime_ns as
//! little-endian 64-bit integers), and a line with the hex HMAC of the SHA-256 of everything
//! before it. It is written and read in one streaming pass: the file is never held as text, and
//! in memory the entries are the compact table of `super::verified`.
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

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::PathBuf;
use std::sync::PoisonError;

use sha2::{Digest, Sha256};

use super::atomic;
use super::objects::ObjectStore;
use super::seal::{MacPurpose, SealKey};
use super::verified::{FileStamp, Ident, Record};
use super::StoreError;

/// File name below `objects/`.
pub(crate) const CACHE_FILE_NAME: &str = "verified-cache";
const MAGIC: &str = "agentdiff-verified-objects v2";
/// Bytes of one record: digest, inode, size, mtime, ctime (integers little-endian).
pub(crate) const RECORD_BYTES: usize = 64;
/// The MAC line: 64 hex digits and a newline.
const MAC_LINE_BYTES: u64 = 65;
/// The header line is far shorter than this.
const MAX_HEADER_BYTES: usize = 256;
/// Far above any real store (200,000 objects are 12.8 MB); a larger file is ignored, not read.
const MAX_CACHE_BYTES: u64 = 1 << 30;

impl ObjectStore {
    fn cache_path(&self) -> PathBuf {
        self.dir().join(CACHE_FILE_NAME)
    }

    /// Adds the entries of the cache file that `key` authenticates; returns how many. A file
    /// that is missing, malformed or not MAC'd with `key` adds nothing.
    pub fn load_verified_cache(&self, key: &SealKey) -> usize {
        let Ok((file, meta)) = atomic::open_regular(&self.cache_path()) else {
            return 0;
        };
        if meta.len() > MAX_CACHE_BYTES {
            return 0;
        }
        let Some((dev, records)) = parse(file, meta.len(), key) else {
            return 0;
        };
        let n = records.len();
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        let fresh = verified.is_empty();
        verified.load(dev, records);
        if fresh {
            verified.mark_saved(Some(stamp(&meta)), key.id());
        }
        n
    }

    /// Writes what this process knows to be verified, MAC'd with `key`, streamed into a temp
    /// file and renamed into place. Entries of objects that were since changed never match again
    /// and are dropped on the next prune.
    ///
    /// A table that did not change since it was loaded from (or saved to) the file that is
    /// there now is not written again: a warm run of a large tree would otherwise rewrite
    /// megabytes of records it read a moment before. The file's stamp decides, so a cache file
    /// replaced or edited meanwhile is written afresh.
    pub fn save_verified_cache(&self, key: &SealKey) -> Result<(), StoreError> {
        let dest = self.cache_path();
        let mut verified = self.verified.lock().unwrap_or_else(PoisonError::into_inner);
        let now = std::fs::symlink_metadata(&dest).ok().map(|m| stamp(&m));
        if verified.is_saved_in(now, key.id()) {
            return Ok(());
        }
        let tmp_dir = self.dir().join(super::objects::TMP_DIR);
        let (file, tmp) = atomic::create_temp_in(&tmp_dir, CACHE_FILE_NAME)?;
        let count = verified.live_len();
        let dev = verified.dev().unwrap_or(0);
        let written = render(file, dev, count, verified.live(), key);
        let placed = written
            .map_err(|e| StoreError::io("write", &tmp, e))
            .and_then(|()| {
                std::fs::rename(&tmp, &dest).map_err(|e| StoreError::io("rename into", &dest, e))
            });
        match placed {
            Ok(()) => {
                let saved = std::fs::symlink_metadata(&dest).ok().map(|m| stamp(&m));
                verified.mark_saved(saved, key.id());
                Ok(())
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
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

/// The stamp of a file as `meta` shows it.
pub(super) fn stamp(meta: &std::fs::Metadata) -> FileStamp {
    use std::os::unix::fs::MetadataExt;
    (
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.mtime_nsec()),
        meta.ctime()
            .saturating_mul(1_000_000_000)
            .saturating_add(meta.ctime_nsec()),
    )
}

fn header(key: &SealKey, dev: u64, count: usize) -> String {
    format!("{MAGIC} {} {dev} {count}\n", key.id())
}

/// The MAC input: the SHA-256 of everything before the MAC line (so it is streamed).
fn mac_input(hasher: Sha256) -> [u8; 32] {
    hasher.finalize().into()
}

fn encode(r: &Record) -> [u8; RECORD_BYTES] {
    let mut out = [0u8; RECORD_BYTES];
    out[..32].copy_from_slice(&r.key);
    out[32..40].copy_from_slice(&r.ident.ino.to_le_bytes());
    out[40..48].copy_from_slice(&r.ident.size.to_le_bytes());
    out[48..56].copy_from_slice(&r.ident.mtime_ns.to_le_bytes());
    out[56..64].copy_from_slice(&r.ident.ctime_ns.to_le_bytes());
    out
}

fn decode(b: &[u8; RECORD_BYTES]) -> Record {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[i..i + 8]);
        w
    };
    let mut key = [0u8; 32];
    key.copy_from_slice(&b[..32]);
    Record {
        key,
        ident: Ident {
            ino: u64::from_le_bytes(word(32)),
            size: u64::from_le_bytes(word(40)),
            mtime_ns: i64::from_le_bytes(word(48)),
            ctime_ns: i64::from_le_bytes(word(56)),
        },
    }
}

fn render<'a>(
    file: File,
    dev: u64,
    count: usize,
    records: impl Iterator<Item = &'a Record>,
    key: &SealKey,
) -> io::Result<()> {
    let mut out = BufWriter::with_capacity(1 << 16, file);
    let mut hasher = Sha256::new();
    let head = header(key, dev, count);
    hasher.update(head.as_bytes());
    out.write_all(head.as_bytes())?;
    for r in records {
        let bytes = encode(r);
        hasher.update(bytes);
        out.write_all(&bytes)?;
    }
    let mac = key.mac(MacPurpose::ObjectCache, &mac_input(hasher));
    out.write_all(format!("{mac}\n").as_bytes())?;
    out.flush()
}

/// The records of a cache file of `len` bytes when its header is well-formed and names `key`,
/// its size matches the record count, its records are in strictly ascending order and its MAC
/// verifies. Read in one streaming pass; nothing is returned unless everything holds.
fn parse(file: File, len: u64, key: &SealKey) -> Option<(u64, Vec<Record>)> {
    let mut input = BufReader::with_capacity(1 << 16, file);
    let mut head = Vec::with_capacity(128);
    for byte in input.by_ref().bytes() {
        let byte = byte.ok()?;
        head.push(byte);
        if byte == b'\n' || head.len() > MAX_HEADER_BYTES {
            break;
        }
    }
    let text = std::str::from_utf8(&head).ok()?.strip_suffix('\n')?;
    let mut fields = text.strip_prefix(MAGIC)?.strip_prefix(' ')?.split(' ');
    let (key_id, dev, count) = (fields.next()?, fields.next()?, fields.next()?);
    let dev: u64 = dev.parse().ok()?;
    let count: usize = count.parse().ok()?;
    let body = u64::try_from(count)
        .ok()?
        .checked_mul(RECORD_BYTES as u64)?;
    if fields.next().is_some()
        || key_id != key.id()
        || head != header(key, dev, count).as_bytes()
        || len
            != (head.len() as u64)
                .checked_add(body)?
                .checked_add(MAC_LINE_BYTES)?
    {
        return None;
    }
    let mut hasher = Sha256::new();
    hasher.update(&head);
    let mut records = Vec::with_capacity(count);
    let mut buf = [0u8; RECORD_BYTES];
    for _ in 0..count {
        input.read_exact(&mut buf).ok()?;
        hasher.update(buf);
        let r = decode(&buf);
        if records
            .last()
            .is_some_and(|last: &Record| last.key >= r.key)
        {
            return None;
        }
        records.push(r);
    }
    let mut mac = [0u8; MAC_LINE_BYTES as usize];
    input.read_exact(&mut mac).ok()?;
    let mac = std::str::from_utf8(&mac).ok()?.strip_suffix('\n')?;
    key.verify_mac(MacPurpose::ObjectCache, &mac_input(hasher), mac)
        .then_some((dev, records))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verified::key_of;
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
        let mut set = objects
            .verified
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let k = key_of(hex).unwrap();
        set.live_len();
        let found = set.live().any(|r| r.key == k);
        found
    }

    #[test]
    fn an_authenticated_cache_is_loaded_and_its_entries_are_used() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        for i in 0..50u32 {
            objects.put_bytes(&i.to_le_bytes()).unwrap();
        }
        objects.save_verified_cache(&key(1)).unwrap();
        let len = fs::metadata(objects.dir().join(CACHE_FILE_NAME))
            .unwrap()
            .len();
        // Header line, 51 records of 64 bytes, MAC line: no text rendering of the entries.
        assert!(len < 51 * 64 + 200, "{len}");
        let next = reopened(&objects);
        assert_eq!(next.load_verified_cache(&key(1)), 51);
        assert!(known(&next, &hex));
        assert!(next.contains_verified(&hex, 12));
        // Nothing left in tmp/.
        assert_eq!(fs::read_dir(objects.dir().join("tmp")).unwrap().count(), 0);
    }

    /// The file's inode and ctime: a rename into place gives a new inode.
    fn written_as(objects: &ObjectStore) -> (u64, i64) {
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(objects.dir().join(CACHE_FILE_NAME)).unwrap();
        (m.ino(), m.ctime_nsec())
    }

    #[test]
    fn an_unchanged_table_is_not_written_again_and_any_change_is() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.save_verified_cache(&key(1)).unwrap();
        let first = written_as(&objects);
        // A later run that loads the cache and verifies nothing new writes nothing.
        let next = reopened(&objects);
        assert_eq!(next.load_verified_cache(&key(1)), 1);
        assert!(next.contains_verified(&hex, 12));
        next.save_verified_cache(&key(1)).unwrap();
        assert_eq!(written_as(&next), first, "unchanged table rewritten");
        // A new object is written out, and then kept as it is.
        let added = next.put_bytes(b"new backup").unwrap();
        next.save_verified_cache(&key(1)).unwrap();
        let second = written_as(&next);
        assert_ne!(second, first);
        next.save_verified_cache(&key(1)).unwrap();
        assert_eq!(written_as(&next), second);
        let again = reopened(&objects);
        assert_eq!(again.load_verified_cache(&key(1)), 2);
        // A removed object is written out too.
        again.quarantine(&added).unwrap();
        again.save_verified_cache(&key(1)).unwrap();
        let third = written_as(&again);
        assert_ne!(third, second);
        assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 1);
        // Saved under another key, an unchanged table is written again; so is one whose file
        // was replaced behind its back (here by one another key sealed).
        let keyed = reopened(&objects);
        keyed.load_verified_cache(&key(1));
        keyed.save_verified_cache(&key(3)).unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(3)), 1);
        keyed.save_verified_cache(&key(1)).unwrap();
        let other = reopened(&objects);
        other.load_verified_cache(&key(1));
        reopened(&objects).save_verified_cache(&key(2)).unwrap();
        other.save_verified_cache(&key(1)).unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 1);
    }

    #[test]
    fn a_cache_of_another_key_edited_truncated_or_extended_is_ignored() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.put_bytes(b"other").unwrap();
        objects.save_verified_cache(&key(1)).unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(2)), 0);
        let path = objects.dir().join(CACHE_FILE_NAME);
        let good = fs::read(&path).unwrap();
        let body = good.iter().position(|b| *b == b'\n').unwrap() + 1;
        // Another inode number for an object (one byte of a record): the MAC no longer holds.
        let mut edited = good.clone();
        edited[body + 33] ^= 1;
        // The header's count lowered with the file cut to match: the MAC no longer holds.
        let cut = String::from_utf8_lossy(&good[..body]).replace(" 2\n", " 1\n");
        let mut truncated = cut.into_bytes();
        truncated.extend_from_slice(&good[body..body + 64]);
        truncated.extend_from_slice(&good[good.len() - 65..]);
        let mut extended = good.clone();
        extended.extend_from_slice(b" \n");
        for (what, bytes) in [
            ("edited", edited),
            ("truncated", truncated),
            ("cut short", good[..good.len() - 10].to_vec()),
            ("extended", extended),
        ] {
            fs::write(&path, &bytes).unwrap();
            let next = reopened(&objects);
            assert_eq!(next.load_verified_cache(&key(1)), 0, "{what}");
            assert!(!known(&next, &hex), "{what}");
        }
        fs::write(&path, &good).unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 2);
    }

    #[test]
    fn a_cache_planted_in_the_old_text_format_or_with_unsorted_records_is_ignored() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        let path = objects.dir().join(CACHE_FILE_NAME);
        fs::write(
            &path,
            format!("agentdiff-verified-objects v1 x y\n{hex} 1 2 12 3 4\n"),
        )
        .unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 0);
        // Two equal records, correctly MAC'd: refused (records must be strictly ascending).
        let r = Record {
            key: key_of(&hex).unwrap(),
            ident: Ident {
                ino: 1,
                size: 12,
                mtime_ns: 2,
                ctime_ns: 3,
            },
        };
        let file = fs::File::create(&path).unwrap();
        render(file, 1, 2, [r, r].iter(), &key(1)).unwrap();
        assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 0);
    }

    #[test]
    fn a_rewritten_object_is_hashed_again_despite_a_cache_entry() {
        let (_d, objects, hex) = store_with(b"backup bytes");
        objects.save_verified_cache(&key(1)).unwrap();
        let path = objects.object_path(&hex).unwrap();
        // Same size, other content, mtime put back: only the ctime shows the write.
        agentdiff_test_support::rewrite_in_place(&path, b"BACKUP BYTES");
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
    fn garbage_is_ignored() {
        let (_d, objects, _hex) = store_with(b"x");
        let path = objects.dir().join(CACHE_FILE_NAME);
        let long = vec![b'a'; 10_000];
        for junk in [
            &b""[..],
            b"\n",
            b"agentdiff-verified-objects v2\n",
            b"agentdiff-verified-objects v2 k 1 99999999999999999999\n",
            &[0xff, 0xfe, b'\n'],
            &long,
        ] {
            fs::write(&path, junk).unwrap();
            assert_eq!(reopened(&objects).load_verified_cache(&key(1)), 0);
        }
        let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"\n").unwrap();
    }
}
