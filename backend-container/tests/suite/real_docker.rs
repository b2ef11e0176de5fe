//! The docker CLI against podman's Docker-compatible socket with an imported busybox image.

use agentdiff_backend_container::ContainerBackend;

use super::helpers::*;

fn docker_backend() -> ContainerBackend {
    ContainerBackend::new().with_client_env("DOCKER_HOST", format!("unix://{PODMAN_SOCKET}"))
}

#[tokio::test]
async fn docker_cli_runs_on_the_podman_socket_with_the_same_controls() {
    if skip_or_fail(
        "docker_cli_runs_on_the_podman_socket",
        podman_missing().or_else(docker_socket_missing),
    ) {
        return;
    }
    ensure_test_image().unwrap();
    let l = layout("docker-w1");
    let host_before = snapshot(&l.root);
    let s = spec(
        &l,
        "docker-w1",
        &["/bin/sh", "-c", "echo changed > host.txt; id -u > uid; echo x > /bin/evil 2>/dev/null || echo ro > ro; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' > ifaces"],
        &[("engine", "docker"), ("image", TEST_IMAGE)],
    );
    let (stdio, _, err) = files_stdio(&l.capsule);
    let ev = run(&docker_backend(), &s, stdio).await.unwrap();
    assert_eq!(
        ev.exit.code,
        Some(0),
        "stderr: {}",
        std::fs::read_to_string(err).unwrap_or_default()
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("host.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("uid")).unwrap(),
        "65532\n"
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("ro")).unwrap(),
        "ro\n"
    );
    assert_eq!(
        std::fs::read_to_string(l.workspace.join("ifaces")).unwrap(),
        "lo\n"
    );
    assert_eq!(snapshot(&l.root), host_before);
    let facts: agentdiff_backend_container::ContainerFacts =
        ev.wrapper.as_ref().unwrap().decode().unwrap();
    assert!(facts.image_id.as_deref().unwrap().starts_with("sha256:"));
    let w = ev.wrapper.unwrap();
    assert!(w["version"].as_str().unwrap().starts_with("Docker version"));
    assert!(w["api_server_version"].is_string());
}

#[tokio::test]
async fn docker_cli_refuses_an_absent_image_without_pulling() {
    if skip_or_fail(
        "docker_cli_refuses_an_absent_image",
        podman_missing().or_else(docker_socket_missing),
    ) {
        return;
    }
    let l = layout("docker-noimg");
    let s = spec(
        &l,
        "docker-noimg",
        &["true"],
        &[
            ("engine", "docker"),
            ("image", "localhost/agentdiff-absent:never"),
        ],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    match run(&docker_backend(), &s, stdio).await {
        Err(agentdiff_backend_api::BackendError::Unavailable { reason, .. }) => {
            assert!(reason.contains("not present locally"), "{reason}")
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
}

#[tokio::test]
async fn docker_cli_reports_the_commands_exit_code_and_removes_the_container() {
    if skip_or_fail(
        "docker_cli_reports_the_commands_exit_code",
        podman_missing().or_else(docker_socket_missing),
    ) {
        return;
    }
    ensure_test_image().unwrap();
    let l = layout("docker-exit");
    let s = spec(
        &l,
        "docker-exit",
        &["/bin/sh", "-c", "exit 42"],
        &[("engine", "docker"), ("image", TEST_IMAGE)],
    );
    let (stdio, _, _) = files_stdio(&l.capsule);
    let ev = run(&docker_backend(), &s, stdio).await.unwrap();
    assert_eq!(ev.exit.code, Some(42));
    assert!(ev.failure.is_none());
    assert!(ev.cleanup.errors.is_empty(), "{:?}", ev.cleanup.errors);
    assert!(
        ev.warnings.iter().all(|w| !w.contains("still present")),
        "{:?}",
        ev.warnings
    );
    let left = std::process::Command::new("podman")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!(
                "label=agentdiff.run={}",
                agentdiff_backend_container::argv::RunIdentity::new(&l.root, "docker-exit")
                    .unwrap()
                    .key()
            ),
        ])
        .output()
        .unwrap();
    assert!(left.stdout.is_empty());
}
