//! `.agentdiff/last-run`: the id of the newest run this store created, so that a question about
//! "the last run" (the orphan notice every subcommand prints) reads one small file instead of
//! stat'ing every run directory, a cost that grew with the store's history.
//!
//! Invariants: the file is replaced by rename (a reader sees an old or a new id, never a torn
//! one) when a run directory is created, before any artifact of that run is written (a
//! transaction first starts a held sandbox, whose start files are not artifacts); it holds a
//! valid [`RunId`] or is ignored. It is a hint, written without an fsync: after a crash it may
//! name an older run.
//!
//! Not defended: a process that can write `.agentdiff/` can make the file name any run (or
//! remove it, which brings back the listing of run directories). Nothing is trusted because of
//! it: the run it names is opened and checked like any other, and a change to it while a command
//! runs is a store change the tamper check reports.

use super::{atomic, RunId, Store};

/// File name below `.agentdiff/`.
pub const LAST_RUN_FILE_NAME: &str = "last-run";

/// An id is at most this long (`RunId` is bounded far below it).
const MAX_BYTES: u64 = 256;

impl Store {
    /// Records `id` as the newest run. A failure only costs the next reader the listing of run
    /// directories, so it is not an error of the run.
    pub fn note_last_run(&self, id: &RunId) {
        let line = format!("{}\n", id.as_str());
        let _ = atomic::write_atomic(
            self.dir(),
            LAST_RUN_FILE_NAME,
            line.as_bytes(),
            atomic::Durability::Unflushed,
        );
    }

    /// The id `.agentdiff/last-run` names; `None` when the file is missing, unreadable or does not
    /// hold a valid run id.
    pub fn last_run(&self) -> Option<RunId> {
        let bytes = atomic::read_bounded(&self.dir().join(LAST_RUN_FILE_NAME), MAX_BYTES).ok()?;
        let text = std::str::from_utf8(&bytes).ok()?;
        RunId::parse(text.strip_suffix('\n')?).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_created_run_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.last_run(), None);
        store.create_run(Some("r1")).unwrap();
        assert_eq!(store.last_run().unwrap().as_str(), "r1");
        let generated = store.create_run(None).unwrap();
        assert_eq!(store.last_run().unwrap().as_str(), generated.id().as_str());
        // A refused id (the directory exists) changes nothing.
        assert!(store.create_run(Some("r1")).is_err());
        assert_eq!(store.last_run().unwrap().as_str(), generated.id().as_str());
    }

    #[test]
    fn a_file_that_is_not_one_run_id_names_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let path = store.dir().join(LAST_RUN_FILE_NAME);
        for bad in ["", "r1", "../r1\n", "r1\nr2\n", "\u{1b}[31m\n"] {
            std::fs::write(&path, bad).unwrap();
            assert_eq!(store.last_run(), None, "{bad:?}");
        }
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        std::fs::write(dir.path().join("elsewhere"), "r1\n").unwrap();
        assert_eq!(store.last_run(), None, "a symlink is not followed");
    }
}
