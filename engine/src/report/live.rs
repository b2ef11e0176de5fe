//! Following runs in progress: each poll reads the new complete lines of `events.jsonl` of every
//! run that is not finished, through the capsule's typed reader. A run is finished once it is
//! sealed and its events are read to the end; it then yields one [`LiveUpdate::Finished`] with
//! its status and change count.
//!
//! Invariants: read-only (nothing in the store is written or locked); each event is yielded once
//! per [`LiveTail`]; a line still being written is left for the next poll.
//!
//! Not defended: events are what the run recorded, in its own words; a command that can write the
//! store (an unconfined backend) can write events too. A run whose capsule cannot be read is
//! reported once and then left alone.

use std::collections::{BTreeMap, BTreeSet};

use crate::store::doc::Event;
use crate::store::{RunId, Store, StoreError};

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
            Err(e) => return self.give_up(id, e, out),
        };
        // Sealed is checked before reading, so the events read afterwards are the last ones.
        let sealed = capsule.is_sealed();
        let offset = self.offsets.get(&id).copied().unwrap_or(0);
        let (events, next) = match capsule.events_from(offset) {
            Ok(found) => found,
            Err(e) => return self.give_up(id, e, out),
        };
        self.offsets.insert(id.clone(), next);
        out.extend(events.into_iter().map(|event| LiveUpdate::Event {
            run_id: id.clone(),
            event,
        }));
        if sealed {
            let result = capsule.result().ok();
            out.push(LiveUpdate::Finished {
                run_id: id.clone(),
                status: result.as_ref().map(|r| r.status.as_str().to_string()),
                changes: result.as_ref().map(|r| r.changes.len()),
            });
            self.offsets.remove(&id);
            self.done.insert(id);
        }
    }

    fn give_up(&mut self, id: RunId, e: StoreError, out: &mut Vec<LiveUpdate>) {
        out.push(LiveUpdate::Unreadable {
            run_id: id.clone(),
            problem: e.to_string(),
        });
        self.offsets.remove(&id);
        self.done.insert(id);
    }
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
            })
            .collect();
        assert_eq!(names, ["launched", "sealing", "finished"]);
        assert!(tail.poll(&store).unwrap().is_empty());
    }
}
