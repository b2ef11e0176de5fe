//! Runs whose monitor died: the capsule is unsealed, the command was launched, the agentdiff
//! process that supervised it is gone, and processes the run recorded are still alive. Every
//! agentdiff command run in such a root points the user to `agentdiff cleanup RUN`.
//!
//! Invariants: only the last run is examined: the one `.agentdiff/last-run` names (one small
//! file, whatever the number of runs), or in a store without that file the most recently
//! modified run directory (one `stat` per run directory); then one capsule. Nothing is signalled
//! or written, and every identity is checked by pid + start time + boot id, so a recycled pid
//! never makes a run look orphaned. A run whose `launched` event names no monitor identity
//! (recorded before monitors were named) is not reported: a run in progress could not be told
//! apart from an orphaned one.
//!
//! Not defended: a command that can write `.agentdiff/` (the local backend) can point
//! `last-run` elsewhere and so keep the notice from being printed; `agentdiff cleanup RUN` and
//! the tamper check of the run that command ran in are unaffected.

use std::path::Path;

use agentdiff_host::process_identity::{boot_id, read_stat, ProcessIdentity};
use agentdiff_store::{RunId, Store};

/// The id of the root's last run when its monitor died and its processes still run.
pub fn orphaned_last_run(project_root: &Path) -> Option<String> {
    let store = Store::open_existing(project_root).ok()?;
    let last = store.last_run().or_else(|| newest_run_dir(&store))?;
    let capsule = store.open_run(last.as_str()).ok()?;
    if capsule.is_sealed() {
        return None;
    }
    let launched = capsule.launched_event().ok()??;
    let monitor = launched.monitor?;
    if running(&monitor) {
        // The run is still in progress.
        return None;
    }
    let mut alive = launched.root.as_ref().is_some_and(running);
    #[cfg(target_os = "linux")]
    if !alive {
        if let Some(cg) = &launched.cgroup {
            alive = std::fs::read_to_string(Path::new(cg).join("cgroup.procs"))
                .is_ok_and(|t| t.lines().any(|l| !l.trim().is_empty()));
        }
    }
    alive.then(|| last.as_str().to_string())
}

/// The most recently modified run directory: for a store without `.agentdiff/last-run` (written
/// by every run since it exists), one `stat` per run directory.
fn newest_run_dir(store: &Store) -> Option<RunId> {
    std::fs::read_dir(store.runs_dir())
        .ok()?
        .flatten()
        .filter_map(|e| {
            let id = RunId::parse(e.file_name().to_str()?).ok()?;
            let modified = e.metadata().ok()?.modified().ok()?;
            Some((modified, id))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, id)| id)
}

/// Whether `id` names a process that runs now (a zombie has ended; an unreadable boot id or
/// process counts as not running, so no notice is printed on doubt).
fn running(id: &ProcessIdentity) -> bool {
    boot_id().is_ok_and(|b| b == id.boot_id)
        && read_stat(id.pid)
            .is_ok_and(|s| s.start_time_ticks == id.start_time_ticks && !s.is_zombie())
}

/// The one line the CLI prints for an orphaned run.
pub fn notice(run_id: &str) -> String {
    format!(
        "agentdiff: the monitor of run {} died while its command ran, and processes of that run \
         are still running; stop them with: agentdiff cleanup {}",
        agentdiff_host::redact::escape_terminal(run_id),
        agentdiff_host::redact::escape_terminal(run_id)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_store::Store;

    fn launched(root: &Path, id: &str, fields: serde_json::Value) {
        let store = Store::open(root).unwrap();
        let capsule = store.create_run(Some(id)).unwrap();
        capsule.event("launched", fields).unwrap();
    }

    fn dead_identity() -> ProcessIdentity {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let id = agentdiff_process::read_identity(child.id()).unwrap_or(ProcessIdentity {
            pid: child.id(),
            start_time_ticks: 1,
            boot_id: agentdiff_process::boot_id().unwrap(),
        });
        child.wait().unwrap();
        id
    }

    /// A live process to record as a run's root; ended when dropped.
    struct Sleeper(std::process::Child);

    impl Sleeper {
        fn start() -> (Sleeper, ProcessIdentity) {
            let child = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let id = agentdiff_process::read_identity(child.id()).unwrap();
            (Sleeper(child), id)
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_dead_monitor_with_a_live_root_is_reported_and_a_live_monitor_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (_sleeper, root) = Sleeper::start();
        launched(
            dir.path(),
            "r1",
            serde_json::json!({"root": root, "monitor": dead_identity(), "cgroup": null}),
        );
        assert_eq!(orphaned_last_run(dir.path()).as_deref(), Some("r1"));
        assert!(notice("r1").contains("agentdiff cleanup r1"));

        // The monitor is this test process: a run in progress, not an orphan.
        let me = agentdiff_process::read_identity(std::process::id()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        launched(
            dir.path(),
            "r2",
            serde_json::json!({"root": root, "monitor": me, "cgroup": null}),
        );
        assert_eq!(orphaned_last_run(dir.path()), None);
    }

    #[test]
    fn the_last_run_created_is_examined_and_without_its_record_the_newest_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (_sleeper, root) = Sleeper::start();
        let orphan = serde_json::json!({"root": root, "monitor": dead_identity()});
        launched(dir.path(), "r1", serde_json::json!({}));
        launched(dir.path(), "r2", orphan);
        // A later write into r1 (a recovery artifact) does not make r1 the last run.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let store = Store::open(dir.path()).unwrap();
        std::fs::write(store.runs_dir().join("r1").join("note"), "x").unwrap();
        assert_eq!(orphaned_last_run(dir.path()).as_deref(), Some("r2"));
        // A store from before `last-run`: the most recently modified directory is the last run.
        std::fs::remove_file(store.dir().join(agentdiff_store::LAST_RUN_FILE_NAME)).unwrap();
        assert_eq!(orphaned_last_run(dir.path()), None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(store.runs_dir().join("r2").join("note"), "x").unwrap();
        assert_eq!(orphaned_last_run(dir.path()).as_deref(), Some("r2"));
    }

    #[test]
    fn no_store_no_launch_or_nothing_alive_is_silent() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(orphaned_last_run(dir.path()), None);
        launched(
            dir.path(),
            "r1",
            serde_json::json!({"root": dead_identity(), "monitor": dead_identity()}),
        );
        assert_eq!(orphaned_last_run(dir.path()), None);
    }
}
