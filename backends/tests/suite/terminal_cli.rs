//! `agentdiff run` in a real terminal (tmux): the agent owns the foreground, Ctrl-C stops it, and
//! the capsule is still sealed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
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

#[test]
fn ctrl_c_in_a_terminal_stops_the_agent_and_seals_the_capsule() {
    if Command::new("tmux").arg("-V").output().is_err() {
        agentdiff_conformance::skip_unless_required("tmux is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("a.txt"), "a\n").unwrap();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_agentdiff"));
    // The agent proves it can open the terminal, records its pid, then waits for Ctrl-C.
    let agent = "echo x >> a.txt; (echo via-tty > /dev/tty) && echo ok > tty-ok; \
                 echo $$ > agent.pid; exec sleep 300";
    let script = format!(
        "cd '{}' && AGENTDIFF_STATE_DIR='{}' '{}' run --run-id tty-run --fail-on never -- sh -c '{}'; echo $? > rc.txt; sleep 30",
        d.display(),
        super::state_dir().display(),
        bin.display(),
        agent
    );
    let tmux = Tmux(format!("agentdiff-cli-{}", std::process::id()));
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
    let pid: i32 = std::fs::read_to_string(d.join("agent.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| s.contains(") Z "))
                .unwrap_or(true),
        "the agent survived Ctrl-C"
    );
    let verify = Command::new(&bin)
        .args(["verify", "tty-run"])
        .current_dir(d)
        .env("AGENTDIFF_STATE_DIR", super::state_dir())
        .output()
        .unwrap();
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
}
