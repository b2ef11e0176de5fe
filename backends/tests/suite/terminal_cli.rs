//! `agentdiff run` in a real terminal (tmux): the agent owns the foreground, Ctrl-C stops it, and
//! the capsule is still sealed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

struct Tmux(String);

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .stderr(Stdio::null())
            .status();
    }
}

fn wait_for(path: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if path.exists()
            && std::fs::metadata(path)
                .map(|m| m.len() > 0)
                .unwrap_or(false)
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Host pids whose command line contains `needle`.
fn pids_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(needle))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn ctrl_c_in_a_terminal_stops_the_agent_and_seals_the_capsule() {
    ctrl_c_case(&[], false);
}

/// The bwrap sandbox keeps the terminal usable (the agent opens /dev/tty, Ctrl-C ends it) while
/// refusing keystroke injection into it.
#[test]
fn ctrl_c_in_a_terminal_reaches_a_bwrap_sandbox_that_cannot_inject_keystrokes() {
    let bwrap = Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !bwrap {
        agentdiff_conformance::skip_unless_required("bwrap cannot run here");
        return;
    }
    let d = ctrl_c_case(&["--runtime", "bwrap"], true);
    let sti = std::fs::read_to_string(d.path().join("sti.txt")).unwrap();
    assert!(sti.contains("Operation not permitted"), "TIOCSTI: {sti}");
}

/// `try_inject`: the agent also tries TIOCSTI on its terminal (only where it must be refused, so
/// an unsandboxed run does not type into the test's terminal).
fn ctrl_c_case(extra: &[&str], try_inject: bool) -> tempfile::TempDir {
    ctrl_c_case_on(None, extra, try_inject)
}

/// [`ctrl_c_case`] with `path` as agentdiff's `PATH` (external backends are found there).
pub fn ctrl_c_case_on(
    path: Option<&std::ffi::OsStr>,
    extra: &[&str],
    try_inject: bool,
) -> tempfile::TempDir {
    if Command::new("tmux").arg("-V").output().is_err() {
        agentdiff_conformance::skip_unless_required("tmux is not installed");
        return tempfile::tempdir().unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.txt"), "a\n").unwrap();
    // A sleep whose argument names this test run, so the host can look for it (a pid from
    // inside a pid namespace means nothing on the host).
    let token = format!("300.{}{}", std::process::id(), u8::from(try_inject));
    let inject = if try_inject {
        "python3 -c \"import fcntl,termios; fcntl.ioctl(open(\\\"/dev/tty\\\"), termios.TIOCSTI, b\\\"x\\\")\" 2> sti.txt;"
    } else {
        ""
    };
    // The agent proves it can open the terminal, tries to inject a keystroke into it, records
    // its pid, then waits for Ctrl-C.
    let agent = format!(
        "echo x >> a.txt; (echo via-tty > /dev/tty) && echo ok > tty-ok; {inject} \
         echo $$ > agent.pid; exec sleep {token}"
    );
    let path_prefix = path
        .map(|p| format!("PATH='{}' ", p.to_string_lossy()))
        .unwrap_or_default();
    let script = format!(
        "cd '{}' && unset AGENTDIFF_POLICY && {path_prefix}AGENTDIFF_STATE_DIR='{}' '{}' run {} --run-id tty-run --fail-on never -- sh -c '{}'; echo $? > rc.txt; sleep 30",
        d.display(),
        super::state_dir().display(),
        super::bin().display(),
        extra.join(" "),
        agent
    );
    let tmux = Tmux(format!(
        "agentdiff-cli-{}-{}-{}",
        std::process::id(),
        u8::from(try_inject),
        extra.join("-")
    ));
    let ok = Command::new("tmux")
        .args([
            "-L",
            &tmux.0,
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-x",
            "100",
            "-y",
            "30",
        ])
        .arg(&script)
        .status()
        .unwrap()
        .success();
    assert!(ok, "tmux did not start");
    assert!(
        wait_for(&d.join("agent.pid"), Duration::from_secs(30)),
        "the agent did not start under tmux"
    );
    assert!(
        d.join("tty-ok").exists(),
        "the agent could not open /dev/tty"
    );
    std::thread::sleep(Duration::from_millis(300));
    let sent = Command::new("tmux")
        .args(["-L", &tmux.0, "send-keys", "C-c"])
        .status()
        .unwrap()
        .success();
    assert!(sent);
    assert!(
        wait_for(&d.join("rc.txt"), Duration::from_secs(30)),
        "agentdiff did not end after Ctrl-C"
    );
    // Killed by SIGINT: 128 + 2.
    let rc = std::fs::read_to_string(d.join("rc.txt")).unwrap();
    assert_eq!(rc.trim(), "130", "exit code after Ctrl-C");
    let survivors: Vec<String> = pids_with(&format!("sleep\0{token}"))
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false)
        })
        .collect();
    assert!(
        survivors.is_empty(),
        "the agent survived Ctrl-C: {survivors:?}"
    );
    let verify = super::agentdiff(d, &["verify", "tty-run"]);
    assert!(
        verify.status.success(),
        "the capsule is not sealed: {}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let result: Value = serde_json::from_slice(
        &std::fs::read(d.join(".agentdiff/runs/tty-run/result.json")).unwrap(),
    )
    .unwrap();
    assert!(
        matches!(result["status"].as_str(), Some("failed" | "terminated")),
        "{result:#}"
    );
    assert_eq!(result["runtime"]["exit"]["signal"], 2, "{result:#}");
    // The edit made before Ctrl-C is still evidence.
    assert!(result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["path"] == "a.txt"));
    dir
}
