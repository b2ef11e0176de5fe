//! Two projects using the same `--run-id` against one real podman: run ids are unique only per
//! store, so the container's name and label carry a digest of the project root. The second run
//! neither collides with the first's container nor sweeps it away, and both runs' evidence is
//! their own. The recorded engine argv says which user ran the command (`--user 65532:65532`,
//! not redacted).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agentdiff_backend_container::argv::RunIdentity;
use agentdiff_conformance::skip_unless_required;
use serde_json::Value;

use super::process_evidence_cli::{busybox_rootfs, podman_missing};
use super::{assert_exit, json_of, text};

fn run_args<'a>(rootfs: &'a str, script: &'a str) -> Vec<&'a str> {
    vec![
        "run",
        "--run-id",
        "shared-1",
        "--runtime",
        "container",
        "--rootfs",
        rootfs,
        "--format",
        "json",
        "--fail-on",
        "never",
        "--",
        "sh",
        "-c",
        script,
    ]
}

fn runtime_json(root: &std::path::Path) -> Value {
    let path = root.join(".agentdiff/runs/shared-1/runtime.json");
    serde_json::from_slice(&fs::read(path).unwrap()).unwrap()
}

#[test]
fn the_same_run_id_in_two_roots_runs_twice_and_neither_touches_the_other() {
    if let Some(reason) = podman_missing() {
        skip_unless_required(&reason);
        return;
    }
    let rootfs = busybox_rootfs();
    let rootfs_arg = rootfs.path().to_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let (ra, rb) = (dir.path().join("ra"), dir.path().join("rb"));
    for r in [&ra, &rb] {
        fs::create_dir(r).unwrap();
        fs::write(r.join("f"), "f\n").unwrap();
    }
    let key_a = RunIdentity::new(&ra, "shared-1").unwrap();
    let a = super::cmd(&ra, &run_args(&rootfs_arg, "sleep 4; echo done-a > a.out"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Not a timing assertion: how long to wait for A's container to run at all.
    let give_up = Instant::now() + Duration::from_secs(60);
    let filter = format!("label={}", key_a.label());
    loop {
        let out = Command::new("podman")
            .args(["ps", "-q", "--filter", &filter])
            .output()
            .unwrap();
        if !text(&out.stdout).trim().is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "A's container never started");
        std::thread::sleep(Duration::from_millis(100));
    }

    let b = super::cmd(&rb, &run_args(&rootfs_arg, "echo b > b.out"))
        .output()
        .unwrap();
    assert_exit(&b, 0);
    let rb_result = json_of(&b);
    assert_eq!(rb_result["exit_code"], 0, "{rb_result:#}");
    let a = a.wait_with_output().unwrap();
    assert_exit(&a, 0);
    let ra_result = json_of(&a);
    assert_eq!(ra_result["exit_code"], 0, "A was disturbed: {ra_result:#}");
    assert_eq!(super::changed_paths(&ra_result), ["a.out"], "{ra_result:#}");
    assert_eq!(super::changed_paths(&rb_result), ["b.out"], "{rb_result:#}");

    let (rta, rtb) = (runtime_json(&ra), runtime_json(&rb));
    for rt in [&rta, &rtb] {
        assert_eq!(
            rt["wrapper"]["leftover_containers_removed"],
            serde_json::json!([]),
            "{rt:#}"
        );
        assert!(
            rt["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .all(|w| !w.as_str().unwrap().contains("removed")),
            "{rt:#}"
        );
        // The argv says which user ran the command.
        let argv: Vec<&str> = rt["wrapper_argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let at = argv.iter().position(|a| *a == "--user").unwrap();
        assert_eq!(argv[at + 1], "65532:65532", "{argv:?}");
    }
    assert_eq!(rta["wrapper"]["container_name"], key_a.container_name());
    assert_ne!(
        rta["wrapper"]["container_name"],
        rtb["wrapper"]["container_name"]
    );
    assert_ne!(
        rta["wrapper"]["container_id"],
        rtb["wrapper"]["container_id"]
    );
}
