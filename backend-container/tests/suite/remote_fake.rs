//! Remote mode against the fake engine: the recorded calls (no host path is ever mounted, the
//! engine address is the one given), the workspace shipped both ways, hostile archives refused.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use agentdiff_backend_api::{BackendError, DynRuntimeBackend, FailureKind, Level};
use agentdiff_backend_container::ContainerFacts;

use super::helpers::*;

const URL: &str = "tcp://127.0.0.1:1";

fn remote_opts(kind: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("engine", kind),
        ("image", "localhost/img:1"),
        ("engine-host", URL),
    ]
}

/// No call names a host path or a bind mount; every call talks to `URL` only.
fn assert_nothing_mounted(calls: &[(Vec<String>, serde_json::Value)], l: &Layout, var: &str) {
    let root = l.root.display().to_string();
    for (argv, env) in calls {
        // `rm -f -v` removes the engine-side volume; anywhere else `-v` would be a bind mount.
        if argv[0] != "rm" {
            assert!(
                !argv.iter().any(|a| a == "-v" || a == "--volume"),
                "{argv:?}"
            );
        }
        for w in argv.windows(2).filter(|w| w[0] == "--mount") {
            assert_eq!(w[1], "type=volume,destination=/workspace");
        }
        assert!(!argv.iter().any(|a| a.contains(&root)), "{argv:?}");
        assert_eq!(env[var], URL, "{argv:?}");
        for other in [
            "DOCKER_HOST",
            "CONTAINER_HOST",
            "CONTAINER_CONNECTION",
            "DOCKER_CONTEXT",
        ] {
            if other != var {
                assert!(env.get(other).is_none(), "{other} in {argv:?}");
            }
        }
    }
}

#[tokio::test]
async fn a_remote_run_ships_the_workspace_both_ways_and_mounts_nothing() {
    let l = layout("rem-1");
    std::fs::write(l.workspace.join("del.txt"), "bye").unwrap();
    std::fs::create_dir(l.workspace.join("sub")).unwrap();
    std::fs::write(l.workspace.join("sub/keep.txt"), "keep").unwrap();
    let log = l.root.join("log");
    // agentdiff's own environment names another engine: the option wins.
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("CONTAINER_HOST", "tcp://elsewhere:9"),
            ("DOCKER_HOST", "tcp://elsewhere:9"),
            ("FAKE_ENGINE_NAME", "fake-remote"),
        ],
    );
    let script = "cat sub/keep.txt > seen.txt; rm del.txt; echo new > new.txt; \
                  ln -s new.txt link; printf '#!/bin/sh\\n' > tool.sh; chmod 755 tool.sh";
    let s = spec(&l, "rem-1", &["sh", "-c", script], &remote_opts("podman"));
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert!(ev.failure.is_none(), "{:?}", ev.failure);
    assert_eq!(ev.exit.code, Some(0));
    let ws = &l.workspace;
    assert_eq!(
        std::fs::read_to_string(ws.join("seen.txt")).unwrap(),
        "keep"
    );
    assert!(!ws.join("del.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("new.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(
        std::fs::read_link(ws.join("link")).unwrap(),
        Path::new("new.txt")
    );
    let mode = std::fs::metadata(ws.join("tool.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(
        std::fs::read_to_string(ws.join("host.txt")).unwrap(),
        "host content\n"
    );
    // The workspace keeps its own mode; no staging directory is left next to it.
    let left: Vec<_> = std::fs::read_dir(ws.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["rem-1"]);

    assert_eq!(ev.capabilities.host_repository, Level::Enforced);
    assert_eq!(ev.capabilities.processes, Level::Requested);
    assert!(
        ev.warnings.iter().any(|w| w.contains("plain TCP")),
        "{:?}",
        ev.warnings
    );
    let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
    let remote = facts.remote.expect("remote facts");
    assert_eq!(remote.engine.endpoint, URL);
    assert_eq!(remote.engine.transport, "tcp");
    assert_eq!(remote.engine.name.as_deref(), Some("fake-remote"));
    assert_eq!(remote.engine.server_version.as_deref(), Some("99.0.0-fake"));
    assert_eq!(remote.engine.os.as_deref(), Some("linux"));
    assert_eq!(remote.engine.arch.as_deref(), Some("amd64"));
    let shipped_in = remote.shipped_in.unwrap();
    assert_eq!(
        shipped_in.entries, 5,
        "root, host.txt, del.txt, sub, sub/keep.txt"
    );
    assert!(shipped_in.stream_bytes >= 5 * 512);
    assert!(remote.shipped_out.unwrap().entries >= 7);
    assert!(remote.container_removed_verified);
    assert!(ev.cleanup.errors.is_empty(), "{:?}", ev.cleanup.errors);
    assert_eq!(ev.runtime_config["engine_host"], URL);
    assert_eq!(ev.runtime_config["mounts"][0]["kind"], "shipped_workspace");

    let calls = logged(&log);
    let firsts: Vec<&str> = calls.iter().map(|(a, _)| a[0].as_str()).collect();
    assert_eq!(
        firsts,
        [
            "--version",
            "image",
            "image",
            "info",
            "create",
            "cp",
            "start",
            "cp",
            // the container's volumes, the container removed with them, both checked gone
            "inspect",
            "rm",
            "ps",
            "volume",
            // the sweep by run label
            "ps"
        ]
    );
    assert_nothing_mounted(&calls, &l, "CONTAINER_HOST");
    let create = &calls[4].0;
    assert!(!create.contains(&"--rm".to_string()));
    for flag in ["--read-only", "--cap-drop", "--init"] {
        assert!(create.contains(&flag.to_string()), "{flag}");
    }
    assert_eq!(
        calls[6].0,
        ["start", "-a", "-i", &facts.container_id.unwrap()]
    );
    assert_eq!(calls[9].0[..3], ["rm", "-f", "-v"]);
    assert_eq!(remote.volumes_removed, ["fakevol"]);
}

#[tokio::test]
async fn docker_remote_runs_use_docker_host_only() {
    let l = layout("rem-2");
    let log = l.root.join("log");
    let b = fake_backend(
        &log,
        "docker",
        &[
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("DOCKER_CONTEXT", "prod"),
        ],
    );
    let s = spec(
        &l,
        "rem-2",
        &["sh", "-c", "echo hi > hi.txt"],
        &remote_opts("docker"),
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert!(ev.failure.is_none(), "{:?}", ev.failure);
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("hi.txt")).unwrap(),
        "hi\n"
    );
    let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
    assert_eq!(
        facts.remote.unwrap().engine.engine_id.as_deref(),
        Some("FAKEENGINE")
    );
    assert_nothing_mounted(&logged(&log), &l, "DOCKER_HOST");
}

/// (name, kind, link target) of one raw entry.
type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8]);

/// A tar with raw (unchecked) names: what a hostile engine or command could send.
fn hostile_tar(path: &Path, entries: &[RawEntry<'_>]) {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, link) in entries {
        let mut h = tar::Header::new_gnu();
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name);
        gnu.linkname[..link.len()].copy_from_slice(link);
        h.set_entry_type(*kind);
        h.set_mode(0o644);
        let data: &[u8] = if *kind == tar::EntryType::Regular {
            b"pwned"
        } else {
            b""
        };
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    std::fs::write(path, b.into_inner().unwrap()).unwrap();
}

#[tokio::test]
async fn a_hostile_archive_from_the_engine_is_refused_and_nothing_is_written_outside() {
    use tar::EntryType as T;
    let cases: Vec<(&str, Vec<RawEntry<'_>>, &str)> = vec![
        (
            "traversal",
            vec![
                (b"ok.txt", T::Regular, b""),
                (b"../../escape", T::Regular, b""),
            ],
            "`..`",
        ),
        (
            "absolute",
            vec![(b"/tmp/agentdiff-escape-abs", T::Regular, b"")],
            "absolute",
        ),
        (
            "link-out",
            vec![
                (b"out", T::Symlink, b"../.."),
                (b"out/escape", T::Regular, b""),
            ],
            "not a directory of this archive",
        ),
        (
            "hardlink-out",
            vec![(b"h", T::Link, b"/etc/passwd")],
            "absolute",
        ),
        ("fifo", vec![(b"p", T::Fifo, b"")], "FIFO"),
    ];
    for (i, (name, entries, expected)) in cases.into_iter().enumerate() {
        let run_id = format!("rem-h{i}");
        let l = layout(&run_id);
        let log = l.root.join("log");
        let hostile = l.root.join("hostile.tar");
        hostile_tar(&hostile, &entries);
        let b = fake_backend(
            &log,
            "podman",
            &[
                ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
                ("FAKE_ENGINE_ARCHIVE_OUT", hostile.to_str().unwrap()),
            ],
        );
        let s = spec(
            &l,
            &run_id,
            &["sh", "-c", "echo x > x.txt"],
            &remote_opts("podman"),
        );
        let (stdio, _, _) = files_stdio(&l.capsule);
        let ev = run(&b, &s, stdio).await.unwrap();
        let Some(FailureKind::BackendFailed { message }) = &ev.failure else {
            panic!("{name}: {:?}", ev.failure);
        };
        assert!(message.contains(expected), "{name}: {message}");
        assert!(message.contains("not shipped back"), "{name}: {message}");
        // The private workspace keeps its pre-run content; nothing landed anywhere else.
        let ws: Vec<_> = std::fs::read_dir(&l.workspace)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(ws, ["host.txt"], "{name}");
        assert!(!l.root.join(".agentdiff/escape").exists(), "{name}");
        assert!(!l.root.join("escape").exists(), "{name}");
        assert!(!Path::new("/tmp/agentdiff-escape-abs").exists(), "{name}");
        let siblings = std::fs::read_dir(l.workspace.parent().unwrap())
            .unwrap()
            .count();
        assert_eq!(siblings, 1, "{name}: staging directory left behind");
        // The container is removed all the same.
        let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
        assert!(facts.remote.unwrap().container_removed_verified, "{name}");
    }
}

#[tokio::test]
async fn a_container_still_listed_after_removal_is_a_cleanup_error() {
    let l = layout("rem-3");
    let log = l.root.join("log");
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_RM_KEEPS", "1"),
        ],
    );
    let s = spec(&l, "rem-3", &["true"], &remote_opts("podman"));
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
    assert!(!facts.remote.unwrap().container_removed_verified);
    assert!(
        ev.cleanup.errors.iter().any(|e| e.contains("still listed")),
        "{:?}",
        ev.cleanup.errors
    );
}

fn prepare_error(b: &dyn DynRuntimeBackend, l: &Layout, opts: &[(&str, &str)]) -> String {
    let s = spec(l, "rem-4", &["true"], opts);
    match b.prepare(&s) {
        Err(BackendError::InvalidRequest { message, .. }) => message,
        other => panic!(
            "expected a refusal, got {:?}",
            other.map(|p| p.args().to_vec())
        ),
    }
}

#[test]
fn a_client_environment_naming_another_engine_needs_remote_mode() {
    let l = layout("rem-4");
    let log = l.root.join("log");
    let local = [("engine", "podman"), ("image", "localhost/img:1")];
    let b = fake_backend(
        &log,
        "podman",
        &[("CONTAINER_HOST", "ssh://u@build-1/run/podman.sock")],
    );
    let msg = prepare_error(&b, &l, &local);
    assert!(
        msg.contains("CONTAINER_HOST") && msg.contains("engine-host=env"),
        "{msg}"
    );
    let docker_local = [("engine", "docker"), ("image", "localhost/img:1")];
    let b = fake_backend(&log, "docker", &[("DOCKER_HOST", "tcp://build-1:2375")]);
    let msg = prepare_error(&b, &l, &docker_local);
    assert!(msg.contains("DOCKER_HOST=tcp://build-1:2375"), "{msg}");
    // A local socket stays a local run with its bind mount.
    let b = fake_backend(
        &log,
        "docker",
        &[("DOCKER_HOST", "unix:///run/podman/podman.sock")],
    );
    let p = b
        .prepare(&spec(&l, "rem-4", &["true"], &docker_local))
        .unwrap();
    assert!(p.args().iter().any(|a| a == "-v"));
    // engine-host=env takes the client's variable, and needs it.
    let b = fake_backend(
        &log,
        "podman",
        &[("CONTAINER_HOST", "ssh://u@build-1/run/podman.sock")],
    );
    let env_opts = [
        ("engine", "podman"),
        ("image", "localhost/img:1"),
        ("engine-host", "env"),
    ];
    let p = b.prepare(&spec(&l, "rem-4", &["true"], &env_opts)).unwrap();
    assert_eq!(p.args()[0], "create");
    assert!(p
        .env()
        .iter()
        .any(|(k, v)| k == "CONTAINER_HOST" && v == "ssh://u@build-1/run/podman.sock"));
    let bare = fake_backend(&log, "podman", &[]).with_client_env("CONTAINER_HOST", "");
    let msg = prepare_error(&bare, &l, &env_opts);
    assert!(msg.contains("CONTAINER_HOST is not set"), "{msg}");
    // The command's value of an address variable never reaches the client.
    let b = fake_backend(&log, "podman", &[]);
    let mut passthrough = remote_opts("podman");
    passthrough.push(("env", "DOCKER_HOST"));
    let msg = prepare_error(&b, &l, &passthrough);
    assert!(msg.contains("--env DOCKER_HOST"), "{msg}");
}

#[tokio::test]
async fn a_remote_timeout_stops_the_container_and_still_ships_back() {
    let l = layout("rem-5");
    let log = l.root.join("log");
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_RUN", "hang"),
        ],
    );
    let mut s = spec(&l, "rem-5", &["true"], &remote_opts("podman"));
    s.timeout = Some(std::time::Duration::from_millis(300));
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert!(ev.exit.timed_out);
    let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
    let remote = facts.remote.unwrap();
    assert!(remote.shipped_out.is_some());
    assert!(remote.container_removed_verified);
    let calls = logged(&log);
    let firsts: Vec<&str> = calls.iter().map(|(a, _)| a[0].as_str()).collect();
    let stop = firsts.iter().position(|c| *c == "stop").expect("a stop");
    let out = firsts.iter().rposition(|c| *c == "cp").unwrap();
    assert!(stop < out, "{firsts:?}");
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("host.txt")).unwrap(),
        "host content\n"
    );
}

#[tokio::test]
async fn a_local_docker_engine_on_another_host_is_refused_before_anything_is_created() {
    let l = layout("rem-6");
    let log = l.root.join("log");
    let b = fake_backend(
        &log,
        "docker",
        &[
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_NAME", "build-host-7"),
            ("DOCKER_HOST", "unix:///run/forwarded.sock"),
        ],
    );
    let s = spec(
        &l,
        "rem-6",
        &["true"],
        &[("engine", "docker"), ("image", "localhost/img:1")],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    match run(&b, &s, stdio).await {
        Err(BackendError::Unavailable { reason, remedy, .. }) => {
            assert!(reason.contains("build-host-7"), "{reason}");
            assert!(remedy.contains("engine-host=env"), "{remedy}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(!logged(&log)
        .iter()
        .any(|(a, _)| a[0] == "run" || a[0] == "create"));
}

/// A remote run killed before its `launched` event has no record of its engine: cleanup finds
/// its container through the engine its environment names, by the run's label, and removes the
/// workspace volume with it (a copy of the project), checking both are gone.
#[tokio::test]
async fn cleanup_without_a_record_removes_the_container_and_its_volume() {
    const CID: &str = "0f0e0d0c0b0a09080706050403020100f0e0d0c0b0a09080706050403020100f";
    let l = layout("rem-9");
    let log = l.root.join("log");
    let state = l.root.join("state");
    std::fs::create_dir(&state).unwrap();
    // What the killed run's `create` left on the engine.
    let created = std::process::Command::new(FAKE)
        .args(["create", "--name", "x", "--", "img", "true"])
        .env("FAKE_ENGINE_LOG", &log)
        .env("FAKE_ENGINE_STATE", &state)
        .output()
        .unwrap();
    assert!(created.status.success());
    assert!(state.join("volume").is_dir());
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_STATE", state.to_str().unwrap()),
            ("FAKE_ENGINE_PS", CID),
        ],
    );
    let place = agentdiff_backend_api::RunPlace {
        root: &l.root,
        workspace: &l.workspace,
    };
    let report = b
        .cleanup_run_at(
            place,
            "rem-9",
            &[],
            std::time::Duration::from_millis(100),
            None,
        )
        .await;
    assert!(!state.join("volume").exists(), "the volume is left");
    let removed = report.resources_removed.join("\n");
    assert!(
        removed.contains(&format!("podman container {CID}")),
        "{removed}"
    );
    assert!(removed.contains("podman volume fakevol"), "{removed}");
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let calls: Vec<String> = logged(&log).into_iter().map(|(a, _)| a.join(" ")).collect();
    assert!(calls.contains(&format!("rm -f -v -- {CID}")), "{calls:?}");
}
