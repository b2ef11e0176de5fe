//! The in-memory table of verified objects: for each object whose content was found to hash to
//! its name, the identity its file had then (`super::objects::ObjectStat`).
//!
//! Layout: one sorted `Vec` of fixed 64-byte records (binary digest, inode, size, mtime, ctime;
//! the device is kept once for the table) plus a small hash map of entries added since the last
//! merge, folded into the sorted part in place when it grows. At 200,000 objects the table is
//! about 13 MB, against ~170 MB for a map of hex strings.
//!
//! Invariants:
//! - an entry says "the file that had exactly this identity held content hashing to this key";
//!   it is used only after comparing the identity with a fresh `lstat` of the object;
//! - entries loaded from the cache file are *known*; an entry is *confirmed* once this process
//!   saw the object with that identity (checked, hashed or written it). The tamper check
//!   (`super::tamper`) trusts only confirmed entries;
//! - a run whose scan record vouches that no object was added, removed or renamed since the last
//!   run (`super::scan_record`) *claims* every known entry: it is used as confirmed without being
//!   looked at, and the tamper check after the command compares each claimed entry with the
//!   object's identity then (an object changed before the run is hashed: see
//!   `super::object_snapshot`);
//! - the device is not per entry: an identity on another device than the table's is never
//!   recorded (so never matches).

use std::collections::HashMap;

use super::objects::ObjectStat;

/// A SHA-256 object name in binary.
pub(crate) type Key = [u8; 32];

/// Two-byte key prefixes.
const BUCKETS: usize = 1 << 16;

/// Tables smaller than this are searched without the prefix index (a dozen comparisons).
const BUCKETED_FROM: usize = 1 << 12;

/// Entries added since the last merge are folded into the sorted part beyond this many (or an
/// eighth of the sorted part, so a first run of many objects does not move the table each time).
const MERGE_AT: usize = 4096;

/// The identity of one object file, without the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ident {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// One entry of the table and of the cache file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub key: Key,
    pub ident: Ident,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Known,
    /// Known, and used as confirmed until the check after the command (see the module doc).
    Claimed,
    Confirmed,
    Removed,
}

/// Verified objects (see the module doc).
#[derive(Debug, Default)]
pub(crate) struct VerifiedSet {
    dev: Option<u64>,
    sorted: Vec<Record>,
    /// `buckets[b]..buckets[b + 1]` is the range of `sorted` whose keys start with the two bytes
    /// `b`: a lookup touches a few records, not a binary search's worth of cache lines. Empty
    /// below [`BUCKETED_FROM`] records, where building the 256 KiB index costs more than every
    /// lookup a run makes (a small project's run builds it at load and again at save).
    buckets: Vec<u32>,
    state: Vec<State>,
    /// Confirmed by this process, not yet merged; takes precedence over `sorted`.
    recent: HashMap<Key, Ident>,
    /// An entry was added, changed or removed since the table was loaded or last saved: only
    /// then does the cache file need writing again.
    changed: bool,
    /// The cache file the table was loaded from or last saved to, as it was then, and the id of
    /// the key it was MAC'd with.
    file: Option<(FileStamp, String)>,
}

/// A file's (device, inode, size, mtime_ns, ctime_ns): equal stamps mean the same bytes, as no
/// unprivileged process can set a ctime back.
pub(crate) type FileStamp = (u64, u64, u64, i64, i64);

/// The binary form of a valid object name (`None` for anything else).
pub(crate) fn key_of(hex: &str) -> Option<Key> {
    agentdiff_host::hex_id::decode(hex)
}

/// The first eight bytes of a key as a number: most comparisons end there.
fn head(key: &Key) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_be_bytes(b)
}

impl Ident {
    fn of(stat: &ObjectStat) -> Ident {
        Ident {
            ino: stat.ino,
            size: stat.size,
            mtime_ns: stat.mtime_ns,
            ctime_ns: stat.ctime_ns,
        }
    }
}

impl VerifiedSet {
    fn index(&self, key: &Key) -> Option<usize> {
        let b = usize::from(u16::from_be_bytes([key[0], key[1]]));
        let (lo, hi) = match (self.buckets.get(b), self.buckets.get(b + 1)) {
            (Some(lo), Some(hi)) => (*lo as usize, *hi as usize),
            _ => (0, self.sorted.len()),
        };
        let h = head(key);
        self.sorted
            .get(lo..hi)?
            .binary_search_by(|r| head(&r.key).cmp(&h).then_with(|| r.key.cmp(key)))
            .ok()
            .map(|i| lo + i)
    }

    /// Rebuilds `buckets` after `sorted` changed (left empty for a small table, and past `u32`
    /// records).
    fn rebuild_buckets(&mut self) {
        self.buckets.clear();
        if self.sorted.len() < BUCKETED_FROM || u32::try_from(self.sorted.len()).is_err() {
            return;
        }
        self.buckets.reserve_exact(BUCKETS + 1);
        let mut i = 0usize;
        for b in 0..=BUCKETS {
            while i < self.sorted.len()
                && usize::from(u16::from_be_bytes([
                    self.sorted[i].key[0],
                    self.sorted[i].key[1],
                ])) < b
            {
                i += 1;
            }
            self.buckets.push(i as u32);
        }
    }

    fn ident_of(&self, stat: &ObjectStat) -> Option<Ident> {
        (self.dev == Some(stat.dev)).then(|| Ident::of(stat))
    }

    /// True when `key` is recorded with exactly `stat`; the entry is then confirmed.
    pub fn matches(&mut self, key: &Key, stat: &ObjectStat) -> bool {
        let Some(ident) = self.ident_of(stat) else {
            return false;
        };
        if let Some(recent) = self.recent.get(key) {
            return *recent == ident;
        }
        match self.index(key) {
            Some(i) if self.state[i] != State::Removed && self.sorted[i].ident == ident => {
                self.state[i] = State::Confirmed;
                true
            }
            _ => false,
        }
    }

    /// The identity this process confirmed (or claimed) for `key`, if any.
    pub fn confirmed(&self, key: &Key) -> Option<Ident> {
        if let Some(recent) = self.recent.get(key) {
            return Some(*recent);
        }
        let i = self.index(key)?;
        matches!(self.state[i], State::Confirmed | State::Claimed).then_some(self.sorted[i].ident)
    }

    /// Whether `key`'s entry is claimed and not yet confirmed (see the module doc).
    pub fn is_claimed(&self, key: &Key) -> bool {
        !self.recent.contains_key(key)
            && self
                .index(key)
                .is_some_and(|i| self.state[i] == State::Claimed)
    }

    /// Claims every known entry (see the module doc); returns how many.
    pub fn claim_known(&mut self) -> usize {
        let mut n = 0;
        for s in &mut self.state {
            if *s == State::Known {
                *s = State::Claimed;
                n += 1;
            }
        }
        n
    }

    /// Whether `stat` is the identity this process confirmed for `key`; `None` when it confirmed
    /// none.
    pub fn confirmed_is(&self, key: &Key, stat: &ObjectStat) -> Option<bool> {
        let ident = self.confirmed(key)?;
        Some(stat.is_file && self.ident_of(stat) == Some(ident))
    }

    /// The confirmed key in shard `shard` whose next eight bytes are `prefix` (to name an object
    /// that disappeared, knowing only what a directory listing held).
    pub fn confirmed_with_prefix(&self, shard: u8, prefix: u64) -> Option<Key> {
        let matches = |k: &Key| k[0] == shard && k[1..9] == prefix.to_be_bytes();
        if let Some(k) = self.recent.keys().find(|k| matches(k)) {
            return Some(*k);
        }
        let mut low = [0u8; 32];
        low[0] = shard;
        low[1..9].copy_from_slice(&prefix.to_be_bytes());
        let start = self.sorted.partition_point(|r| r.key < low);
        (start..self.sorted.len())
            .take_while(|&i| matches(&self.sorted[i].key))
            .find(|&i| matches!(self.state[i], State::Confirmed | State::Claimed))
            .map(|i| self.sorted[i].key)
    }

    /// Records that the file with `stat` held content hashing to `key` (confirmed).
    pub fn insert(&mut self, key: Key, stat: &ObjectStat) {
        if self.dev.is_none() {
            self.dev = Some(stat.dev);
        }
        let Some(ident) = self.ident_of(stat) else {
            return;
        };
        if let Some(i) = self.index(&key) {
            self.changed |= self.sorted[i].ident != ident
                || self.state[i] == State::Removed
                || self.recent.contains_key(&key);
            self.sorted[i].ident = ident;
            self.state[i] = State::Confirmed;
            self.recent.remove(&key);
            return;
        }
        self.changed |= self.recent.get(&key) != Some(&ident);
        self.recent.insert(key, ident);
        if self.recent.len() >= MERGE_AT.max(self.sorted.len() / 8) {
            self.merge_recent();
        }
    }

    /// Forgets `key` (its object was removed or quarantined).
    pub fn remove(&mut self, key: &Key) {
        self.changed |= self.recent.remove(key).is_some();
        if let Some(i) = self.index(key) {
            self.changed |= self.state[i] != State::Removed;
            self.state[i] = State::Removed;
        }
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        *self = VerifiedSet {
            changed: true,
            ..VerifiedSet::default()
        };
    }

    /// No entry at all (nothing loaded or recorded yet).
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty() && self.recent.is_empty()
    }

    /// Whether the cache file `now` (its current stamp, `None` when absent) already holds
    /// exactly this table under the key `key_id`: nothing changed since it was loaded from or
    /// saved to that file.
    pub fn is_saved_in(&self, now: Option<FileStamp>, key_id: &str) -> bool {
        !self.changed
            && self
                .file
                .as_ref()
                .is_some_and(|(stamp, key)| Some(*stamp) == now && key == key_id)
    }

    /// The stamp of the file the table was loaded from or last saved to under `key_id`, when
    /// nothing changed since.
    pub fn saved_stamp(&self, key_id: &str) -> Option<FileStamp> {
        match &self.file {
            Some((stamp, key)) if !self.changed && key == key_id => Some(*stamp),
            _ => None,
        }
    }

    /// The table was loaded from, or just saved to, the file with this stamp under `key_id`.
    pub fn mark_saved(&mut self, file: Option<FileStamp>, key_id: &str) {
        self.changed = false;
        self.file = file.map(|f| (f, key_id.to_string()));
    }

    /// Adds entries read from the cache file (sorted, unique), as known. Entries this process
    /// already has are kept as they are.
    pub fn load(&mut self, dev: u64, records: Vec<Record>) {
        if self.dev.is_some_and(|d| d != dev) {
            return;
        }
        if self.sorted.is_empty() && self.recent.is_empty() {
            self.dev = Some(dev);
            self.state = vec![State::Known; records.len()];
            self.sorted = records;
            self.rebuild_buckets();
            return;
        }
        // Merged into entries of this process: the file no longer says all the table holds.
        self.changed = true;
        self.dev = Some(dev);
        for r in records {
            if self.index(&r.key).is_none() && !self.recent.contains_key(&r.key) {
                self.recent.insert(r.key, r.ident);
            }
        }
        self.merge_recent();
    }

    /// The device every entry's identity is on.
    pub fn dev(&self) -> Option<u64> {
        self.dev
    }

    /// Number of live entries after a merge (what a save writes).
    pub fn live_len(&mut self) -> usize {
        self.merge_recent();
        self.state.iter().filter(|s| **s != State::Removed).count()
    }

    /// Live entries in key order (call [`VerifiedSet::live_len`] first so nothing is pending).
    pub fn live(&self) -> impl Iterator<Item = &Record> {
        self.sorted
            .iter()
            .zip(&self.state)
            .filter(|(_, s)| **s != State::Removed)
            .map(|(r, _)| r)
    }

    /// Folds `recent` into `sorted` without a second copy of the table: keys are new (an
    /// existing key is updated where it is), so the vector grows by their number and is merged
    /// from the back.
    fn merge_recent(&mut self) {
        if self.recent.is_empty() {
            return;
        }
        let mut add: Vec<Record> = self
            .recent
            .drain()
            .map(|(key, ident)| Record { key, ident })
            .collect();
        add.sort_unstable_by_key(|r| r.key);
        let old = self.sorted.len();
        let filler = Record {
            key: [0; 32],
            ident: Ident {
                ino: 0,
                size: 0,
                mtime_ns: 0,
                ctime_ns: 0,
            },
        };
        self.sorted.reserve_exact(add.len());
        self.state.reserve_exact(add.len());
        self.sorted.resize(old + add.len(), filler);
        self.state.resize(old + add.len(), State::Confirmed);
        let (mut i, mut out) = (old, old + add.len());
        while let Some(next) = add.last() {
            out -= 1;
            if i > 0 && self.sorted[i - 1].key > next.key {
                i -= 1;
                self.sorted[out] = self.sorted[i];
                self.state[out] = self.state[i];
            } else if let Some(r) = add.pop() {
                self.sorted[out] = r;
                self.state[out] = State::Confirmed;
            }
        }
        self.rebuild_buckets();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(ino: u64, ctime_ns: i64) -> ObjectStat {
        ObjectStat {
            dev: 7,
            ino,
            size: 10,
            mtime_ns: 1,
            ctime_ns,
            is_file: true,
        }
    }

    fn key(n: u16) -> Key {
        let mut k = [0u8; 32];
        k[..2].copy_from_slice(&n.to_be_bytes());
        k[31] = 1;
        k
    }

    #[test]
    fn merges_keep_order_and_every_entry() {
        let mut set = VerifiedSet::default();
        // Interleaved keys across several merges, some updated after merging.
        for n in (0..3 * MERGE_AT as u16).rev() {
            set.insert(key(n * 3 % 20011), &stat(u64::from(n), 5));
        }
        set.insert(key(0), &stat(99, 6));
        assert_eq!(set.live_len(), 3 * MERGE_AT);
        let keys: Vec<Key> = set.live().map(|r| r.key).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert!(set.matches(&key(0), &stat(99, 6)));
        assert!(!set.matches(&key(0), &stat(0, 5)));
        assert_eq!(set.confirmed(&key(3)).map(|i| i.ino), Some(1));
    }

    #[test]
    fn loaded_entries_are_known_until_matched_and_removal_sticks() {
        let mut set = VerifiedSet::default();
        let recs = vec![
            Record {
                key: key(1),
                ident: Ident::of(&stat(1, 5)),
            },
            Record {
                key: key(2),
                ident: Ident::of(&stat(2, 5)),
            },
        ];
        set.load(7, recs);
        assert_eq!(set.confirmed(&key(1)), None);
        assert!(set.matches(&key(1), &stat(1, 5)));
        assert!(set.confirmed(&key(1)).is_some());
        assert_eq!(
            set.confirmed_with_prefix(0, u64::from_be_bytes([1, 0, 0, 0, 0, 0, 0, 0])),
            Some(key(1))
        );
        // Another device, another ctime: no match.
        assert!(!set.matches(
            &key(2),
            &ObjectStat {
                dev: 8,
                ..stat(2, 5)
            }
        ));
        assert!(!set.matches(&key(2), &stat(2, 6)));
        set.remove(&key(1));
        assert!(!set.matches(&key(1), &stat(1, 5)));
        assert_eq!(set.live_len(), 1);
    }

    #[test]
    fn lookups_are_the_same_below_and_above_the_prefix_index_threshold() {
        let mut set = VerifiedSet::default();
        let spread = |n: usize| key((n * 7919 % 65_521) as u16);
        let mut absent = key(5);
        absent[31] = 2;
        let mut recs: Vec<Record> = (0..BUCKETED_FROM - 1)
            .map(|n| Record {
                key: spread(n),
                ident: Ident::of(&stat(n as u64, 5)),
            })
            .collect();
        recs.sort_unstable_by_key(|r| r.key);
        set.load(7, recs);
        assert!(set.buckets.is_empty(), "a small table has no prefix index");
        for n in 0..BUCKETED_FROM - 1 {
            assert!(set.matches(&spread(n), &stat(n as u64, 5)), "entry {n}");
        }
        assert!(!set.matches(&absent, &stat(0, 5)));
        // Past the threshold the merged table is indexed, and every entry is still found.
        for n in BUCKETED_FROM - 1..2 * BUCKETED_FROM {
            set.insert(spread(n), &stat(n as u64, 5));
        }
        assert_eq!(set.live_len(), 2 * BUCKETED_FROM);
        assert_eq!(set.buckets.len(), BUCKETS + 1);
        for n in 0..2 * BUCKETED_FROM {
            assert!(set.matches(&spread(n), &stat(n as u64, 5)), "entry {n}");
        }
        assert!(!set.matches(&absent, &stat(0, 5)));
    }

    #[test]
    fn key_of_accepts_only_canonical_names() {
        let hex = "ab".repeat(32);
        assert!(key_of(&hex).is_some());
        assert!(key_of(&hex.to_uppercase()).is_none());
        assert!(key_of(&hex[..62]).is_none());
        assert!(key_of("zz").is_none());
    }
}
