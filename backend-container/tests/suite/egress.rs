//! `network: filtered`: when the container backend makes agentdiff's egress proxy the command's
//! only route out, and where it refuses to (no proxy, a remote engine, docker), decided before
//! anything runs; the exact create argv. The real runs are in `conformance.rs` (NET-FILTER-001
//! on podman) and `backends/tests/suite/container_egress_cli.rs` (through the binary).

use std::path::PathBuf;

use agentdiff_backend_api::{BackendError, RuntimeBackend};

use super::helpers::*;

const SOCKET: &str = "/tmp/agentdiff-egress-1-2/egress.sock";

fn prepared(
    engine: &str,
    options: &[(&str, &str)],
    proxy: bool,
) -> Result<agentdiff_backend_api::PreparedLaunch, BackendError> {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let backend = fake_backend(&log, engine, &[]);
    let l = layout("r1");
    let mut all = vec![("engine", engine), ("image", "localhost/x:1")];
    all.extend_from_slice(options);
    let mut s = spec(&l, "r1", &["wget", "http://a.test/"], &all);
    s.egress_proxy = proxy.then(|| PathBuf::from(SOCKET));
    backend.prepare(&s)
}

fn words(p: &agentdiff_backend_api::PreparedLaunch) -> Vec<String> {
    p.args()
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect()
}

#[test]
fn with_the_proxy_local_podman_is_filtered_by_default_with_no_network_and_the_proxy_variables() {
    let p = prepared("podman", &[("env", "HTTP_PROXY"), ("env", "LANG")], true).unwrap();
    let w = words(&p);
    let joined = w.join(" ");
    // Created, not run: the forwarder starts between `init` and `start`.
    assert_eq!(w[0], "create", "{joined}");
    assert!(joined.contains("--network none"), "{joined}");
    assert!(
        joined.contains("--env HTTP_PROXY=http://127.0.0.1:3128"),
        "{joined}"
    );
    assert!(joined.contains("--env ALL_PROXY=socks5h://127.0.0.1:3128"));
    assert!(joined.contains("--env NO_PROXY=localhost,127.0.0.1,::1"));
    assert!(joined.contains("--env npm_config_https_proxy=http://127.0.0.1:3128"));
    // The caller's own proxy variable is replaced, never passed by name; others still are.
    assert!(!w.iter().any(|a| a == "HTTP_PROXY"), "{joined}");
    assert!(joined.contains("--env LANG"));
    // The socket never appears on the engine's command line: nothing of it is mounted.
    assert!(!joined.contains(SOCKET), "{joined}");
    let config = p.runtime_config();
    assert_eq!(config["network"], "filtered");
    assert_eq!(config["engine_network"], "none");
    assert_eq!(config["egress_proxy"]["socket"], SOCKET);
}

#[test]
fn without_the_proxy_or_with_another_network_chosen_nothing_is_filtered() {
    for (options, proxy, network) in [
        (vec![], false, "none"),
        (vec![("network", "none")], true, "none"),
        (vec![("network", "bridge")], true, "bridge"),
    ] {
        let p = prepared("podman", &options, proxy).unwrap();
        let w = words(&p);
        assert_eq!(w[0], "run", "{options:?}");
        assert!(!w.iter().any(|a| a.contains("_PROXY")), "{w:?}");
        assert_eq!(p.runtime_config()["network"], network);
        assert!(p.runtime_config()["egress_proxy"].is_null());
    }
}

#[test]
fn filtered_is_refused_where_the_proxy_cannot_be_the_only_route_out() {
    let refused = |engine: &str, options: &[(&str, &str)], proxy: bool, needle: &str| {
        let err = prepared(engine, options, proxy).unwrap_err();
        assert!(matches!(err, BackendError::InvalidRequest { .. }), "{err}");
        let text = err.to_string();
        assert!(text.contains("filtered") && text.contains(needle), "{text}");
    };
    refused(
        "podman",
        &[("network", "filtered")],
        false,
        "network.egress",
    );
    refused(
        "podman",
        &[
            ("network", "filtered"),
            ("engine-host", "tcp://build-1:2376"),
        ],
        true,
        "remote engine",
    );
    refused(
        "docker",
        &[("network", "filtered")],
        true,
        "--engine podman",
    );
}

#[test]
fn by_default_a_remote_or_docker_run_with_the_proxy_gets_no_network_not_the_bridge() {
    for (engine, options) in [
        ("docker", vec![]),
        ("podman", vec![("engine-host", "tcp://build-1:2376")]),
    ] {
        let p = prepared(engine, &options, true).unwrap();
        let joined = words(&p).join(" ");
        assert!(joined.contains("--network none"), "{joined}");
        assert!(!joined.contains("_PROXY"), "{joined}");
        assert_eq!(p.runtime_config()["network"], "none");
    }
}

#[tokio::test]
async fn an_engine_whose_container_shares_agentdiffs_network_runs_nothing() {
    // The fake engine's "container" is its caller: no network namespace of its own, so the
    // forwarder refuses to start, the container is removed, and the command never starts.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let backend = fake_backend(&log, "podman", &[]);
    let l = layout("r1");
    let sock = dir.path().join("egress.sock");
    let _proxy = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let rootfs = busybox_rootfs();
    let mut s = spec(
        &l,
        "r1",
        &["touch", "ran.txt"],
        &[
            ("engine", "podman"),
            ("rootfs", rootfs.path().to_str().unwrap()),
        ],
    );
    s.egress_proxy = Some(sock);
    let (stdio, _, _) = files_stdio(dir.path());
    let err = run(&backend, &s, stdio).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("agentdiff's own") && text.contains("never ran"),
        "{text}"
    );
    let calls: Vec<String> = logged(&log).into_iter().map(|(a, _)| a.join(" ")).collect();
    assert!(calls.iter().any(|c| c.starts_with("create ")), "{calls:#?}");
    assert!(calls.iter().any(|c| c.starts_with("rm -f")), "{calls:#?}");
    assert!(!calls.iter().any(|c| c.starts_with("start")), "{calls:#?}");
    assert!(!l.workspace.join("ran.txt").exists());
}
