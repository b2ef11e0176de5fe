//! The basics: argv without a shell, cwd, stdio routing, exit codes and signals, labels.

use std::process::{Command, Stdio};

use agentdiff_backend_api::{Level, ProcessRelation, RuntimeBackend};

use super::common::*;

#[test]
fn exit_code_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let ev = run(spec(dir.path(), &["sh", "-c", "sleep 0.2; exit 7"]));
    assert_eq!(ev.exit.code, Some(7));
    assert_eq!(ev.exit.signal, None);
    assert!(!ev.exit.timed_out);
    assert_eq!(ev.processes[0].relation, ProcessRelation::Root);
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    assert_eq!(
        ev.processes[0].executable,
        sh.file_name().unwrap().to_string_lossy()
    );
    assert!(ev.cleanup.records.is_empty(), "{:?}", ev.cleanup);
}

#[test]
fn terminating_signal_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let ev = run(spec(dir.path(), &["sh", "-c", "kill -KILL $$"]));
    assert_eq!(ev.exit.code, None);
    assert_eq!(ev.exit.signal, Some(libc::SIGKILL));
}

#[test]
fn argv_is_passed_without_a_shell_in_the_prepared_cwd() {
    let dir = tempfile::tempdir().unwrap();
    let ev = run(spec(
        dir.path(),
        &[
            "sh",
            "-c",
            "pwd; printf '%s\\n' \"$1\"",
            "x",
            "a;b $(id) `x`",
        ],
    ));
    assert_eq!(ev.exit.code, Some(0));
    let out = read(&dir.path().join("stdout.txt"));
    let mut lines = out.lines();
    assert_eq!(
        std::path::Path::new(lines.next().unwrap())
            .canonicalize()
            .unwrap(),
        dir.path().canonicalize().unwrap()
    );
    assert_eq!(lines.next(), Some("a;b $(id) `x`"));
    assert_eq!(ev.observation_root, dir.path().display().to_string());
}

#[test]
fn own_process_group_and_only_the_given_environment() {
    let dir = tempfile::tempdir().unwrap();
    let ev = run(spec(
        dir.path(),
        &["sh", "-c", "cat /proc/$$/stat; echo; env"],
    ));
    let out = read(&dir.path().join("stdout.txt"));
    let stat = agentdiff_host::process_identity::parse_stat(out.lines().next().unwrap()).unwrap();
    assert_eq!(
        stat.pgrp as u32, stat.pid,
        "the command leads its own process group"
    );
    assert_eq!(stat.pid, ev.processes[0].identity.pid);
    assert!(!out.contains("CARGO_PKG_NAME"), "environment leaked: {out}");
}

#[test]
fn unknown_program_is_a_launch_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = runtime().block_on(async {
        let b = agentdiff_backend_local::LocalBackend::new();
        let p = b
            .prepare(&spec(dir.path(), &["no-such-program-agentdiff"]))
            .unwrap();
        b.launch(
            p,
            agentdiff_backend_api::LaunchContext::new(files(dir.path())),
        )
        .await
        .err()
        .unwrap()
    });
    let msg = err.to_string();
    assert!(msg.contains("no-such-program-agentdiff"), "{msg}");
}

#[test]
fn stdout_goes_to_stderr_when_asked() {
    let out = Command::new(harness())
        .args([
            "--stdout-to-stderr",
            "--",
            "sh",
            "-c",
            "echo to-stdout; echo to-stderr >&2",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("to-stdout") && err.contains("to-stderr"),
        "{err}"
    );

    let out = Command::new(harness())
        .args(["--", "sh", "-c", "echo to-stdout"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to-stdout\n");
}

#[test]
fn evidence_labels_are_honest() {
    let dir = tempfile::tempdir().unwrap();
    let ev = run(spec(dir.path(), &["true"]));
    assert_eq!(ev.backend, "local");
    assert_eq!(ev.enforcement.as_str(), "none");
    assert!(!ev.capabilities.sandboxed);
    assert!(!ev.capabilities.network_enforcement);
    assert_eq!(ev.capabilities.processes, Level::Observed);
    assert_eq!(ev.capabilities.network, Level::Uncontrolled);
    assert_eq!(ev.capabilities.resources, Level::Uncontrolled);
    assert_eq!(ev.capabilities.privileges, Level::Uncontrolled);
    assert!(ev.wrapper_argv.is_none());
    assert_eq!(ev.ports.mode, agentdiff_backend_api::PortMode::Off);
    assert!(ev.ports.note.contains("does not disable"));
    assert_ne!(ev.tracking, agentdiff_backend_api::Tracking::Untracked);
}

#[test]
fn registered_through_inventory_and_ready() {
    let reg = agentdiff_plugins::Registry::from_inventory().unwrap();
    assert!(reg.ids().contains(&"local"));
    let b = reg.create("local").unwrap();
    let avail = runtime().block_on(b.availability(&agentdiff_backend_api::BackendOptions::new()));
    match avail {
        agentdiff_backend_api::Availability::Ready { detail } => {
            assert!(detail.contains("process tracking"), "{detail}")
        }
        other => panic!("{other:?}"),
    }
}
