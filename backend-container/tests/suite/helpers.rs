//! Shared helpers: launch specs, the fake engine, a busybox rootfs, real-component gating.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{
    BackendOptions, DynRuntimeBackend, LaunchContext, LaunchSpec, RunEvidence, StdioMode,
};
use agentdiff_backend_container::engine::ProgramSource;
use agentdiff_backend_container::ContainerBackend;
use agentdiff_conformance::testing::launch_spec;

pub const FAKE: &str = env!("CARGO_BIN_EXE_agentdiff-fake-container-engine");
pub const TEST_IMAGE: &str = "localhost/agentdiff-test:busybox";
pub const PODMAN_SOCKET: &str = "/run/podman/podman.sock";

/// A project root with a private workspace under `.agentdiff/workspaces/<run>`, as the
/// transaction lays it out.
pub struct Layout {
    pub _dir: tempfile::TempDir,
    pub root: PathBuf,
    pub workspace: PathBuf,
    pub capsule: PathBuf,
}

pub fn layout(run_id: &str) -> Layout {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    let workspace = root.join(".agentdiff/workspaces").join(run_id);
    let capsule = root.join(".agentdiff/runs").join(run_id);
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::create_dir_all(&capsule).unwrap();
    std::fs::write(root.join("host.txt"), b"host content\n").unwrap();
    std::fs::write(workspace.join("host.txt"), b"host content\n").unwrap();
    Layout {
        _dir: dir,
        root,
        workspace,
        capsule,
    }
}

pub fn spec(l: &Layout, run_id: &str, argv: &[&str], options: &[(&str, &str)]) -> LaunchSpec {
    let mut b = launch_spec(&l.workspace, argv.iter().copied())
        .run_id(run_id)
        .root(&l.root)
        .capsule_dir(&l.capsule)
        .env([
            ("PATH", "/usr/bin:/bin"),
            ("SECRET_TOKEN", "hunter2-value"),
            ("LANG", "C.UTF-8"),
        ])
        .timeout(Duration::from_secs(60))
        .poll_interval(Duration::from_millis(50));
    for (k, v) in options {
        b = b.option(k, *v);
    }
    b.build()
}

/// Output files for a launch, so tests can read what the command printed.
pub fn files_stdio(dir: &Path) -> (StdioMode, PathBuf, PathBuf) {
    let out = dir.join("stdout");
    let err = dir.join("stderr");
    (
        StdioMode::Files {
            stdin: None,
            stdout: out.clone(),
            stderr: err.clone(),
        },
        out,
        err,
    )
}

pub async fn run(
    backend: &dyn DynRuntimeBackend,
    spec: &LaunchSpec,
    stdio: StdioMode,
) -> Result<RunEvidence, agentdiff_backend_api::BackendError> {
    let prepared = backend.prepare(spec)?;
    let running = backend.launch(prepared, LaunchContext::new(stdio)).await?;
    running.wait().await
}

/// Fake-engine backend, logging to `log`.
pub fn fake_backend(log: &Path, kind: &str, extra: &[(&str, &str)]) -> ContainerBackend {
    let fake = ProgramSource::Fixed(PathBuf::from(FAKE));
    let mut b = ContainerBackend::new()
        .with_engines(fake.clone(), fake)
        .with_client_env("FAKE_ENGINE_LOG", log)
        .with_client_env("FAKE_ENGINE_KIND", kind);
    for (k, v) in extra {
        b = b.with_client_env(*k, *v);
    }
    b
}

/// Every logged invocation's argv.
pub fn logged(log: &Path) -> Vec<(Vec<String>, serde_json::Value)> {
    let Ok(text) = std::fs::read_to_string(log) else {
        return Vec::new();
    };
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let argv = v["argv"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            (argv, v["env"].clone())
        })
        .collect()
}

/// Real components: `Some(reason)` when missing. With AGENTDIFF_REQUIRE_REAL_BACKENDS=1 a missing
/// component fails the test instead of skipping it.
pub fn skip_or_fail(test: &str, missing: Option<String>) -> bool {
    missing.is_some_and(|reason| {
        agentdiff_conformance::skip_unless_required(&format!("{test}: {reason}"))
    })
}

/// Podman that can actually start a container here.
pub fn podman_missing() -> Option<String> {
    let Ok(podman) = which::which("podman") else {
        return Some(
            "podman is not installed (apt-get install -y podman runc busybox-static)".into(),
        );
    };
    let ok = std::process::Command::new(podman)
        .args(["info", "--format", "{{.Host.OCIRuntime.Name}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        return Some(
            "`podman info` fails; see ENVIRONMENT.md for the containers.conf drop-in".into(),
        );
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox is missing (apt-get install -y busybox-static)".into());
    }
    None
}

pub use agentdiff_test_support::rootfs::{
    busybox_rootfs, host_python_missing, python_rootfs, SOCKET_FAMILIES_PY,
};

/// Make the busybox image available to the engine (podman import; visible over the socket too).
pub fn ensure_test_image() -> Result<(), String> {
    let exists = std::process::Command::new("podman")
        .args(["image", "exists", TEST_IMAGE])
        .status()
        .map_err(|e| e.to_string())?;
    if exists.success() {
        return Ok(());
    }
    let rootfs = busybox_rootfs();
    let tar_dir = tempfile::tempdir().unwrap();
    let tar = tar_dir.path().join("rootfs.tar");
    let st = std::process::Command::new("tar")
        .arg("-C")
        .arg(rootfs.path())
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err("tar failed".into());
    }
    let st = std::process::Command::new("podman")
        .args(["import", "-q"])
        .arg(&tar)
        .arg(TEST_IMAGE)
        .output()
        .map_err(|e| e.to_string())?;
    if !st.status.success() {
        return Err(String::from_utf8_lossy(&st.stderr).into_owned());
    }
    Ok(())
}

/// The docker CLI and a live podman socket.
pub fn docker_socket_missing() -> Option<String> {
    if which::which("docker").is_err() {
        return Some("the docker CLI is not installed".into());
    }
    if !Path::new(PODMAN_SOCKET).exists() {
        return Some(format!(
            "{PODMAN_SOCKET} is missing; start `podman system service --time=0 unix://{PODMAN_SOCKET}`"
        ));
    }
    let ok = std::process::Command::new("docker")
        .env("DOCKER_HOST", format!("unix://{PODMAN_SOCKET}"))
        .args(["version", "--format", "{{.Server.Version}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        return Some(format!(
            "the docker CLI cannot reach unix://{PODMAN_SOCKET}"
        ));
    }
    None
}

/// Bytes of every regular file below `dir` (relative path → content), for "unchanged" checks.
pub fn snapshot(dir: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if rel.starts_with(".agentdiff") {
                continue;
            }
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                out.insert(rel, std::fs::read(&p).unwrap());
            } else {
                out.insert(rel, b"<other>".to_vec());
            }
        }
    }
    out
}

/// One whole transaction (`sh -c SCRIPT`) in `root` with `backend` and `options`, logs and state
/// next to the root; the run id.
pub async fn transaction_run(
    root: &Path,
    backend: &ContainerBackend,
    options: BackendOptions,
    script: &str,
    timeout: Duration,
) -> String {
    let (_tx, rx) = tokio::sync::watch::channel(None);
    let logs = root.parent().unwrap().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let outcome = agentdiff_engine::transaction::run(agentdiff_engine::transaction::RunRequest {
        root: root.to_path_buf(),
        policy: agentdiff_policy::load(root, None).unwrap(),
        argv: ["/bin/sh", "-c", script]
            .iter()
            .map(std::ffi::OsString::from)
            .collect(),
        task: None,
        timeout: Some(timeout),
        run_id: None,
        backend,
        options,
        stdio: StdioMode::Files {
            stdin: None,
            stdout: logs.join("out"),
            stderr: logs.join("err"),
        },
        interrupt: rx,
        env_mode: None,
        env_pass: Vec::new(),
        grace: Duration::from_secs(1),
        poll_interval: Duration::from_millis(50),
        progress: None,
        verified_controls: Vec::new(),
        state_dir: Some(
            agentdiff_store::seal::StateDir::at(root.parent().unwrap().join("state")).unwrap(),
        ),
    })
    .await
    .unwrap();
    assert!(outcome.refusal.is_none(), "{:?}", outcome.refusal);
    outcome
        .capsule_dir
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned()
}
