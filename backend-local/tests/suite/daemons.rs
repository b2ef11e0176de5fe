//! Daemons: double-forked and `setsid` leftovers are recorded as re-parented and ended.

use std::time::{Duration, Instant};

use agentdiff_backend_api::{CleanupOutcome, ProcessRelation, RunEvidence};

use super::common::*;

fn daemon_case(tracking: &str, script: &str) {
    let _lock = (tracking != "cgroup").then(poll_lock);
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let ev: RunEvidence = run(with_tracking(
        spec(dir.path(), &["sh", "-c", script]),
        tracking,
    ));
    let expected_tracking = match tracking {
        "cgroup" => "cgroup",
        "proc_scan" => "subreaper_proc_scan",
        _ => "subreaper_proc_poll",
    };
    assert_eq!(ev.tracking.as_str(), expected_tracking);
    assert_eq!(ev.exit.code, Some(0));
    let daemon_pid: u32 = read(&pidfile).trim().parse().expect("daemon pid written");
    let rec = ev
        .processes
        .iter()
        .find(|p| p.identity.pid == daemon_pid)
        .unwrap_or_else(|| panic!("daemon {daemon_pid} not recorded: {:#?}", ev.processes));
    assert_eq!(rec.relation, ProcessRelation::Reparented, "{rec:#?}");
    if script != QUICK_EXIT {
        assert_eq!(rec.executable, "sleep");
    }
    assert!(rec.alive_after_root_exit);
    let cleaned = ev
        .cleanup
        .records
        .iter()
        .find(|r| r.identity == rec.identity)
        .expect("daemon cleaned up");
    assert_eq!(cleaned.outcome, CleanupOutcome::Terminated);
    assert!(!alive(&rec.identity), "daemon still running after the run");
    assert_eq!(
        ev.cleanup.mechanism,
        agentdiff_backend_api::CleanupMechanism::Pidfd
    );
    assert!(ev.cleanup.leftovers() >= 1);
}

/// `$start` (which writes the daemon's pid to daemon.pid), then a root that waits (up to 10 s)
/// until the daemon has reached `exec sleep`, so its executable is `sleep` when it is recorded
/// however slow the machine; the daemon is re-parented as soon as the subshell exits.
macro_rules! then_wait_for_the_daemons_exec {
    ($start:literal) => {
        concat!(
            $start,
            "; i=0; until [ \"$(cat /proc/$(cat daemon.pid)/comm)\" = sleep ] || [ $i -ge 1000 ]; \
             do sleep 0.01; i=$((i+1)); done; exit 0"
        )
    };
}
const DOUBLE_FORK: &str = then_wait_for_the_daemons_exec!("(sleep 300 & echo $! > daemon.pid)");
const SETSID: &str = then_wait_for_the_daemons_exec!("(setsid sleep 300 & echo $! > daemon.pid)");
const QUICK_EXIT: &str = "(setsid sleep 300 & echo $! > daemon.pid); exit 0";

#[test]
fn double_forked_daemon_is_reparented_and_ended_with_cgroup() {
    if !cgroup_available() {
        return;
    }
    daemon_case("cgroup", DOUBLE_FORK);
}

#[test]
fn setsid_daemon_is_reparented_and_ended_with_cgroup() {
    if !cgroup_available() {
        return;
    }
    daemon_case("cgroup", SETSID);
}

#[test]
fn setsid_daemon_is_reparented_and_ended_with_a_full_proc_scan() {
    daemon_case("proc_scan", SETSID);
    daemon_case("proc_scan", DOUBLE_FORK);
}

#[test]
fn daemon_of_a_root_that_exits_at_once_is_reparented_and_ended() {
    daemon_case("proc_poll", QUICK_EXIT);
    if cgroup_available() {
        daemon_case("cgroup", QUICK_EXIT);
    }
}

#[test]
fn double_forked_daemon_is_reparented_and_ended_with_proc_polling() {
    daemon_case("proc_poll", DOUBLE_FORK);
}

#[test]
fn setsid_daemon_is_reparented_and_ended_with_proc_polling() {
    daemon_case("proc_poll", SETSID);
}

/// Whether this machine lets agentdiff create run cgroups; a skip says why and is not a pass.
fn cgroup_available() -> bool {
    let m = agentdiff_process::tracking_mechanisms_available();
    let cg = m.iter().find(|m| m.name == "cgroup");
    match cg {
        Some(c) if c.available => true,
        other => {
            skip(&format!("no run cgroup can be created here: {other:?}"));
            false
        }
    }
}

#[test]
fn background_sleep_does_not_hold_the_exit_code_or_survive() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let start = Instant::now();
    let ev = run(spec(
        dir.path(),
        &["sh", "-c", "sleep 100 & echo $! > daemon.pid; exit 5"],
    ));
    // Returns once the root exited and the leftover was ended, not after the sleep.
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(ev.exit.code, Some(5));
    let pid: u32 = read(&pidfile).trim().parse().unwrap();
    let rec = ev
        .processes
        .iter()
        .find(|p| p.identity.pid == pid)
        .expect("background sleep recorded");
    assert!(!alive(&rec.identity));
    for p in &ev.processes {
        assert!(!alive(&p.identity), "{p:?} still alive");
    }
}

#[test]
fn term_ignoring_tree_is_killed_after_the_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let mut s = spec(
        dir.path(),
        &[
            "sh",
            "-c",
            "trap '' TERM; sleep 300 & echo $! >> daemon.pid; sleep 300 & echo $! >> daemon.pid; wait",
        ],
    );
    // The timeout is what ends the run: generous, so the tree is set up (trap, both sleeps)
    // before it fires even on a loaded machine.
    s.timeout = Some(Duration::from_secs(2));
    s.grace = Duration::from_millis(300);
    let ev = run(s);
    assert!(ev.exit.timed_out);
    assert_eq!(ev.exit.signal, Some(libc::SIGKILL));
    assert_eq!(ev.exit.code, None);
    let root = &ev.processes[0];
    assert_eq!(root.relation, ProcessRelation::Root);
    let root_rec = ev
        .cleanup
        .records
        .iter()
        .find(|r| r.identity == root.identity)
        .expect("root cleaned up");
    assert_eq!(root_rec.outcome, CleanupOutcome::Killed);
    let pid: u32 = read(&pidfile).lines().next().unwrap().parse().unwrap();
    let sleeper = ev
        .cleanup
        .records
        .iter()
        .find(|r| r.identity.pid == pid)
        .expect("sleeper cleaned up");
    // SIG_IGN is inherited: the sleeper ignores TERM too.
    assert_eq!(sleeper.outcome, CleanupOutcome::Killed);
    assert!(!alive(&sleeper.identity));
}

#[test]
fn timeout_ends_the_whole_tree() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let mut s = spec(
        dir.path(),
        &[
            "sh",
            "-c",
            "sleep 300 & echo $! >> daemon.pid; (sleep 300 & echo $! >> daemon.pid); \
             sleep 300 & echo $! >> daemon.pid; wait",
        ],
    );
    // Generous, so all three sleeps have started before it fires even on a loaded machine.
    s.timeout = Some(Duration::from_secs(2));
    let ev = run(s);
    assert!(ev.exit.timed_out);
    assert_eq!(ev.exit.signal, Some(libc::SIGTERM));
    assert!(ev.exit.interrupted_by.is_none());
    let sleeps = ev
        .processes
        .iter()
        .filter(|p| p.executable == "sleep")
        .count();
    assert_eq!(sleeps, 3, "{:#?}", ev.processes);
    for p in &ev.processes {
        assert!(!alive(&p.identity), "{p:?} survived the timeout");
    }
    assert!(ev
        .cleanup
        .records
        .iter()
        .all(|r| r.outcome == CleanupOutcome::Terminated));
}

#[test]
fn interruption_ends_the_tree_and_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let ctx = agentdiff_backend_api::LaunchContext {
        stdio: files(dir.path()),
        interrupt: rx,
        hold_reap: None,
        hold_start: false,
    };
    let s = spec(
        dir.path(),
        &["sh", "-c", "sleep 300 & echo $! > daemon.pid; sleep 300"],
    );
    let pf = pidfile.clone();
    let sender = std::thread::spawn(move || {
        wait_for_file(&pf, Duration::from_secs(10));
        let _ = tx.send(Some(libc::SIGINT));
        // Keep the sender until the run ended.
        std::thread::sleep(Duration::from_secs(2));
    });
    let ev = run_ctx(s, ctx);
    sender.join().unwrap();
    assert_eq!(ev.exit.interrupted_by, Some(libc::SIGINT));
    assert!(!ev.exit.timed_out);
    assert_eq!(ev.exit.signal, Some(libc::SIGTERM));
    for p in &ev.processes {
        assert!(!alive(&p.identity), "{p:?} survived the interruption");
    }
}

#[test]
fn recorded_identity_with_a_reused_pid_is_refused_and_survives() {
    let mut child = std::process::Command::new("sleep")
        .arg("300")
        .stdin(std::process::Stdio::null())
        .spawn()
        .unwrap();
    struct Kill<'a>(&'a mut std::process::Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut id = agentdiff_process::read_identity(child.id()).unwrap();
    let guard = Kill(&mut child);
    // The record says the pid started at another time: it is another process now.
    id.start_time_ticks = id.start_time_ticks.saturating_sub(1);
    let report = runtime().block_on(async {
        use agentdiff_backend_api::RuntimeBackend;
        agentdiff_backend_local::LocalBackend::new()
            .cleanup_run("r", std::slice::from_ref(&id), Duration::from_millis(200))
            .await
    });
    assert_eq!(report.records.len(), 1);
    assert_eq!(report.records[0].outcome, CleanupOutcome::PidReused);
    assert!(
        guard.0.try_wait().unwrap().is_none(),
        "the other process must survive"
    );
}
