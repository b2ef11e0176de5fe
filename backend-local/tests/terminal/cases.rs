//! Interactive use: in a terminal the command owns the foreground (Ctrl-C reaches it, /dev/tty
//! opens); without one, SIGINT to the launcher still ends the tree with evidence.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use agentdiff_backend_api::RunEvidence;

use crate::common::*;

fn evidence(path: &Path) -> RunEvidence {
    serde_json::from_str(&read(path)).unwrap()
}

struct TmuxServer(String);

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .stderr(Stdio::null())
            .status();
    }
}

#[test]
fn ctrl_c_in_tmux_reaches_the_foreground_command_and_evidence_is_written() {
    if Command::new("tmux").arg("-V").output().is_err() {
        skip("tmux is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let agent = "cat /proc/$$/stat > stat.txt; \
                 (echo via-tty > /dev/tty) && echo ok > tty-ok; \
                 echo $$ > daemon.pid; exec sleep 300";
    let cmd = format!(
        "cd '{}' && '{}' --evidence ev.json -- sh -c '{}'; echo $? > rc.txt; sleep 30",
        d.display(),
        harness().display(),
        agent.replace('\'', "'\\''"),
    );
    let socket = format!("agentdiff-test-{}", std::process::id());
    let server = TmuxServer(socket.clone());
    let status = Command::new("tmux")
        .args([
            "-L",
            &server.0,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "80",
            "-y",
            "24",
        ])
        .arg(&cmd)
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        wait_for_file(&pidfile, Duration::from_secs(20)),
        "the command did not start under tmux"
    );
    std::thread::sleep(Duration::from_millis(300));

    // The command leads the terminal's foreground process group.
    let stat = agentdiff_host::process_identity::parse_stat(&read(&d.join("stat.txt"))).unwrap();
    let raw = read(&d.join("stat.txt"));
    let after_comm = &raw[raw.rfind(')').unwrap() + 2..];
    let tpgid: i32 = after_comm
        .split_whitespace()
        .nth(5)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        tpgid, stat.pgrp,
        "the command is not in the terminal's foreground"
    );
    assert_eq!(stat.pgrp as u32, stat.pid);
    assert_eq!(
        read(&d.join("tty-ok")).trim(),
        "ok",
        "/dev/tty could not be opened"
    );

    let sent = Command::new("tmux")
        .args(["-L", &socket, "send-keys", "C-c"])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(
        wait_for_file(&d.join("rc.txt"), Duration::from_secs(20)),
        "the launcher did not return after Ctrl-C"
    );
    let ev = evidence(&d.join("ev.json"));
    assert_eq!(ev.exit.signal, Some(libc::SIGINT), "{:?}", ev.exit);
    assert_eq!(read(&d.join("rc.txt")).trim(), "130");
    for p in &ev.processes {
        assert!(!alive(&p.identity), "{p:?} survived");
    }
}

#[test]
fn sigint_to_the_launcher_without_a_terminal_ends_the_tree_with_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let mut child = Command::new(harness())
        .current_dir(d)
        .args(["--evidence", "ev.json", "--", "sh", "-c"])
        .arg("sleep 300 & echo $! > daemon.pid; wait")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_for_file(&pidfile, Duration::from_secs(20)));
    // SAFETY: signal to the launcher we spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    let ev = evidence(&d.join("ev.json"));
    assert_eq!(ev.exit.interrupted_by, Some(libc::SIGINT));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    for p in &ev.processes {
        assert!(!alive(&p.identity), "{p:?} survived");
    }
    assert!(ev.processes.iter().any(|p| p.executable == "sleep"));
}

fn state_of(pid: u32) -> char {
    agentdiff_process::read_stat(pid)
        .map(|s| s.state)
        .unwrap_or('?')
}

fn wait_for_state(pid: u32, want: char) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if state_of(pid) == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn ctrl_z_stops_command_and_launcher_and_fg_resumes_both() {
    if Command::new("tmux").arg("-V").output().is_err()
        || Command::new("bash").arg("-c").arg("true").status().is_err()
    {
        skip("tmux and bash are needed for job control");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pidfile = d.join("daemon.pid");
    let _guard = PidFileGuard(vec![pidfile.clone()]);
    let server = TmuxServer(format!("agentdiff-jobs-{}", std::process::id()));
    let status = Command::new("tmux")
        .args([
            "-L",
            &server.0,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "30",
        ])
        .args(["bash", "--norc", "--noprofile", "-i"])
        .status()
        .unwrap();
    assert!(status.success());
    std::thread::sleep(Duration::from_millis(300));
    let line = format!(
        "cd '{}' && '{}' --evidence ev.json -- sh -c 'echo $PPID > launcher.pid; echo $$ > daemon.pid; exec sleep 300'",
        d.display(),
        harness().display()
    );
    let keys = |k: &[&str]| {
        assert!(Command::new("tmux")
            .args(["-L", &server.0, "send-keys"])
            .args(k)
            .status()
            .unwrap()
            .success())
    };
    keys(&[&line, "Enter"]);
    assert!(
        wait_for_file(&pidfile, Duration::from_secs(20)),
        "command did not start"
    );
    let child: u32 = read(&pidfile).trim().parse().unwrap();
    let launcher: u32 = read(&d.join("launcher.pid")).trim().parse().unwrap();
    std::thread::sleep(Duration::from_millis(200));

    keys(&["C-z"]);
    assert!(wait_for_state(child, 'T'), "the command did not stop");
    assert!(
        wait_for_state(launcher, 'T'),
        "the launcher did not stop with it"
    );

    keys(&["fg", "Enter"]);
    assert!(wait_for_state(child, 'S'), "the command did not continue");
    std::thread::sleep(Duration::from_millis(200));
    // The command has the terminal again: Ctrl-C reaches it.
    keys(&["C-c"]);
    assert!(
        wait_for_file(&d.join("ev.json"), Duration::from_secs(20)),
        "no evidence after Ctrl-C"
    );
    let ev = evidence(&d.join("ev.json"));
    assert_eq!(ev.exit.signal, Some(libc::SIGINT), "{:?}", ev.exit);
}
