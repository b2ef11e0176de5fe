//! Remote mode against a real podman API service that shares no filesystem with the test: it
//! runs in its own mount namespace with a private tmpfs on `/tmp` (where the test's project and
//! workspace live) holding its storage, and listens on a loopback TCP port. A bind mount of the
//! workspace could not work there; the run works only because the workspace is shipped.
//!
//! The engine client is a recording shim around podman, so the calls are checked: no bind mount
//! is ever requested.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_container::engine::ProgramSource;
use agentdiff_backend_container::{ContainerBackend, ContainerFacts};
use agentdiff_engine::promote::{self, Scope, Selection};
use agentdiff_store::Store;

use agentdiff_test_support::remote_engine::{start_remote_engine, REMOTE_IMAGE};

use super::helpers::*;

/// What a remote engine needs here: podman, busybox, and unshare for the private namespace.
pub fn remote_engine_missing() -> Option<String> {
    if let Some(missing) = podman_missing() {
        return Some(missing);
    }
    if which::which("unshare").is_err() {
        return Some("unshare (util-linux) is not installed".into());
    }
    None
}

/// A podman client that records its argv (one line per call) and runs the real podman.
fn recording_client(dir: &Path) -> (PathBuf, PathBuf) {
    let log = dir.join("calls.log");
    let shim = dir.join("podman");
    let podman = which::which("podman").unwrap();
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\nexec '{}' \"$@\"\n",
            log.display(),
            podman.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    (shim, log)
}

async fn remote_transaction(
    root: &Path,
    backend: &ContainerBackend,
    url: &str,
    script: &str,
) -> String {
    let mut options = BackendOptions::new();
    options.push("engine", "podman");
    options.push("image", REMOTE_IMAGE);
    options.push("engine-host", url);
    transaction_run(root, backend, options, script, Duration::from_secs(120)).await
}

#[tokio::test]
async fn a_remote_engine_runs_on_a_shipped_workspace_and_promote_applies_it() {
    if skip_or_fail("remote_engine_transaction", remote_engine_missing()) {
        return;
    }
    // Under /tmp, which the engine's namespace replaces with its own tmpfs.
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("keep")).unwrap();
    std::fs::write(root.join("a.txt"), b"a before\n").unwrap();
    std::fs::write(root.join("del.txt"), b"delete me\n").unwrap();
    std::fs::write(root.join("keep/k.txt"), b"kept\n").unwrap();
    let root = root.canonicalize().unwrap();
    let host_before = snapshot(&root);
    let (shim, calls) = recording_client(dir.path());
    let backend =
        ContainerBackend::new().with_engines(ProgramSource::Fixed(shim), ProgramSource::SearchPath);

    let run_id = remote_transaction(
        &root,
        &backend,
        &engine.url,
        "test \"$(cat a.txt)\" = 'a before' || exit 9; test \"$(cat keep/k.txt)\" = kept || exit 10; \
         echo 'a after' > a.txt; rm del.txt; echo new > new.txt; ln -s new.txt link; \
         printf '#!/bin/sh\\necho tool\\n' > tool.sh; chmod 755 tool.sh; mkdir -p d/e; echo deep > d/e/f.txt",
    )
    .await;
    assert_eq!(snapshot(&root), host_before, "the host tree is untouched");
    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run(&run_id).unwrap();
    assert!(capsule.is_sealed());
    let result: serde_json::Value = capsule
        .read_artifact(agentdiff_store::Artifact::Result)
        .unwrap();
    assert_eq!(result["exit_code"], 0, "{result:#}");
    let changes = result["changes"].as_array().unwrap();
    for p in [
        "a.txt",
        "del.txt",
        "new.txt",
        "link",
        "tool.sh",
        "d/e/f.txt",
    ] {
        assert!(
            changes.iter().any(|c| c["path"] == p),
            "{p} missing from {changes:#?}"
        );
    }
    assert!(!changes.iter().any(|c| c["path"] == "keep/k.txt"));
    let runtime: serde_json::Value = capsule
        .read_artifact(agentdiff_store::Artifact::Runtime)
        .unwrap();
    assert_eq!(runtime["capabilities"]["host_repository"], "enforced");
    let facts: ContainerFacts = serde_json::from_value(runtime["wrapper"].clone()).unwrap();
    let remote = facts.remote.expect("remote facts");
    assert_eq!(remote.engine.endpoint, engine.url);
    assert_eq!(remote.engine.server_version.as_deref(), Some("4.3.1"));
    assert!(remote.engine.os.is_some() && remote.engine.arch.is_some());
    assert!(remote.shipped_in.unwrap().entries >= 5);
    assert!(remote.shipped_out.unwrap().entries >= 9);
    assert!(remote.container_removed_verified);

    // The recorded calls: a create with an engine volume, never a bind mount of a host path.
    let recorded = std::fs::read_to_string(&calls).unwrap();
    let create = recorded
        .lines()
        .find(|l| l.starts_with("create "))
        .expect("a create call");
    assert!(create.contains("--mount type=volume,destination=/workspace"));
    for line in recorded.lines().filter(|l| !l.starts_with("rm ")) {
        assert!(
            !line.split(' ').any(|w| w == "-v" || w == "--volume"),
            "{line}"
        );
        assert!(!line.contains(dir.path().to_str().unwrap()), "{line}");
    }
    // Gone from the engine.
    let listed = std::process::Command::new("podman")
        .args(["--url", &engine.url, "ps", "-a", "-q"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).trim().is_empty());

    // Promote as for a local engine.
    let all = Selection {
        scope: Scope::All,
        paths: Vec::new(),
        force: false,
    };
    let plan = promote::plan(&capsule, store.objects(), &root, &all).unwrap();
    let report = promote::execute(&capsule, &plan, false).unwrap();
    let outcome = |p: &str| {
        report
            .items
            .iter()
            .find(|i| i.path == p)
            .map(|i| i.outcome.as_str())
            .unwrap_or_else(|| panic!("{p} not in the report: {report:#?}"))
    };
    assert_eq!(outcome("a.txt"), "applied");
    assert_eq!(outcome("del.txt"), "removed");
    assert_eq!(outcome("new.txt"), "created");
    assert_eq!(outcome("tool.sh"), "created");
    assert_eq!(outcome("link"), "skipped", "symlinks are never promoted");
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"a after\n");
    assert!(!root.join("del.txt").exists());
    assert_eq!(std::fs::read(root.join("d/e/f.txt")).unwrap(), b"deep\n");
    let mode = std::fs::metadata(root.join("tool.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o111, 0o111, "the executable stays executable");
    drop(engine);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_roots_run_against_one_remote_engine_at_once() {
    if skip_or_fail("remote_engine_concurrent", remote_engine_missing()) {
        return;
    }
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let runs: Vec<_> = (0..4)
        .map(|i| {
            let run_id = format!("remote-par-{i}");
            let l = layout(&run_id);
            std::fs::write(l.workspace.join("mine.txt"), format!("{i}\n")).unwrap();
            let s = spec(
                &l,
                &run_id,
                &[
                    "sh",
                    "-c",
                    "sleep 1; cat mine.txt > copy.txt; hostname > host.txt",
                ],
                &[
                    ("engine", "podman"),
                    ("image", REMOTE_IMAGE),
                    ("engine-host", engine.url.as_str()),
                ],
            );
            tokio::spawn(async move {
                let backend = ContainerBackend::new();
                let (stdio, _, _) = files_stdio(&l.capsule);
                let ev = run(&backend, &s, stdio).await.unwrap();
                (l, ev, i)
            })
        })
        .collect();
    let mut containers = Vec::new();
    for r in runs {
        let (l, ev, i) = r.await.unwrap();
        assert!(ev.failure.is_none(), "{i}: {:?}", ev.failure);
        assert_eq!(ev.exit.code, Some(0), "{i}");
        // Each run got its own workspace back, nobody else's.
        assert_eq!(
            std::fs::read_to_string(l.workspace.join("copy.txt")).unwrap(),
            format!("{i}\n")
        );
        let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
        let run = agentdiff_backend_container::argv::RunIdentity::new(
            &l.root,
            &format!("remote-par-{i}"),
        )
        .unwrap();
        assert_eq!(facts.container_name, run.container_name());
        assert!(facts.remote.unwrap().container_removed_verified);
        containers.push(facts.container_id.unwrap());
    }
    containers.sort();
    containers.dedup();
    assert_eq!(containers.len(), 4, "four distinct containers");
    drop(engine);
}

#[tokio::test]
async fn the_docker_cli_runs_remotely_over_the_engine_api() {
    let missing = remote_engine_missing().or_else(|| {
        which::which("docker")
            .is_err()
            .then(|| "the docker CLI is not installed".to_string())
    });
    if skip_or_fail("remote_engine_docker_cli", missing) {
        return;
    }
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let l = layout("remote-docker");
    let s = spec(
        &l,
        "remote-docker",
        &[
            "sh",
            "-c",
            "cat host.txt > seen.txt; ln -s /etc/passwd out-link; rm host.txt",
        ],
        &[
            ("engine", "docker"),
            ("image", REMOTE_IMAGE),
            ("engine-host", engine.url.as_str()),
        ],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert!(ev.failure.is_none(), "{:?}", ev.failure);
    assert_eq!(ev.exit.code, Some(0));
    let ws = &l.workspace;
    assert_eq!(
        std::fs::read_to_string(ws.join("seen.txt")).unwrap(),
        "host content\n"
    );
    assert!(!ws.join("host.txt").exists());
    // A link out of the workspace comes back as a link, never followed.
    let meta = std::fs::symlink_metadata(ws.join("out-link")).unwrap();
    assert!(meta.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(ws.join("out-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    let facts: ContainerFacts = ev.wrapper.as_ref().unwrap().decode().unwrap();
    let remote = facts.remote.unwrap();
    assert!(remote.engine.engine_id.is_some(), "{:?}", remote.engine);
    assert!(remote.container_removed_verified);
    drop(engine);
}
