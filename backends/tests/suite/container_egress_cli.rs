//! `network.egress` under `--runtime container` on real podman: the container has no network
//! but a forwarder agentdiff runs in its network namespace, relaying to the egress proxy. busybox
//! `wget` reaches an allowed name through the proxy, a denied name is refused and sealed, and
//! connections that bypass the proxy reach nothing. Names are mapped to a loopback server by a
//! private `/etc/hosts` (a mount namespace of the test's own), as in `bwrap_egress_cli.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;

use serde_json::Value;

use super::bwrap_egress_cli::{records, Server, ALLOWED, DENIED, SERVER_IP};
use super::process_evidence_cli::{busybox_rootfs, podman_missing};
use agentdiff_test_support::rootfs::{host_python_missing, python_rootfs, SOCKET_FAMILIES_PY};

/// `argv` run with `--runtime container --rootfs ROOTFS --format json`, which must exit 0: the
/// result and the run's stderr (where a probe writes: the command's stdout is agentdiff's).
pub(super) fn run_in_container(
    root: &std::path::Path,
    rootfs: &std::path::Path,
    argv: &[&str],
) -> (Value, String) {
    let extra = [
        "--runtime",
        "container",
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--fail-on",
        "never",
    ];
    let (code, result, out) = super::run_json(root, &extra, argv);
    let stderr = super::text(&out.stderr);
    assert_eq!(code, 0, "{stderr}");
    (result, stderr)
}

/// What follows `TAG NAME ` on a line of `stderr`.
pub(super) fn tagged(stderr: &str, tag: &str, name: &str) -> Option<String> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{tag} {name} ")))
        .map(str::to_string)
}

fn unshare_missing() -> bool {
    !std::process::Command::new("unshare")
        .args(["-m", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn a_container_reaches_only_the_allowed_name_through_the_proxy_and_every_attempt_is_sealed() {
    if let Some(missing) = podman_missing() {
        agentdiff_conformance::skip_unless_required(&missing);
        return;
    }
    if unshare_missing() {
        agentdiff_conformance::skip_unless_required("a private mount namespace (unshare -m, root)");
        return;
    }
    let served = tempfile::tempdir().unwrap();
    fs::write(served.path().join("hello.txt"), "hello through the proxy\n").unwrap();
    let server = Server::start(served.path());
    let port = server.port;
    let rootfs = busybox_rootfs();
    let project = tempfile::tempdir().unwrap();
    let root = project.path();
    fs::write(root.join("a.txt"), "a\n").unwrap();
    fs::write(
        root.join("agentdiff.yaml"),
        format!(
            "version: 2\nnetwork:\n  egress:\n    allow:\n      - \"{ALLOWED}\"\n      - \"{SERVER_IP}\"\n"
        ),
    )
    .unwrap();
    let hosts = project.path().join("..").join(format!(
        "hosts-{}",
        root.file_name().unwrap().to_string_lossy()
    ));
    fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n{SERVER_IP} {ALLOWED} {DENIED}\n"),
    )
    .unwrap();
    let url = |host: &str| format!("http://{host}:{port}/hello.txt");
    let tries: Vec<(&str, String)> = vec![
        // (No `-T`: Debian's static busybox wget crashes with it.)
        (
            "wget_allowed",
            format!("wget -q -O got.txt {}", url(ALLOWED)),
        ),
        ("wget_denied", format!("wget -q -O - {}", url(DENIED))),
        // The proxy switched off: a direct connection to the server's address.
        (
            "wget_direct",
            format!("wget -q -Y off -O - {}", url(SERVER_IP)),
        ),
        (
            "nc_server",
            format!("nc -w 5 {SERVER_IP} {port} </dev/null"),
        ),
        ("nc_outside", "nc -w 5 192.0.2.1 80 </dev/null".to_string()),
    ];
    // Each outcome goes to stderr (the command's stderr is agentdiff's): the workspace is private.
    let mut script = String::from(
        "try() { if sh -c \"$2\" >/dev/null 2>/tmp/err; then echo \"ATTEMPT $1=ok\" >&2; \
         else echo \"ATTEMPT $1=fail ($(head -c 300 /tmp/err))\" >&2; fi; }\n",
    );
    for (name, cmd) in &tries {
        script.push_str(&format!("try {name} '{}'\n", cmd.replace('\'', r"'\''")));
    }
    fs::write(root.join("attempts.sh"), script).unwrap();
    let setup = format!("mount --bind '{}' /etc/hosts", hosts.display());
    let args = [
        "run",
        "--runtime",
        "container",
        "--rootfs",
        rootfs.path().to_str().unwrap(),
        "--format",
        "json",
        "--fail-on",
        "never",
        "--",
        "sh",
        "attempts.sh",
    ];
    let out = super::in_mount_namespace(root, &setup, &args)
        .output()
        .unwrap();
    let _ = fs::remove_file(&hosts);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let outcomes: std::collections::BTreeMap<&str, bool> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("ATTEMPT ")?.split_once('='))
        .map(|(k, v)| (k, v == "ok"))
        .collect();
    // What each attempt printed is in `stderr`, so a failure elsewhere says why.
    for (name, ok) in [
        ("wget_allowed", true),
        ("wget_denied", false),
        ("wget_direct", false),
        ("nc_server", false),
        ("nc_outside", false),
    ] {
        assert_eq!(outcomes.get(name), Some(&ok), "{name}: {stderr}");
    }

    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = result["run_id"].as_str().unwrap();
    let rt: Value = serde_json::from_str(
        &fs::read_to_string(root.join(".agentdiff/runs").join(id).join("runtime.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(rt["capabilities"]["network"], "filtered", "{rt:#}");
    assert_eq!(rt["capabilities"]["network_enforcement"], true);
    assert_eq!(rt["runtime_config"]["network"], "filtered");
    assert_eq!(rt["runtime_config"]["engine_network"], "none");
    let forwarder = &rt["wrapper"]["egress_forwarder"];
    assert!(
        forwarder["netns"].as_str().unwrap().starts_with("net:["),
        "{rt:#}"
    );
    assert_eq!(forwarder["listen"], "127.0.0.1:3128");
    // The container was created with no network and the proxy variables, nothing mounted for it.
    let argv: Vec<&str> = rt["wrapper_argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[1], "create", "{argv:?}");
    assert!(
        argv.windows(2).any(|w| w == ["--network", "none"]),
        "{argv:?}"
    );
    assert!(
        argv.contains(&"HTTP_PROXY=http://127.0.0.1:3128"),
        "{argv:?}"
    );

    let allowed = records(&rt, ALLOWED);
    assert_eq!(allowed.len(), 1, "{allowed:#?}");
    assert_eq!(allowed[0]["action"], "allow");
    assert_eq!(allowed[0]["rule"], "network.egress.allow[0]");
    assert_eq!(allowed[0]["address"], format!("{SERVER_IP}:{port}"));
    let denied = records(&rt, DENIED);
    assert_eq!(denied.len(), 1, "{denied:#?}");
    assert_eq!(denied[0]["action"], "deny");
    assert_eq!(denied[0]["rule"], "network.egress.default");
    // The direct attempts never reached the proxy: nothing else was recorded.
    let egress = &rt["network"]["egress"];
    assert_eq!(egress["total"], 2, "{egress:#}");
    assert_eq!(egress["denied"], 1);
    let findings: Vec<&Value> = result["evidence_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "egress_denied")
        .collect();
    assert_eq!(findings.len(), 1, "{result:#}");
    // The allowed download landed in the private workspace and is a recorded change.
    let changes = result.to_string();
    assert!(changes.contains("got.txt"), "{result:#}");
    // No "allowlist not applied" warning: it was applied.
    assert!(
        !changes.contains("did not apply the allowlist"),
        "{result:#}"
    );
    super::assert_exit(&super::cmd(root, &["verify", id]).output().unwrap(), 0);
    drop(server);
}

#[test]
fn filtered_on_a_remote_engine_is_refused_before_anything_runs() {
    let project = tempfile::tempdir().unwrap();
    let root = project.path();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 2\nnetwork:\n  egress:\n    allow: [api.example.com]\n",
    )
    .unwrap();
    let out = super::cmd(
        root,
        &[
            "run",
            "--runtime",
            "container",
            "--image",
            "localhost/agentdiff-test:busybox",
            "--network",
            "filtered",
            "--backend-option",
            "engine-host=tcp://127.0.0.1:9",
            "--",
            "touch",
            "ran.txt",
        ],
    )
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{stderr}");
    assert!(
        stderr.contains("filtered") && stderr.contains("remote engine"),
        "{stderr}"
    );
    assert!(!root.join("ran.txt").exists());
}

/// Through the binary under `--runtime container` on podman: the command cannot create an
/// `AF_VSOCK` socket (no network namespace separates it; on a virtual machine it may reach the
/// hypervisor host) while inet and unix sockets still work, and the run's evidence names the
/// derived seccomp profile that refused it.
#[test]
fn under_podman_a_command_cannot_create_a_vsock_socket() {
    if let Some(missing) = podman_missing().or_else(host_python_missing) {
        agentdiff_conformance::skip_unless_required(&missing);
        return;
    }
    let rootfs = python_rootfs().unwrap();
    let project = tempfile::tempdir().unwrap();
    let root = project.path();
    let argv = ["/usr/bin/python3", "-c", SOCKET_FAMILIES_PY];
    let (result, stderr) = run_in_container(root, rootfs.path(), &argv);
    let seen = |name: &str| tagged(&stderr, "SOCKET", name).unwrap_or_default();
    // The profile's refusal, not the kernel's EAFNOSUPPORT (a host without vsock).
    let vsock = seen("vsock");
    assert!(
        !vsock.is_empty() && vsock != "created" && vsock != libc::EAFNOSUPPORT.to_string(),
        "{stderr}"
    );
    assert!(
        !seen("audit").is_empty() && seen("audit") != "created",
        "{stderr}"
    );
    assert_eq!(seen("inet"), "created", "{stderr}");
    assert_eq!(seen("unix"), "created", "{stderr}");
    let id = result["run_id"].as_str().unwrap();
    let runtime: Value = serde_json::from_str(
        &fs::read_to_string(root.join(".agentdiff/runs").join(id).join("runtime.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        runtime["runtime_config"]["seccomp"]["profile"], "derived",
        "{runtime:#}"
    );
    // `doctor` names the same profile before any run.
    let doctor = super::agentdiff(root, &["doctor", "--format", "json"]);
    let doctor: Value = serde_json::from_slice(&doctor.stdout).unwrap();
    let container = doctor["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "container")
        .unwrap();
    let detail = container["availability"]["detail"].as_str().unwrap();
    let source = runtime["runtime_config"]["seccomp"]["derived_from"]
        .as_str()
        .unwrap();
    assert!(
        detail.contains(&format!("podman runs get seccomp derived from {source}")),
        "{detail}"
    );
}
