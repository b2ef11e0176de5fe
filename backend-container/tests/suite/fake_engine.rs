//! Exact argv, labels, fail-closed refusals and evidence, against the fake engine binary.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use agentdiff_backend_api::{
    Availability, BackendError, FailureKind, Level, RuntimeBackend, WorkspaceMode,
};
use agentdiff_backend_container::argv::RunIdentity;
use agentdiff_backend_container::engine::{EngineKind, ProgramSource};
use agentdiff_backend_container::{cleanup, ContainerBackend};
use agentdiff_plugins::Registry;

use super::helpers::*;

fn image_opts() -> Vec<(&'static str, &'static str)> {
    vec![("engine", "podman"), ("image", "localhost/img:1")]
}

#[test]
fn registered_in_the_inventory() {
    let reg = Registry::from_inventory().unwrap();
    assert!(reg.ids().contains(&"container"), "{:?}", reg.ids());
    let b = reg.create("container").unwrap();
    assert_eq!(b.id(), "container");
    assert_eq!(
        b.capabilities(&agentdiff_backend_api::BackendOptions::new())
            .workspace,
        WorkspaceMode::Private
    );
}

#[test]
fn prepare_builds_the_exact_argv_and_mounts_only_the_workspace() {
    let l = layout("run-1");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[]);
    let argv = [
        "sh",
        "-c",
        "echo \"$1\"",
        "a b",
        "",
        "--",
        "--rm",
        "-v",
        "/:/host",
    ];
    let s = spec(
        &l,
        "run-1",
        &argv,
        &[
            ("engine", "podman"),
            ("image", "localhost/img:1"),
            ("env", "SECRET_TOKEN"),
        ],
    );
    let p = b.prepare(&s).unwrap();
    assert_eq!(p.program(), &OsString::from(FAKE));
    let ws = l.workspace.display().to_string();
    let key = RunIdentity::new(&l.root, "run-1").unwrap().key();
    let (name, label) = (format!("agentdiff-{key}"), format!("agentdiff.run={key}"));
    let expected: Vec<String> = [
        "run",
        "--rm",
        "--name",
        &name,
        "--label",
        &label,
        "--label",
        "agentdiff.managed=true",
        "--network",
        "none",
        "--cap-drop",
        "ALL",
        "--security-opt",
        "no-new-privileges",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,size=64m,mode=1777",
        "--user",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let got: Vec<String> = p
        .args()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(&got[..expected.len()], &expected[..]);
    let tail_start = got.iter().position(|a| a == "--").unwrap();
    assert_eq!(got[tail_start + 1], "localhost/img:1");
    // Every word of the command follows unchanged, including ones that look like engine flags.
    assert_eq!(&p.args()[tail_start + 2..], &s.argv[..]);
    // Exactly one mount: the private workspace. Never the root, never a socket.
    let mounts: Vec<&String> = got[..tail_start]
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            *i > 0 && (got[i - 1] == "-v" || got[i - 1] == "--mount" || got[i - 1] == "--volume")
        })
        .map(|(_, a)| a)
        .collect();
    assert_eq!(mounts, vec![&format!("{ws}:/workspace")]);
    let flags = got[..tail_start].join(" ");
    assert!(!flags.contains(&format!("{}:", l.root.display())));
    assert!(!flags.contains(".sock"));
    assert!(!flags.contains("--privileged"));
    // `--env NAME` only: the value never appears on the command line.
    assert!(flags.contains("--env SECRET_TOKEN"));
    assert!(!got.iter().any(|a| a.contains("hunter2")));
    assert_eq!(p.enforcement().as_str(), "container_requested");
    assert_eq!(p.runtime_config()["network"], "none");
    assert_eq!(p.runtime_config()["host_repository_mounted"], false);
    assert_eq!(p.runtime_config()["labels"]["agentdiff.run"], key.as_str());
    // The engine client gets the named variable's value (the engine copies it in).
    assert!(p
        .env()
        .iter()
        .any(|(k, v)| k == "SECRET_TOKEN" && v == "hunter2-value"));
    assert!(!p.env().iter().any(|(k, _)| k == "LANG"));
}

#[test]
fn prepare_refuses_a_workspace_that_is_the_host_tree() {
    let l = layout("r");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[]);
    let mut s = spec(&l, "r", &["true"], &image_opts());
    s.workdir = l.root.clone();
    assert!(matches!(
        b.prepare(&s),
        Err(BackendError::InvalidRequest { .. })
    ));
    s.workdir = l.root.join("src");
    assert!(matches!(
        b.prepare(&s),
        Err(BackendError::InvalidRequest { .. })
    ));
    let s = spec(
        &l,
        "r",
        &["true"],
        &[("engine", "docker"), ("rootfs", "/srv/r")],
    );
    assert!(matches!(
        b.prepare(&s),
        Err(BackendError::InvalidRequest { .. })
    ));
    let s = spec(&l, "r", &["true"], &[("engine", "podman"), ("rootfs", "/")]);
    assert!(matches!(
        b.prepare(&s),
        Err(BackendError::InvalidRequest { .. })
    ));
    let s = spec(&l, "r", &["true"], &[("image", "x"), ("network", "host")]);
    assert!(matches!(
        b.prepare(&s),
        Err(BackendError::InvalidRequest { .. })
    ));
}

#[tokio::test]
async fn runs_in_the_workspace_and_records_evidence() {
    let l = layout("run-2");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[("FAKE_ENGINE_IMAGES", "localhost/img:1")]);
    let mut opts = image_opts();
    opts.push(("env", "SECRET_TOKEN"));
    opts.push(("env", "NOT_SET_ANYWHERE"));
    let s = spec(
        &l,
        "run-2",
        &[
            "sh",
            "-c",
            "printf '%s|' \"$@\" > out.txt; printf %s \"$SECRET_TOKEN\" > env.txt; exit 3",
            "x",
            "a b",
            "",
            "--",
        ],
        &opts,
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert_eq!(ev.exit.code, Some(3));
    assert!(!ev.exit.timed_out);
    assert!(ev.failure.is_none(), "{:?}", ev.failure);
    assert_eq!(ev.backend, "container");
    assert_eq!(ev.enforcement.as_str(), "container_requested");
    assert_eq!(ev.capabilities.host_repository, Level::Enforced);
    assert_eq!(ev.capabilities.network, Level::Requested);
    assert_eq!(ev.observation_root, l.workspace.display().to_string());
    // The backend-specific facts are the backend's own typed section.
    let facts: agentdiff_backend_container::ContainerFacts =
        ev.wrapper.as_ref().unwrap().decode().unwrap();
    assert_eq!(facts.container_id.as_deref().map(str::len), Some(64));
    assert_eq!(
        facts.image_id.as_deref(),
        Some(format!("sha256:{}", "ab".repeat(32)).as_str())
    );
    assert_eq!(facts.engine, "podman");
    assert!(facts.leftover_containers_removed.is_empty());
    assert_eq!(
        ev.wrapper.as_ref().unwrap()["version"],
        "podman version 99.0.0-fake"
    );
    assert_eq!(ev.processes.len(), 1);
    assert_eq!(
        ev.cleanup.mechanism,
        agentdiff_backend_api::CleanupMechanism::ContainerEngine
    );
    // argv boundaries survive the engine; the command ran in the workspace.
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("out.txt")).unwrap(),
        "a b||--|"
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("env.txt")).unwrap(),
        "hunter2-value"
    );
    assert!(!l.root.join("out.txt").exists());
    // Environment evidence: fingerprints, never values.
    let env = ev.environment.unwrap();
    assert_eq!(env.mode, agentdiff_backend_api::environment::EnvMode::Scrub);
    assert!(env.variables["SECRET_TOKEN"].starts_with("sha256:"));
    assert!(!serde_json::to_string(&env).unwrap().contains("hunter2"));
    assert!(env.dropped.contains(&"LANG".to_string()));
    assert!(ev.warnings.iter().any(|w| w.contains("NOT_SET_ANYWHERE")));
    let wrapper_argv = ev.wrapper_argv.unwrap().join(" ");
    assert!(wrapper_argv.contains("--cidfile"));
    assert!(!wrapper_argv.contains("hunter2"));
    // The call sequence: version, image check, run. podman's client removed the `--rm`
    // container itself on this normal exit, so there is no sweep.
    let calls = logged(&log);
    let firsts: Vec<&str> = calls.iter().map(|(a, _)| a[0].as_str()).collect();
    assert_eq!(firsts, ["--version", "image", "image", "run"]);
    let (run_argv, run_env) = &calls[3];
    assert!(run_argv
        .windows(2)
        .any(|w| w[0] == "--pull" && w[1] == "never"));
    assert_eq!(run_env["SECRET_TOKEN"], "hunter2-value");
    assert!(run_env.get("LANG").is_none());
}

#[tokio::test]
async fn an_absent_image_is_refused_before_anything_runs() {
    let l = layout("run-3");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[("FAKE_ENGINE_IMAGES", "other:1")]);
    let s = spec(&l, "run-3", &["true"], &image_opts());
    let (stdio, _, _) = files_stdio(&l.capsule);
    match run(&b, &s, stdio).await {
        Err(BackendError::Unavailable { reason, remedy, .. }) => {
            assert!(reason.contains("not present locally"), "{reason}");
            assert!(remedy.contains("--pull"), "{remedy}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(!logged(&log).iter().any(|(a, _)| a[0] == "run"));
    // With --pull the engine may pull: argv says so.
    let mut opts = image_opts();
    opts.push(("pull", "true"));
    let s = spec(&l, "run-3", &["true"], &opts);
    let p = b.prepare(&s).unwrap();
    let got: Vec<String> = p
        .args()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert!(got
        .windows(2)
        .any(|w| w[0] == "--pull" && w[1] == "missing"));
}

#[tokio::test]
async fn no_engine_means_unavailable_never_a_weaker_run() {
    let l = layout("run-4");
    let missing = ProgramSource::Fixed(PathBuf::from("/nonexistent/podman"));
    let b = ContainerBackend::new().with_engines(missing.clone(), missing);
    assert!(matches!(
        b.availability(&agentdiff_backend_api::BackendOptions::new())
            .await,
        Availability::Unavailable { .. }
    ));
    let s = spec(&l, "run-4", &["true"], &image_opts());
    let (stdio, _, _) = files_stdio(&l.capsule);
    assert!(matches!(
        run(&b, &s, stdio).await,
        Err(BackendError::Unavailable { .. })
    ));
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[("FAKE_ENGINE_VERSION_FAIL", "1")]);
    let s = spec(&l, "run-4", &["true"], &image_opts());
    let (stdio, _, _) = files_stdio(&l.capsule);
    match run(&b, &s, stdio).await {
        Err(BackendError::Unavailable { reason, .. }) => {
            assert!(reason.contains("broken"), "{reason}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn docker_without_a_reachable_server_is_unavailable() {
    let l = layout("run-5");
    let log = l.root.join("log");
    let b = fake_backend(
        &log,
        "docker",
        &[
            ("FAKE_ENGINE_SERVER_FAIL", "1"),
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
        ],
    );
    let s = spec(
        &l,
        "run-5",
        &["true"],
        &[("engine", "docker"), ("image", "localhost/img:1")],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    match run(&b, &s, stdio).await {
        Err(BackendError::Unavailable { reason, remedy, .. }) => {
            assert!(reason.contains("API server"), "{reason}");
            assert!(remedy.contains("DOCKER_HOST"), "{remedy}");
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(!logged(&log).iter().any(|(a, _)| a[0] == "run"));
}

#[tokio::test]
async fn an_unusable_rootfs_is_refused() {
    let l = layout("run-6");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[]);
    let empty = tempfile::tempdir().unwrap();
    for (dir, argv0) in [
        (empty.path().join("missing"), "sh"),
        (empty.path().to_path_buf(), "sh"),
    ] {
        let s = spec(
            &l,
            "run-6",
            &[argv0],
            &[("engine", "podman"), ("rootfs", dir.to_str().unwrap())],
        );
        let (stdio, _, _) = files_stdio(&l.capsule);
        match run(&b, &s, stdio).await {
            Err(BackendError::Unavailable { reason, .. }) => {
                assert!(reason.contains("rootfs"), "{reason}")
            }
            other => panic!("expected Unavailable for {dir:?}, got {other:?}"),
        }
    }
    assert!(!logged(&log).iter().any(|(a, _)| a[0] == "run"));
}

#[tokio::test]
async fn an_engine_that_cannot_start_the_container_is_a_setup_failure() {
    for (mode, needle) in [
        ("oci-fail", "could not start it"),
        ("engine-fail", "before creating"),
    ] {
        let l = layout("run-7");
        let log = l.root.join("log");
        let b = fake_backend(
            &log,
            "podman",
            &[
                ("FAKE_ENGINE_RUN", mode),
                ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ],
        );
        let s = spec(&l, "run-7", &["true"], &image_opts());
        let (stdio, _, _) = files_stdio(&l.capsule);
        let ev = run(&b, &s, stdio).await.unwrap();
        match ev.failure {
            Some(FailureKind::WrapperSetupFailed { message }) => {
                assert!(message.contains(needle), "{mode}: {message}")
            }
            other => panic!("{mode}: expected a wrapper setup failure, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_command_exiting_126_is_not_mistaken_for_an_engine_failure() {
    let l = layout("run-8");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[("FAKE_ENGINE_IMAGES", "localhost/img:1")]);
    let s = spec(&l, "run-8", &["sh", "-c", "exit 126"], &image_opts());
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert_eq!(ev.exit.code, Some(126));
    assert!(ev.failure.is_none(), "{:?}", ev.failure);
    assert!(logged(&log).iter().any(|(a, _)| a[0] == "events"));
}

#[tokio::test]
async fn a_timeout_stops_the_container() {
    let l = layout("run-9");
    let log = l.root.join("log");
    let state = tempfile::tempdir().unwrap();
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_RUN", "hang"),
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_STATE", state.path().to_str().unwrap()),
        ],
    );
    let mut s = spec(&l, "run-9", &["sleep", "100"], &image_opts());
    s.timeout = Some(Duration::from_millis(300));
    let (stdio, _, _) = files_stdio(&l.capsule);
    let started = std::time::Instant::now();
    let ev = run(&b, &s, stdio).await.unwrap();
    assert!(ev.exit.timed_out);
    assert!(started.elapsed() < Duration::from_secs(20));
    let calls = logged(&log);
    let stop = calls
        .iter()
        .find(|(a, _)| a[0] == "stop")
        .expect("stop was called");
    let key = RunIdentity::new(&l.root, "run-9").unwrap().key();
    assert_eq!(
        stop.0.join(" "),
        format!("stop --time 1 -- agentdiff-{key}")
    );
}

#[tokio::test]
async fn leftover_containers_are_removed_by_label() {
    let l = layout("run-10");
    let log = l.root.join("log");
    // docker removes `--rm` containers asynchronously, so its runs are always swept by label.
    let b = fake_backend(
        &log,
        "docker",
        &[
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_PS", "deadbeef"),
        ],
    );
    let s = spec(
        &l,
        "run-10",
        &["true"],
        &[("engine", "docker"), ("image", "localhost/img:1")],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert!(ev.warnings.iter().any(|w| w.contains("deadbeef")));
    let run10 = RunIdentity::new(&l.root, "run-10").unwrap();
    let filter = format!(
        "ps -a -q --no-trunc --filter label=agentdiff.run={}",
        run10.key()
    );
    let calls: Vec<String> = logged(&log).into_iter().map(|(a, _)| a.join(" ")).collect();
    assert!(calls.contains(&filter), "{calls:?}");
    assert!(calls.contains(&"rm -f -v -- deadbeef".to_string()));

    // `agentdiff cleanup RUN` path.
    let log2 = l.root.join("log2");
    let env = vec![
        ("FAKE_ENGINE_LOG".into(), log2.clone().into_os_string()),
        ("FAKE_ENGINE_PS".into(), "c1,c2".into()),
    ];
    let fake = ProgramSource::Fixed(PathBuf::from(FAKE));
    let out = cleanup::remove_run_containers_with(&run10, &[(EngineKind::Podman, fake)], env)
        .await
        .unwrap();
    assert_eq!(
        out.removed,
        vec![
            ("podman".to_string(), "c1".to_string()),
            ("podman".to_string(), "c2".to_string())
        ]
    );
    let calls: Vec<String> = logged(&log2)
        .into_iter()
        .map(|(a, _)| a.join(" "))
        .filter(|c| c.starts_with("ps") || c.starts_with("rm"))
        .collect();
    assert_eq!(
        calls,
        [
            filter.as_str(),
            "rm -f -v -- c1",
            "ps -a -q --no-trunc --filter id=c1",
            "rm -f -v -- c2",
            "ps -a -q --no-trunc --filter id=c2",
        ]
    );
}

#[tokio::test]
async fn availability_reports_the_engines_found() {
    let l = layout("r");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[]);
    match b
        .availability(&agentdiff_backend_api::BackendOptions::new())
        .await
    {
        Availability::Ready { detail } => assert!(detail.contains("99.0.0-fake"), "{detail}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn an_interrupt_stops_the_container_and_is_recorded() {
    let l = layout("run-11");
    let log = l.root.join("log");
    let state = tempfile::tempdir().unwrap();
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_RUN", "hang"),
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_STATE", state.path().to_str().unwrap()),
        ],
    );
    let s = spec(&l, "run-11", &["sleep", "100"], &image_opts());
    let (stdio, _, _) = files_stdio(&l.capsule);
    let (tx, rx) = tokio::sync::watch::channel(None);
    let prepared = b.prepare(&s).unwrap();
    let running = b
        .launch(
            prepared,
            agentdiff_backend_api::LaunchContext {
                stdio,
                interrupt: rx,
                hold_reap: None,
                hold_start: false,
            },
        )
        .await
        .unwrap();
    let waiter = tokio::spawn(running.wait());
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.send(Some(2)).unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the run ends after the interrupt")
        .unwrap()
        .unwrap();
    assert_eq!(ev.exit.interrupted_by, Some(2));
    assert!(!ev.exit.timed_out);
    let calls: Vec<String> = logged(&log).into_iter().map(|(a, _)| a.join(" ")).collect();
    let key = RunIdentity::new(&l.root, "run-11").unwrap().key();
    assert!(calls.contains(&format!("stop --time 1 -- agentdiff-{key}")));
    // An interrupted run is always swept by label.
    assert!(calls.iter().any(|c| c.starts_with("ps -a -q")));
}

/// The engine failed before creating anything (a name already taken): nothing is swept, so a
/// container the engine lists under any label is left alone.
#[tokio::test]
async fn a_create_that_fails_touches_no_container() {
    let l = layout("run-12");
    let log = l.root.join("log");
    let b = fake_backend(
        &log,
        "podman",
        &[
            ("FAKE_ENGINE_RUN", "engine-fail"),
            ("FAKE_ENGINE_IMAGES", "localhost/img:1"),
            ("FAKE_ENGINE_PS", "othersrunningcontainer"),
        ],
    );
    let s = spec(&l, "run-12", &["true"], &image_opts());
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&b, &s, stdio).await.unwrap();
    assert!(matches!(
        ev.failure,
        Some(FailureKind::WrapperSetupFailed { .. })
    ));
    let calls: Vec<String> = logged(&log).into_iter().map(|(a, _)| a.join(" ")).collect();
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("rm") || c.starts_with("ps")),
        "{calls:?}"
    );
    assert!(ev
        .warnings
        .iter()
        .all(|w| !w.contains("othersrunningcontainer")));
    // The `--cidfile` directory was private and is gone.
    let left: Vec<_> = std::fs::read_dir(l.workspace.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["run-12"]);
}

/// `agentdiff cleanup` of a killed run: the directories it left next to its workspace are
/// removed by their exact names; links and look-alikes are not followed or touched.
#[tokio::test]
async fn cleanup_removes_what_a_killed_run_left_next_to_its_workspace() {
    let l = layout("run-13");
    let log = l.root.join("log");
    let b = fake_backend(&log, "podman", &[]);
    let base = l.workspace.parent().unwrap().to_path_buf();
    let outside = l.root.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), "keep").unwrap();
    for d in [
        ".run-13.shipped-Ab12Cd",
        ".run-13.shipped-Ab12Cd.old",
        ".run-13.cid-Zz9Yx8",
    ] {
        std::fs::create_dir_all(base.join(d).join("sub")).unwrap();
        std::fs::write(base.join(d).join("sub/f"), "x").unwrap();
    }
    std::os::unix::fs::symlink(&outside, base.join(".run-13.cid-Link01")).unwrap();
    for d in [
        ".run-13.shipped-toolong1",
        ".run-1.shipped-Ab12Cd",
        "run-14",
    ] {
        std::fs::create_dir(base.join(d)).unwrap();
    }
    let place = agentdiff_backend_api::RunPlace {
        root: &l.root,
        workspace: &l.workspace,
    };
    let report = b
        .cleanup_run_at(place, "run-13", &[], Duration::from_millis(100), None)
        .await;
    let mut left: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            ".run-1.shipped-Ab12Cd",
            ".run-13.cid-Link01",
            ".run-13.shipped-toolong1",
            "run-13",
            "run-14"
        ]
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "keep"
    );
    let removed = report.resources_removed.join("\n");
    assert!(removed.contains(".run-13.shipped-Ab12Cd.old"), "{removed}");
    assert!(removed.contains(".run-13.cid-Zz9Yx8"), "{removed}");
    // The sweep asked for this root's run only.
    let key = RunIdentity::new(&l.root, "run-13").unwrap().key();
    let calls: Vec<String> = logged(&log).into_iter().map(|(a, _)| a.join(" ")).collect();
    assert!(
        calls.contains(&format!(
            "ps -a -q --no-trunc --filter label=agentdiff.run={key}"
        )),
        "{calls:?}"
    );
}
