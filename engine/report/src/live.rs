//! Following runs in progress: each poll reads only what was appended to `events.jsonl` of every
//! run that is not finished since the last poll (from the offset already read, never the whole
//! file again), as typed events. A run is finished once it is sealed and its events are read to
//! the end; it then yields one [`LiveUpdate::Finished`] with its status and change count. An
//! unsealed run while no agentdiff holds the project lock (seen in `/proc/locks`, without taking
//! the lock) was interrupted: it yields one [`LiveUpdate::Interrupted`] and is no longer followed.
//! Its seal is looked at again after the lock check, since a run is sealed before its agentdiff
//! releases the lock: one that finishes between the two checks is sealed, not interrupted. An
//! agent session holds no lock between its hooks: an unsealed session stands by its agent process
//! instead (running while the recorded agent lives, else interrupted).
//!
//! Invariants: read-only (nothing in the store is written or locked); each event is yielded once
//! per [`LiveTail`]; a line still being written is left for the next poll; `events.jsonl` is
//! opened without following a symlink.
//!
//! Not defended: events are what the run recorded, in its own words; a command that can write the
//! store (an unconfined backend) can write events too, or truncate the file (reading then restarts
//! at its new end). A run whose capsule cannot be read is reported once and then left alone. Where
//! `/proc/locks` cannot be read, the lock counts as held (runs are followed as before).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use agentdiff_store::doc::Event;
use agentdiff_store::{Artifact, RunId, Store, StoreError, LOCK_FILE_NAME};

/// Why a run's new events could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LiveError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("events.jsonl has a malformed line: {0}")]
    Malformed(#[source] serde_json::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What a poll found.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveUpdate {
    /// A new event of a run in progress.
    Event { run_id: RunId, event: Event },
    /// A run was sealed: its outcome, from `result.json`.
    Finished {
        run_id: RunId,
        status: Option<String>,
        changes: Option<usize>,
    },
    /// A run's events cannot be read (said once).
    Unreadable { run_id: RunId, problem: String },
    /// A run is not sealed and no agentdiff holds the project lock (a session: its agent is
    /// gone): it was interrupted (said once; `agentdiff cleanup RUN` stops what a run left
    /// behind, `agentdiff session end ID` seals a session).
    Interrupted { run_id: RunId, session: bool },
}

/// The runs being followed and how far each was read.
#[derive(Debug, Default)]
pub struct LiveTail {
    offsets: BTreeMap<RunId, u64>,
    done: BTreeSet<RunId>,
}

impl LiveTail {
    /// Follows every run that is not sealed when `store` is first polled, and every run created
    /// after; sealed runs present at the start are history, not news.
    pub fn start(store: &Store) -> Result<LiveTail, StoreError> {
        let mut tail = LiveTail::default();
        for id in store.run_ids()? {
            if store.open_run(id.as_str()).is_ok_and(|c| c.is_sealed()) {
                tail.done.insert(id);
            }
        }
        Ok(tail)
    }

    /// The updates since the last poll, run by run in id order.
    pub fn poll(&mut self, store: &Store) -> Result<Vec<LiveUpdate>, StoreError> {
        let mut out = Vec::new();
        for id in store.run_ids()? {
            if self.done.contains(&id) {
                continue;
            }
            self.poll_run(store, id, &mut out);
        }
        Ok(out)
    }

    fn poll_run(&mut self, store: &Store, id: RunId, out: &mut Vec<LiveUpdate>) {
        let capsule = match store.open_run(id.as_str()) {
            Ok(c) => c,
            Err(e) => return self.give_up(id, e.into(), out),
        };
        // Sealed and the lock (a session: its agent) are checked before reading, so the events
        // read afterwards are the last ones.
        let session = capsule.metadata().ok().and_then(|m| m.session);
        let standing = match &session {
            Some(meta) => standing(|| capsule.is_sealed(), || crate::session::agent_runs(meta)),
            None => standing(|| capsule.is_sealed(), || lock_held(store)),
        };
        let offset = self.offsets.get(&id).copied().unwrap_or(0);
        let path = capsule.dir().join(Artifact::Events.file_name());
        let (events, next) = match read_from(&path, offset) {
            Ok(found) => found,
            Err(e) => return self.give_up(id, e, out),
        };
        self.offsets.insert(id.clone(), next);
        out.extend(events.into_iter().map(|event| LiveUpdate::Event {
            run_id: id.clone(),
            event,
        }));
        if standing == Standing::Sealed {
            let result = capsule.result().ok();
            out.push(LiveUpdate::Finished {
                run_id: id.clone(),
                status: result.as_ref().map(|r| r.status.as_str().to_string()),
                changes: result.as_ref().map(|r| r.changes.len()),
            });
            self.offsets.remove(&id);
            self.done.insert(id);
        } else if standing == Standing::Interrupted {
            out.push(LiveUpdate::Interrupted {
                run_id: id.clone(),
                session: session.is_some(),
            });
            self.offsets.remove(&id);
            self.done.insert(id);
        }
    }

    fn give_up(&mut self, id: RunId, e: LiveError, out: &mut Vec<LiveUpdate>) {
        out.push(LiveUpdate::Unreadable {
            run_id: id.clone(),
            problem: e.to_string(),
        });
        self.offsets.remove(&id);
        self.done.insert(id);
    }
}

/// Where a run stands at one poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Running,
    Sealed,
    Interrupted,
}

/// A run's standing from its seal and the project lock. A run is sealed before its agentdiff
/// releases the lock, so an unsealed run found without a lock holder is looked at once more: it
/// may have been sealed, and the lock released, between the two checks.
fn standing(is_sealed: impl Fn() -> bool, lock_held: impl FnOnce() -> bool) -> Standing {
    if is_sealed() {
        Standing::Sealed
    } else if lock_held() {
        Standing::Running
    } else if is_sealed() {
        Standing::Sealed
    } else {
        Standing::Interrupted
    }
}

/// The complete lines appended to `path` after `offset`, as events, and the offset after them. A
/// file shorter than `offset` (rewritten) is read from its end on; a missing file has no events.
fn read_from(path: &Path, offset: u64) -> Result<(Vec<Event>, u64), LiveError> {
    let err = |source| LiveError::Read {
        path: path.display().to_string(),
        source,
    };
    let mut file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), offset)),
        Err(e) => return Err(err(e)),
    };
    let len = file.metadata().map_err(err)?.len();
    let start = offset.min(len);
    file.seek(SeekFrom::Start(start)).map_err(err)?;
    let mut tail = Vec::new();
    Read::by_ref(&mut file)
        .take(len - start)
        .read_to_end(&mut tail)
        .map_err(err)?;
    let complete = tail.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let events = tail[..complete]
        .split(|b| *b == b'\n')
        .filter(|line| !line.is_empty())
        .map(|line| serde_json::from_slice(line).map_err(LiveError::Malformed))
        .collect::<Result<Vec<Event>, LiveError>>()?;
    Ok((events, start + complete as u64))
}

/// Whether any process holds a lock on the store's lock file, read from `/proc/locks` by the
/// file's inode (taking the lock to find out could make a starting run fail as busy). Unknown
/// (no lock file, `/proc/locks` unreadable) counts as held.
fn lock_held(store: &Store) -> bool {
    let Ok(file) = File::open(store.dir().join(LOCK_FILE_NAME)) else {
        return true;
    };
    let Ok(meta) = file.metadata() else {
        return true;
    };
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return true;
    };
    locks_name_inode(&locks, meta.ino())
}

/// Whether a `/proc/locks` listing has a lock on inode `ino` (`… MAJ:MIN:INODE start end`).
fn locks_name_inode(locks: &str, ino: u64) -> bool {
    locks.lines().any(|line| {
        line.split_whitespace()
            .filter_map(|field| field.rsplit_once(':'))
            .any(|(_, inode)| inode.parse::<u64>() == Ok(ino))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_of_a_run_started_later_are_yielded_once_and_its_seal_ends_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let old = store.create_run(Some("old-1")).unwrap();
        old.event("capsule_created", json!({})).unwrap();
        old.seal(&[]).unwrap();
        let mut tail = LiveTail::start(&store).unwrap();
        assert!(tail.poll(&store).unwrap().is_empty());

        let run = store.create_run(Some("new-1")).unwrap();
        run.event("capsule_created", json!({ "run_id": "new-1" }))
            .unwrap();
        let updates = tail.poll(&store).unwrap();
        assert_eq!(updates.len(), 1, "{updates:?}");
        assert!(matches!(&updates[0], LiveUpdate::Event { run_id, event }
            if run_id.as_str() == "new-1" && event.event == "capsule_created"));
        assert!(tail.poll(&store).unwrap().is_empty());

        run.event("launched", json!({})).unwrap();
        run.seal(&[]).unwrap();
        let updates = tail.poll(&store).unwrap();
        let names: Vec<String> = updates
            .iter()
            .map(|u| match u {
                LiveUpdate::Event { event, .. } => event.event.clone(),
                LiveUpdate::Finished { .. } => "finished".into(),
                LiveUpdate::Unreadable { .. } => "unreadable".into(),
                LiveUpdate::Interrupted { .. } => "interrupted".into(),
            })
            .collect();
        assert_eq!(names, ["launched", "sealing", "finished"]);
        assert!(tail.poll(&store).unwrap().is_empty());
    }

    #[test]
    fn only_appended_lines_are_read_and_a_partial_line_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let line = |seq: u64| format!("{{\"seq\":{seq},\"at\":\"t\",\"event\":\"e{seq}\"}}\n");
        std::fs::write(&path, line(1)).unwrap();
        let (events, next) = read_from(&path, 0).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(next, line(1).len() as u64);
        // A partial line is left for the next read.
        let mut more = line(2);
        more.push_str("{\"seq\":3");
        std::fs::write(&path, format!("{}{more}", line(1))).unwrap();
        let (events, next2) = read_from(&path, next).unwrap();
        assert_eq!(events.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
        // Reading from the end finds nothing new; a truncated file restarts at its end.
        let (events, _) = read_from(&path, next2).unwrap();
        assert!(events.is_empty());
        std::fs::write(&path, "").unwrap();
        assert_eq!(read_from(&path, next2).unwrap(), (Vec::new(), 0));
        // A symlink is not followed.
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(read_from(&link, 0).is_err());
    }

    #[test]
    fn an_unsealed_run_without_a_lock_holder_is_reported_interrupted_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut tail = LiveTail::start(&store).unwrap();
        let lock = store.lock(agentdiff_store::Wait::No, |_| {}).unwrap();
        let run = store.create_run(Some("i-1")).unwrap();
        run.event("capsule_created", json!({})).unwrap();
        let updates = tail.poll(&store).unwrap();
        assert_eq!(updates.len(), 1, "{updates:?}");
        assert!(tail.poll(&store).unwrap().is_empty());
        // The holder goes away without sealing: the run is interrupted, said once. (A child
        // another test thread forked while the lock was held shares the lock until it execs, so
        // the release can show a moment late.)
        drop(lock);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let updates = loop {
            let updates = tail.poll(&store).unwrap();
            if !updates.is_empty() || std::time::Instant::now() >= deadline {
                break updates;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert!(
            matches!(&updates[..], [LiveUpdate::Interrupted { run_id, session: false }]
                if run_id.as_str() == "i-1"),
            "{updates:?}"
        );
        run.event("late", json!({})).unwrap();
        assert!(tail.poll(&store).unwrap().is_empty());
    }

    /// A session capsule whose agent is `agent` (pid and start time).
    fn session(store: &Store, id: &str, agent: (u32, u64)) -> agentdiff_store::Capsule {
        let capsule = store.create_run(Some(id)).unwrap();
        let metadata = agentdiff_store::schema::Metadata {
            schema_version: agentdiff_store::SCHEMA_VERSION,
            run_id: id.into(),
            created_at: "t".into(),
            agentdiff_version: "0".into(),
            root: "/r".into(),
            argv: Vec::new(),
            task: None,
            backend: "session".into(),
            timeout_seconds: None,
            platform: "linux".into(),
            uid: Some(0),
            session: Some(agentdiff_store::schema::SessionMeta {
                agent: "claude-code".into(),
                agent_session_id: "a".into(),
                source: None,
                agent_pid: Some(agent.0),
                agent_started: Some(agent.1),
            }),
        };
        capsule
            .write_artifact(Artifact::Metadata, &metadata)
            .unwrap();
        capsule.event("session_started", json!({})).unwrap();
        capsule
    }

    #[test]
    fn an_open_session_is_followed_while_its_agent_lives_and_interrupted_once_it_is_gone() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut tail = LiveTail::start(&store).unwrap();
        // No agentdiff holds the lock between a session's hooks: the agent (here this test
        // process) is what keeps it open.
        let me = std::process::id();
        let started = agentdiff_host::process_identity::read_stat(me)
            .unwrap()
            .start_time_ticks;
        let open = session(&store, "s-open", (me, started));
        let updates = tail.poll(&store).unwrap();
        assert!(
            matches!(&updates[..], [LiveUpdate::Event { event, .. }] if event.event == "session_started"),
            "{updates:?}"
        );
        open.event("tool_call", json!({})).unwrap();
        assert_eq!(tail.poll(&store).unwrap().len(), 1);
        // The same pid with another start time is another process: the agent is gone.
        session(&store, "s-gone", (me, started + 1));
        let updates = tail.poll(&store).unwrap();
        assert!(
            updates.iter().any(
                |u| matches!(u, LiveUpdate::Interrupted { run_id, session: true }
                if run_id.as_str() == "s-gone")
            ),
            "{updates:?}"
        );
        assert!(
            !updates
                .iter()
                .any(|u| matches!(u, LiveUpdate::Interrupted { run_id, .. }
                if run_id.as_str() == "s-open")),
            "{updates:?}"
        );
    }

    #[test]
    fn a_run_sealed_while_its_lock_was_checked_is_sealed_not_interrupted() {
        use std::cell::Cell;
        // The run seals and lets the lock go between the seal check and the lock check.
        let sealed = Cell::new(false);
        let got = standing(
            || sealed.get(),
            || {
                sealed.set(true);
                false
            },
        );
        assert_eq!(got, Standing::Sealed);
        assert_eq!(standing(|| false, || false), Standing::Interrupted);
        assert_eq!(standing(|| false, || true), Standing::Running);
        assert_eq!(standing(|| true, || false), Standing::Sealed);
    }

    #[test]
    fn proc_locks_lines_are_matched_by_inode() {
        let locks = "1: FLOCK  ADVISORY  WRITE 20226 fe:00:5341210 0 EOF\n\
                     2: POSIX  ADVISORY  READ 7 08:01:42 0 EOF\n";
        assert!(locks_name_inode(locks, 5341210));
        assert!(locks_name_inode(locks, 42));
        assert!(!locks_name_inode(locks, 534121));
        assert!(!locks_name_inode("", 1));
    }
}
