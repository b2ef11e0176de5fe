//! The per-user ledger: `<state dir>/ledger.jsonl`, one line per seal (run id, project root, seal
//! digest, times, key id) with an HMAC of the line, appended `O_APPEND` and fsynced.
//!
//! The ledger lives outside every project, so a command confined to the project (srt, container,
//! bwrap) cannot edit it, and it answers questions a capsule alone cannot: was this run sealed here,
//! and is the capsule still the one that was sealed? A capsule deleted together with its seal, or
//! replaced by an intact but unauthenticated copy, shows up as a ledger mismatch.
//!
//! Not defended: a process running as the same user (the `local` backend's command) can truncate
//! or rewrite the file; without the key it cannot add lines that authenticate.

use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::super::atomic;
use super::super::StoreError;
use super::key::{MacPurpose, SealKey, StateDir};

pub const LEDGER_FILE_NAME: &str = "ledger.jsonl";
/// Largest ledger `read` loads (hundreds of thousands of seals).
const MAX_LEDGER_BYTES: u64 = 256 * 1024 * 1024;
/// How much of the ledger's end [`Ledger::read_tail`] reads (a few hundred lines).
const TAIL_BYTES: u64 = 64 * 1024;

/// One seal as recorded in the ledger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerEntry {
    pub run_id: String,
    /// The resolved project root of the run.
    pub root: String,
    /// `digest` of the run's integrity.json.
    pub seal_digest: String,
    pub sealed_at: String,
    pub key_id: String,
    /// Set on the line `agentdiff runs prune` appends when it removes the run sealed with
    /// `seal_digest`: the run is gone on purpose, not missing from the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned_at: Option<String>,
    /// HMAC-SHA256 (ledger purpose) of the entry serialised without this field.
    pub mac: String,
}

#[derive(Serialize)]
struct EntryBody<'a> {
    run_id: &'a str,
    root: &'a str,
    seal_digest: &'a str,
    sealed_at: &'a str,
    key_id: &'a str,
    // Absent from seal lines, so their MACs are those of the format before pruning existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pruned_at: Option<&'a str>,
}

impl LedgerEntry {
    fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&EntryBody {
            run_id: &self.run_id,
            root: &self.root,
            seal_digest: &self.seal_digest,
            sealed_at: &self.sealed_at,
            key_id: &self.key_id,
            pruned_at: self.pruned_at.as_deref(),
        })
        .unwrap_or_default()
    }

    /// The line recording that the run sealed as `seal` was pruned at `pruned_at`.
    pub fn pruned(key: &SealKey, sealed: &LedgerEntry, pruned_at: &str) -> LedgerEntry {
        let mut entry = LedgerEntry {
            pruned_at: Some(pruned_at.to_string()),
            key_id: key.id().to_string(),
            mac: String::new(),
            ..sealed.clone()
        };
        entry.mac = key.mac(MacPurpose::Ledger, &entry.body());
        entry
    }

    pub fn is_pruned(&self) -> bool {
        self.pruned_at.is_some()
    }

    pub fn new(
        key: &SealKey,
        run_id: &str,
        root: &Path,
        seal_digest: &str,
        sealed_at: &str,
    ) -> LedgerEntry {
        let mut entry = LedgerEntry {
            run_id: run_id.to_string(),
            root: root.display().to_string(),
            seal_digest: seal_digest.to_string(),
            sealed_at: sealed_at.to_string(),
            key_id: key.id().to_string(),
            pruned_at: None,
            mac: String::new(),
        };
        entry.mac = key.mac(MacPurpose::Ledger, &entry.body());
        entry
    }

    /// Whether the line was written by the holder of `key`.
    pub fn authenticates(&self, key: &SealKey) -> bool {
        self.key_id == key.id() && key.verify_mac(MacPurpose::Ledger, &self.body(), &self.mac)
    }
}

/// The ledger file of a state directory.
#[derive(Debug, Clone)]
pub struct Ledger {
    state: StateDir,
}

/// What [`Ledger::read`] found: every line that parses, not yet authenticated. A line counts only
/// once [`LedgerContents::authenticated`] has checked its MAC; lookups check only the lines they
/// select (a run's lines under one root), so a run's cost does not grow with the whole ledger's
/// MAC checks.
#[derive(Debug, Clone, Default)]
pub struct LedgerContents {
    /// (1-based line number, parsed line), in file order.
    lines: Vec<(usize, LedgerEntry)>,
    /// Line numbers (1-based) that do not parse.
    malformed: Vec<usize>,
}

impl LedgerContents {
    fn parse<'a>(lines: impl Iterator<Item = &'a [u8]>) -> LedgerContents {
        let mut out = LedgerContents::default();
        for (i, line) in lines.enumerate() {
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<LedgerEntry>(line) {
                Ok(e) => out.lines.push((i + 1, e)),
                Err(_) => out.malformed.push(i + 1),
            }
        }
        out
    }

    /// The lines `select` keeps whose MAC checks under `key`, in file order.
    pub fn authenticated<'a>(
        &'a self,
        key: &'a SealKey,
        select: impl Fn(&LedgerEntry) -> bool + 'a,
    ) -> impl Iterator<Item = &'a LedgerEntry> + 'a {
        self.lines
            .iter()
            .map(|(_, e)| e)
            .filter(move |e| select(e) && e.authenticates(key))
    }

    /// The ids of the last `limit` runs of `root` whose seal lines authenticate under `key`,
    /// newest first, pruned runs left out. Over a [`Ledger::read_tail`] it costs the same
    /// whatever the ledger's length; what the tail lacks gives fewer ids, never a wrong one.
    pub fn recent_runs(&self, key: &SealKey, root: &str, limit: usize) -> Vec<String> {
        let mut pruned: Vec<&str> = Vec::new();
        let mut out: Vec<String> = Vec::new();
        let newest_first = self.lines.iter().rev().map(|(_, e)| e);
        for e in newest_first.filter(|e| e.root == root && e.authenticates(key)) {
            if e.is_pruned() {
                pruned.push(&e.run_id);
            } else if !pruned.contains(&e.run_id.as_str()) && !out.contains(&e.run_id) {
                out.push(e.run_id.clone());
                if out.len() == limit {
                    break;
                }
            }
        }
        out
    }

    /// Every line whose MAC checks under `key`.
    pub fn entries(&self, key: &SealKey) -> Vec<LedgerEntry> {
        self.authenticated(key, |_| true).cloned().collect()
    }

    /// Line numbers (1-based) that are malformed or do not authenticate under `key`.
    pub fn bad_lines(&self, key: &SealKey) -> Vec<usize> {
        let mut bad: Vec<usize> = self
            .lines
            .iter()
            .filter(|(_, e)| !e.authenticates(key))
            .map(|(n, _)| *n)
            .chain(self.malformed.iter().copied())
            .collect();
        bad.sort_unstable();
        bad
    }
}

/// The lines of a tail read by [`Ledger::tail`]: when it starts inside a line (the file is
/// longer), that partial line is not a line.
fn whole_lines(tail: &(Vec<u8>, bool)) -> impl DoubleEndedIterator<Item = &[u8]> {
    let (bytes, cut) = tail;
    let mut lines = bytes.split(|b| *b == b'\n');
    if *cut {
        lines.next();
    }
    lines
}

impl Ledger {
    pub fn new(state: StateDir) -> Ledger {
        Ledger { state }
    }

    pub fn path(&self) -> PathBuf {
        self.state.path().join(LEDGER_FILE_NAME)
    }

    /// Appends one entry and fsyncs it.
    pub fn append(&self, entry: &LedgerEntry) -> Result<(), StoreError> {
        let path = self.path();
        let line = serde_json::to_string(entry).map_err(|source| StoreError::Serialize {
            name: LEDGER_FILE_NAME.into(),
            source,
        })?;
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(atomic::FILE_MODE)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| StoreError::io("open the ledger", &path, e))?;
        let meta = file
            .metadata()
            .map_err(|e| StoreError::io("inspect", &path, e))?;
        if !meta.is_file() {
            return Err(StoreError::NotRegularFile {
                path,
                reason: "the ledger must be a regular file",
            });
        }
        // One write keeps concurrent appenders from interleaving within a line.
        file.write_all(format!("{line}\n").as_bytes())
            .and_then(|()| file.sync_data())
            .map_err(|e| StoreError::io("append to the ledger", &path, e))
    }

    /// Every line, parsed; lines that do not parse are only counted. MACs are checked by
    /// [`LedgerContents::authenticated`], line by line as lookups need them.
    pub fn read(&self) -> Result<LedgerContents, StoreError> {
        let path = self.path();
        let bytes = match atomic::read_bounded(&path, MAX_LEDGER_BYTES) {
            Ok(b) => b,
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok(LedgerContents::default())
            }
            Err(e) => return Err(e),
        };
        Ok(LedgerContents::parse(bytes.split(|b| *b == b'\n')))
    }

    /// The whole lines of the ledger's last [`TAIL_BYTES`], parsed as [`Ledger::read`] parses
    /// the whole file (line numbers count from the tail's first whole line), at a cost that does
    /// not grow with the ledger. It holds the newest line of every run it names, but may lack a
    /// run's older lines: use it only where a line it lacks can make a check refuse, never pass.
    /// Unreadable: no lines.
    pub fn read_tail(&self) -> LedgerContents {
        let tail = self.tail().unwrap_or_default();
        LedgerContents::parse(whole_lines(&tail))
    }

    /// The last [`TAIL_BYTES`] of the file and whether the file is longer.
    fn tail(&self) -> Option<(Vec<u8>, bool)> {
        let (mut file, meta) = atomic::open_regular(&self.path()).ok()?;
        let start = meta.len().saturating_sub(TAIL_BYTES);
        // Sized up front: one read instead of a dozen growing ones.
        let mut tail = Vec::with_capacity(usize::try_from(meta.len() - start).unwrap_or(0) + 1);
        file.seek(SeekFrom::Start(start)).ok()?;
        file.take(TAIL_BYTES).read_to_end(&mut tail).ok()?;
        Some((tail, start > 0))
    }

    /// Whether the ledger file exists.
    pub fn exists(&self) -> bool {
        fs::symlink_metadata(self.path()).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_holds_the_newest_whole_lines_only() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::at(dir.path().join("s")).unwrap();
        let key = SealKey::load_or_create(&state).unwrap();
        let ledger = Ledger::new(state);
        let old = LedgerEntry::new(&key, "r-old", Path::new("/p"), &"a".repeat(64), "t");
        ledger.append(&old).unwrap();
        // Enough other lines that r-old's starts before the tail, and the tail inside a line.
        let mut f = OpenOptions::new().append(true).open(ledger.path()).unwrap();
        f.write_all(format!("{}\n", "x".repeat(999)).repeat(70).as_bytes())
            .unwrap();
        drop(f);
        let new = LedgerEntry::new(&key, "r-new", Path::new("/p"), &"b".repeat(64), "t");
        ledger.append(&new).unwrap();
        let tail = ledger.read_tail();
        assert_eq!(tail.entries(&key), vec![new.clone()]);
        // 70,000 bytes of filler: the 64 KB tail starts inside a filler line, which is dropped.
        let filler = 65_536 / 1_000;
        assert_eq!(tail.malformed.len(), filler, "{:?}", tail.malformed.len());
        assert_eq!(ledger.read().unwrap().entries(&key), vec![old, new]);
    }

    #[test]
    fn entries_round_trip_and_forged_lines_are_flagged() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::at(dir.path().join("s")).unwrap();
        let key = SealKey::load_or_create(&state).unwrap();
        let ledger = Ledger::new(state);
        let e = LedgerEntry::new(&key, "r1", Path::new("/p"), &"a".repeat(64), "t");
        ledger.append(&e).unwrap();
        let mut forged = e.clone();
        forged.seal_digest = "b".repeat(64);
        ledger.append(&forged).unwrap();
        let read = ledger.read().unwrap();
        assert_eq!(read.entries(&key), vec![e]);
        assert_eq!(read.bad_lines(&key), vec![2]);
        let other = SealKey::from_bytes([7; 32]);
        assert_eq!(read.bad_lines(&other), vec![1, 2]);
    }

    #[test]
    fn pruned_lines_are_macd_and_seal_lines_keep_their_format() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::at(dir.path().join("s")).unwrap();
        let key = SealKey::load_or_create(&state).unwrap();
        let ledger = Ledger::new(state);
        let sealed = LedgerEntry::new(&key, "r1", Path::new("/p"), &"a".repeat(64), "t");
        // A seal line has no pruned_at at all, so lines written before pruning existed verify.
        assert!(!serde_json::to_string(&sealed)
            .unwrap()
            .contains("pruned_at"));
        let pruned = LedgerEntry::pruned(&key, &sealed, "later");
        assert!(pruned.is_pruned() && pruned.authenticates(&key));
        ledger.append(&sealed).unwrap();
        ledger.append(&pruned).unwrap();
        // A pruned mark cannot be added or moved without the key.
        let mut forged = pruned.clone();
        forged.run_id = "r2".into();
        ledger.append(&forged).unwrap();
        let read = ledger.read().unwrap();
        assert_eq!(read.entries(&key), vec![sealed, pruned]);
        assert_eq!(read.bad_lines(&key), vec![3]);
    }

    #[test]
    fn a_selected_lookup_returns_only_that_runs_authenticated_lines() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateDir::at(dir.path().join("s")).unwrap();
        let key = SealKey::load_or_create(&state).unwrap();
        let ledger = Ledger::new(state);
        let r1 = LedgerEntry::new(&key, "r1", Path::new("/p"), &"a".repeat(64), "t");
        let r2 = LedgerEntry::new(&key, "r2", Path::new("/p"), &"b".repeat(64), "t");
        let other_root = LedgerEntry::new(&key, "r1", Path::new("/q"), &"c".repeat(64), "t");
        let mut forged = r1.clone();
        forged.seal_digest = "d".repeat(64);
        for e in [&r1, &r2, &other_root, &forged] {
            ledger.append(e).unwrap();
        }
        let read = ledger.read().unwrap();
        let r1_here: Vec<&LedgerEntry> = read
            .authenticated(&key, |e| e.run_id == "r1" && e.root == "/p")
            .collect();
        // The forged line names the same run and root but never counts.
        assert_eq!(r1_here, vec![&r1]);
        let other = SealKey::from_bytes([7; 32]);
        assert_eq!(read.authenticated(&other, |_| true).count(), 0);
    }
}
