//! Real podman with a busybox rootfs built from /bin/busybox (no image pull). Skipped with a
//! printed reason when podman is missing, failed instead with AGENTDIFF_REQUIRE_REAL_BACKENDS=1.

use std::time::{Duration, Instant};

use agentdiff_backend_api::{BackendError, FailureKind, RuntimeBackend};
use agentdiff_backend_container::ContainerBackend;

use super::helpers::*;

/// Real-engine tests share the machine's two cores: one container at a time keeps them stable.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn rootfs_opts(rootfs: &tempfile::TempDir) -> Vec<(&'static str, String)> {
    vec![
        ("engine", "podman".into()),
        ("rootfs", rootfs.path().to_str().unwrap().to_string()),
    ]
}

fn as_refs<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, s)| (*k, s.as_str())).collect()
}

#[tokio::test]
async fn podman_writes_land_in_the_workspace_and_the_host_tree_is_unchanged() {
    if skip_or_fail("podman_writes_land_in_the_workspace", podman_missing()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    let l = layout("real-w1");
    let host_before = snapshot(&l.root);
    let opts = rootfs_opts(&rootfs);
    let s = spec(
        &l,
        "real-w1",
        &["/bin/sh", "-c", "echo changed > host.txt && mkdir -p new/dir && printf '%s|' \"$@\" > new/dir/args; id -u > new/uid", "x", "a b", "", "--"],
        &as_refs(&opts),
    );
    let (stdio, _, err) = files_stdio(&l.capsule);
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert_eq!(
        ev.exit.code,
        Some(0),
        "stderr: {}",
        std::fs::read_to_string(err).unwrap_or_default()
    );
    assert!(ev.failure.is_none());
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("host.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("new/dir/args")).unwrap(),
        "a b||--|"
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("new/uid")).unwrap(),
        "65532\n"
    );
    assert_eq!(
        snapshot(&l.root),
        host_before,
        "the host tree must be byte-for-byte unchanged"
    );
    let facts: agentdiff_backend_container::ContainerFacts =
        ev.wrapper.as_ref().unwrap().decode().unwrap();
    assert_eq!(facts.container_id.as_deref().map(str::len), Some(64));
    let w = ev.wrapper.unwrap();
    assert!(w["version"].as_str().unwrap().starts_with("podman version"));
    assert!(w["rootfs"]["manifest_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    // --rm and the label sweep leave nothing behind.
    let left = std::process::Command::new("podman")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!(
                "label=agentdiff.run={}",
                agentdiff_backend_container::argv::RunIdentity::new(&l.root, "real-w1")
                    .unwrap()
                    .key()
            ),
        ])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty());
}

#[tokio::test]
async fn podman_root_filesystem_is_read_only() {
    if skip_or_fail("podman_root_filesystem_is_read_only", podman_missing()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    let l = layout("real-ro");
    let opts = rootfs_opts(&rootfs);
    let s = spec(
        &l,
        "real-ro",
        &[
            "/bin/sh",
            "-c",
            "echo x > /bin/evil; echo rc=$? ; echo y > /tmp/ok && echo tmp=ok",
        ],
        &as_refs(&opts),
    );
    let (stdio, out, err) = files_stdio(&l.capsule);
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert_eq!(ev.exit.code, Some(0));
    let out = std::fs::read_to_string(out).unwrap();
    let err = std::fs::read_to_string(err).unwrap();
    assert!(out.contains("rc=1") || out.contains("rc=2"), "{out}");
    assert!(err.contains("Read-only file system"), "{err}");
    assert!(
        out.contains("tmp=ok"),
        "the tmpfs /tmp stays writable: {out}"
    );
    assert!(!rootfs.path().join("bin/evil").exists());
}

#[tokio::test]
async fn podman_network_none_has_only_loopback() {
    if skip_or_fail("podman_network_none_has_only_loopback", podman_missing()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    let l = layout("real-net");
    let opts = rootfs_opts(&rootfs);
    let s = spec(
        &l,
        "real-net",
        &[
            "/bin/sh",
            "-c",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        ],
        &as_refs(&opts),
    );
    let (stdio, out, _) = files_stdio(&l.capsule);
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert_eq!(ev.exit.code, Some(0));
    let ifaces: Vec<String> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(ifaces, vec!["lo".to_string()]);
}

#[tokio::test]
async fn podman_fork_bomb_is_stopped_by_the_pids_limit() {
    if skip_or_fail(
        "podman_fork_bomb_is_stopped_by_the_pids_limit",
        podman_missing(),
    ) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    let l = layout("real-pids");
    let mut opts = rootfs_opts(&rootfs);
    opts.push(("pids-limit", "32".into()));
    let s = spec(
        &l,
        "real-pids",
        &[
            "/bin/sh",
            "-c",
            "for i in $(seq 1 200); do sleep 30 & echo $i; done",
        ],
        &as_refs(&opts),
    );
    let (stdio, out, err) = files_stdio(&l.capsule);
    let started = Instant::now();
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "the sleeps must end with the container"
    );
    let last: u32 = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        last < 32,
        "at most 32 processes may exist; {last} sleeps were started"
    );
    assert_ne!(ev.exit.code, Some(0));
    assert!(std::fs::read_to_string(err).unwrap().contains("can't fork"));
}

#[tokio::test]
async fn podman_timeout_stops_and_removes_the_container() {
    if skip_or_fail(
        "podman_timeout_stops_and_removes_the_container",
        podman_missing(),
    ) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    let l = layout("real-timeout");
    let opts = rootfs_opts(&rootfs);
    let mut s = spec(&l, "real-timeout", &["/bin/sleep", "300"], &as_refs(&opts));
    s.timeout = Some(Duration::from_secs(2));
    let (stdio, _, _) = files_stdio(&l.capsule);
    let started = Instant::now();
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert!(ev.exit.timed_out);
    assert!(started.elapsed() < Duration::from_secs(60));
    let left = std::process::Command::new("podman")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!(
                "label=agentdiff.run={}",
                agentdiff_backend_container::argv::RunIdentity::new(&l.root, "real-timeout")
                    .unwrap()
                    .key()
            ),
        ])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty());
}

#[tokio::test]
async fn podman_oci_failure_is_a_setup_failure_not_a_command_exit() {
    if skip_or_fail("podman_oci_failure_is_a_setup_failure", podman_missing()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    // The OCI runtime cannot reach the init binary podman mounts under /run (a /run the
    // container user may not enter): runc fails, the container is created but never started.
    {
        use std::os::unix::fs::PermissionsExt;
        let run_dir = rootfs.path().join("run");
        std::fs::create_dir(&run_dir).unwrap();
        std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let l = layout("real-oci");
    let opts = rootfs_opts(&rootfs);
    let s = spec(&l, "real-oci", &["/bin/true"], &as_refs(&opts));
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert!(
        matches!(ev.failure, Some(FailureKind::WrapperSetupFailed { .. })),
        "exit {:?}, failure {:?}",
        ev.exit,
        ev.failure
    );
}

#[tokio::test]
async fn podman_missing_image_fails_closed() {
    if skip_or_fail("podman_missing_image_fails_closed", podman_missing()) {
        return;
    }
    let l = layout("real-noimg");
    let s = spec(
        &l,
        "real-noimg",
        &["true"],
        &[
            ("engine", "podman"),
            ("image", "localhost/agentdiff-absent:never"),
        ],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    assert!(matches!(
        run(&ContainerBackend::new(), &s, stdio).await,
        Err(BackendError::Unavailable { .. })
    ));
}

#[tokio::test]
async fn podman_stdin_reaches_the_command_and_non_utf8_arguments_are_refused() {
    if skip_or_fail("podman_stdin_reaches_the_command", podman_missing()) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = busybox_rootfs();
    let l = layout("real-stdin");
    let opts = rootfs_opts(&rootfs);
    let s = spec(&l, "real-stdin", &["/bin/cat"], &as_refs(&opts));
    let input = l.capsule.join("stdin");
    std::fs::write(&input, b"line one\n\tline two \xe2\x9c\x93\n").unwrap();
    let out = l.capsule.join("stdout");
    let stdio = agentdiff_backend_api::StdioMode::Files {
        stdin: Some(input.clone()),
        stdout: out.clone(),
        stderr: l.capsule.join("stderr"),
    };
    let ev = run(&ContainerBackend::new(), &s, stdio).await.unwrap();
    assert_eq!(ev.exit.code, Some(0));
    assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&input).unwrap());

    use std::os::unix::ffi::OsStringExt;
    let mut s = spec(&l, "real-stdin", &["/bin/echo"], &as_refs(&opts));
    s.argv.push(std::ffi::OsString::from_vec(vec![0xff, b'x']));
    assert!(matches!(
        ContainerBackend::new().prepare(&s),
        Err(BackendError::InvalidRequest { .. })
    ));
}

/// `AF_VSOCK` belongs to no network namespace (on a VM it may reach the hypervisor host): the
/// profile derived from podman's own refuses it, and the families a command needs still work.
#[tokio::test]
async fn podman_refuses_vsock_sockets_and_keeps_the_others() {
    if skip_or_fail(
        "podman_refuses_vsock_sockets",
        podman_missing().or_else(host_python_missing),
    ) {
        return;
    }
    let _g = SERIAL.lock().await;
    let rootfs = python_rootfs().unwrap();
    let l = layout("real-vsock");
    let opts = rootfs_opts(&rootfs);
    let s = spec(
        &l,
        "real-vsock",
        &["/usr/bin/python3", "-c", SOCKET_FAMILIES_PY],
        &as_refs(&opts),
    );
    let backend = ContainerBackend::new();
    let seccomp = backend.prepare(&s).unwrap().runtime_config()["seccomp"].clone();
    assert_eq!(seccomp["profile"], "derived", "{seccomp:#}");
    let (stdio, out, err) = files_stdio(&l.capsule);
    let ev = run(&backend, &s, stdio).await.unwrap();
    let seen = std::fs::read_to_string(err).unwrap();
    assert_eq!(
        ev.exit.code,
        Some(0),
        "{seen}{}",
        std::fs::read_to_string(out).unwrap_or_default()
    );
    let line = |name: &str| {
        seen.lines()
            .find_map(|l| l.strip_prefix("SOCKET ").filter(|l| l.starts_with(name)))
            .unwrap_or_default()
            .to_string()
    };
    // Refused by the profile's default action, not the kernel's EAFNOSUPPORT (what a host
    // without vsock answers whatever the profile): so this fails on any host without it.
    let vsock = line("vsock");
    assert!(
        vsock.starts_with("vsock ")
            && vsock != "vsock created"
            && vsock != format!("vsock {}", libc::EAFNOSUPPORT),
        "{seen}"
    );
    assert!(!line("audit").contains("created"), "{seen}");
    assert_eq!(line("inet"), "inet created", "{seen}");
    assert_eq!(line("unix"), "unix created", "{seen}");
    let wrapper = ev.wrapper_argv.unwrap_or_default().join(" ");
    assert!(wrapper.contains("--security-opt seccomp="), "{wrapper}");
}
