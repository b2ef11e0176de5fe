//! The container backend against an engine on "another machine", through the binary: a real
//! podman API service that shares no filesystem with the test (its own mount namespace, a
//! private `/tmp`, a loopback TCP port), reached with the docker client as users reach build hosts.
//!
//! The reproduction that made remote mode: `DOCKER_HOST=tcp://… agentdiff run --runtime container
//! --engine docker …` let the engine create an empty `/workspace`, and the run was recorded as an
//! ordinary failed run with `changes: 0`. Now that environment is refused before anything runs,
//! and with `engine-host=env` the command sees the project, its changes are captured, sealed with
//! the engine's identity and promoted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Command;

use agentdiff_test_support::remote_engine::{start_remote_engine, REMOTE_IMAGE};
use serde_json::Value;

use super::{assert_exit, json_of, text};

/// What the test needs here, or why it cannot run.
fn missing() -> Option<String> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("podman", &["info", "--format", "{{.Host.OCIRuntime.Name}}"]) {
        return Some("podman (with `podman info` working; see ENVIRONMENT.md)".into());
    }
    if !works("docker", &["--version"]) {
        return Some("the docker client".into());
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox (busybox-static)".into());
    }
    if !works("unshare", &["-m", "true"]) {
        return Some("a private mount namespace (unshare -m, root) for the engine".into());
    }
    None
}

/// `agentdiff ARGS` in `root` with the docker client pointed at `url`.
fn with_engine(root: &Path, url: &str, args: &[&str]) -> std::process::Output {
    super::cmd(root, args)
        .env("DOCKER_HOST", url)
        .env_remove("CONTAINER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .output()
        .unwrap()
}

#[test]
fn an_engine_elsewhere_is_refused_unless_named_and_then_runs_on_the_shipped_workspace() {
    if let Some(reason) = missing() {
        agentdiff_test_support::skip(&reason);
        return;
    }
    // Under /tmp, which the engine's namespace replaces with its own tmpfs.
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let root = dir.path().join("project");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a.txt"), "a before\n").unwrap();
    fs::write(root.join("del.txt"), "delete me\n").unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--format",
            "json",
            "--fail-on",
            "never",
            "--runtime",
            "container",
            "--engine",
            "docker",
            "--image",
            REMOTE_IMAGE,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[
            "--",
            "sh",
            "-c",
            "cat a.txt > seen.txt && rm del.txt && echo new > new.txt",
        ]);
        with_engine(&root, &engine.url, &args)
    };

    // The reproduction: an engine reached through DOCKER_HOST without `engine-host` is refused
    // before anything runs, naming the variable and the remedy.
    let refused = run(&[]);
    assert_exit(&refused, 64);
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("DOCKER_HOST") && stderr.contains("engine-host=env"),
        "{stderr}"
    );
    let listed = with_engine(&root, &engine.url, &["runs", "--format", "json"]);
    assert_exit(&listed, 0);
    assert_eq!(
        json_of(&listed),
        serde_json::json!([]),
        "no run was recorded"
    );

    // Named: the command saw the project (a.txt was shipped in), and its changes came back.
    let out = run(&["--backend-option", "engine-host=env"]);
    assert_exit(&out, 0);
    let result = json_of(&out);
    assert_eq!(result["exit_code"], 0, "{result:#}");
    let mut changed = super::changed_paths(&result);
    changed.sort();
    assert_eq!(changed, ["del.txt", "new.txt", "seen.txt"], "{result:#}");
    // A private workspace: the project itself is untouched until promote.
    assert!(!root.join("seen.txt").exists() && root.join("del.txt").exists());
    let id = result["run_id"].as_str().unwrap();
    let runtime = runtime_json(&root, id);
    assert_eq!(runtime["capabilities"]["host_repository"], "enforced");
    assert_eq!(
        runtime["wrapper"]["remote"]["engine"]["endpoint"],
        engine.url
    );
    assert_exit(&with_engine(&root, &engine.url, &["verify", id]), 0);

    // Rollback has nothing to undo in the project; promote applies the shipped-back changes.
    let rollback = with_engine(&root, &engine.url, &["rollback", id, "--all"]);
    assert_exit(&rollback, 64);
    assert!(
        text(&rollback.stderr).contains("promote"),
        "{}",
        text(&rollback.stderr)
    );
    let promoted = with_engine(&root, &engine.url, &["promote", id, "--all"]);
    assert_exit(&promoted, 0);
    assert_eq!(
        fs::read_to_string(root.join("seen.txt")).unwrap(),
        "a before\n"
    );
    assert_eq!(fs::read_to_string(root.join("new.txt")).unwrap(), "new\n");
    assert!(!root.join("del.txt").exists());

    // Nothing is left on the engine.
    let left = Command::new("podman")
        .args(["--url", &engine.url, "ps", "-a", "-q"])
        .output()
        .unwrap();
    assert_eq!(text(&left.stdout).trim(), "");
    drop(engine);
}

/// The run's sealed `runtime.json`.
fn runtime_json(root: &Path, id: &str) -> Value {
    let path = root.join(".agentdiff/runs").join(id).join("runtime.json");
    serde_json::from_slice(&fs::read(&path).unwrap()).unwrap()
}

/// A remote run whose agentdiff is killed mid-command leaves its container on the engine it ran
/// on. `agentdiff cleanup RUN`, with no engine address in its own environment, reaches that
/// engine from the run's authenticated `launched` event, removes the container and checks it is
/// gone.
#[test]
fn cleanup_of_a_killed_remote_run_removes_its_container_on_the_recorded_engine() {
    if let Some(reason) = missing() {
        agentdiff_test_support::skip(&reason);
        return;
    }
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let root = dir.path().join("project");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a.txt"), "a\n").unwrap();
    let endpoint = format!("engine-host={}", engine.url);
    let mut run = super::cmd(
        &root,
        &[
            "run",
            "--runtime",
            "container",
            "--engine",
            "docker",
            "--image",
            REMOTE_IMAGE,
            "--backend-option",
            &endpoint,
            "--",
            "sleep",
            "300",
        ],
    )
    .env_remove("DOCKER_HOST")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let listed = || {
        let out = Command::new("podman")
            .args(["--url", &engine.url, "ps", "-a", "-q", "--no-trunc"])
            .output()
            .unwrap();
        text(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Not a timing assertion: how long this test waits for the container to start at all.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let running = loop {
        let out = Command::new("podman")
            .args(["--url", &engine.url, "ps", "-q", "--no-trunc"])
            .output()
            .unwrap();
        let ids = text(&out.stdout);
        if let Some(id) = ids.lines().next() {
            break id.to_string();
        }
        assert!(
            std::time::Instant::now() < give_up && run.try_wait().unwrap().is_none(),
            "the remote container never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    run.kill().unwrap();
    run.wait().unwrap();
    assert_eq!(
        listed(),
        std::slice::from_ref(&running),
        "the killed run left its container"
    );

    let id = fs::read_dir(root.join(".agentdiff/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| !n.starts_with('.'))
        .expect("the killed run's capsule");
    let out = super::cmd(
        &root,
        &["cleanup", &id, "--format", "json", "--grace-period", "1"],
    )
    .env_remove("DOCKER_HOST")
    .env_remove("CONTAINER_HOST")
    .output()
    .unwrap();
    assert_exit(&out, 0);
    let result = json_of(&out);
    let removed = result["cleanup"]["resources_removed"].to_string();
    assert!(
        removed.contains(&running) && removed.contains(&engine.url),
        "{result:#}"
    );
    assert_eq!(listed(), Vec::<String>::new(), "{result:#}");
    drop(engine);
}
