//! The agentdiff conformance suite against the container backend on real podman (busybox rootfs),
//! including fail-closed cases: no engine at all, and an image that is not present locally.

use std::path::PathBuf;
use std::sync::Arc;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_container::engine::ProgramSource;
use agentdiff_backend_container::ContainerBackend;
use agentdiff_conformance::{assert_conformant, FailClosedCase, SuiteOptions};

use super::helpers::*;

#[test]
fn container_backend_is_conformant_on_podman() {
    if skip_or_fail(
        "container_backend_is_conformant_on_podman",
        podman_missing().or_else(host_python_missing),
    ) {
        return;
    }
    // Busybox plus Python: the egress probe (NET-FILTER-001) runs a Python script.
    let rootfs = python_rootfs().unwrap();
    let mut options = BackendOptions::new();
    options.push("engine", "podman");
    options.push("rootfs", rootfs.path().to_str().unwrap());
    let mut absent_image = BackendOptions::new();
    absent_image.push("engine", "podman");
    absent_image.push("image", "localhost/agentdiff-absent:never");
    let report = assert_conformant(
        Arc::new(|| Box::new(ContainerBackend::new())),
        SuiteOptions {
            backend_options: options.clone(),
            fail_closed: vec![
                FailClosedCase {
                    name: "no container engine".into(),
                    options: options.clone(),
                    factory: Some(Arc::new(|| {
                        let missing = ProgramSource::Fixed(PathBuf::from("/nonexistent/podman"));
                        Box::new(ContainerBackend::new().with_engines(missing.clone(), missing))
                    })),
                },
                FailClosedCase {
                    name: "image not present locally".into(),
                    options: absent_image,
                    factory: None,
                },
            ],
            require_available: true,
            ..SuiteOptions::default()
        },
    );
    for id in [
        "FAIL-001",
        "ARGV-003",
        "STDIO-001",
        "TIME-001",
        "WORK-001",
        "TXN-002",
        "HONEST-HOST-001",
        "NET-FILTER-001",
    ] {
        let check = report
            .check(id)
            .unwrap_or_else(|| panic!("{id} missing from the report"));
        assert!(check.outcome.is_passed(), "{id}: {:?}", check.outcome);
    }
    // Verified by the probe, not skipped: handed the proxy, the run is labelled filtered and
    // only the listed host was reached.
    let net = report.check("NET-FILTER-001").unwrap();
    assert!(
        matches!(net.outcome, agentdiff_conformance::Outcome::Passed),
        "{:?} {}",
        net.outcome,
        net.details
    );
}

#[test]
fn container_backend_is_conformant_with_the_docker_cli_on_podmans_socket() {
    if skip_or_fail(
        "container_backend_is_conformant_with_the_docker_cli_on_podmans_socket",
        podman_missing().or_else(docker_socket_missing),
    ) {
        return;
    }
    ensure_test_image().unwrap();
    let mut options = BackendOptions::new();
    options.push("engine", "docker");
    options.push("image", TEST_IMAGE);
    let report = assert_conformant(
        Arc::new(|| {
            Box::new(
                ContainerBackend::new()
                    .with_client_env("DOCKER_HOST", format!("unix://{PODMAN_SOCKET}")),
            )
        }),
        SuiteOptions {
            fail_closed: FailClosedCase::from_specs(
                agentdiff_backend_container::FAIL_CLOSED,
                &options,
            ),
            backend_options: options,
            require_available: true,
            ..SuiteOptions::default()
        },
    );
    for id in [
        "ARGV-003",
        "STDIO-001",
        "TIME-001",
        "WORK-001",
        "HONEST-HOST-001",
    ] {
        let check = report
            .check(id)
            .unwrap_or_else(|| panic!("{id} missing from the report"));
        assert!(check.outcome.is_passed(), "{id}: {:?}", check.outcome);
    }
}

#[test]
fn container_backend_is_conformant_with_the_fake_engine() {
    let dir = tempfile::tempdir().unwrap();
    let rootfs = busybox_rootfs();
    let log = dir.path().join("engine.log");
    let mut options = BackendOptions::new();
    options.push("engine", "podman");
    options.push("rootfs", rootfs.path().to_str().unwrap());
    // The fake engine's "container" has no network namespace of its own, so `filtered` (the
    // default when the egress probe hands over the proxy) is refused there (egress.rs).
    options.push("network", "none");
    let fail_log = log.clone();
    assert_conformant(
        Arc::new(move || Box::new(fake_backend(&log, "podman", &[]))),
        SuiteOptions {
            backend_options: options.clone(),
            fail_closed: vec![FailClosedCase {
                name: "engine fails before creating the container".into(),
                options,
                factory: Some(Arc::new(move || {
                    Box::new(fake_backend(
                        &fail_log,
                        "podman",
                        &[("FAKE_ENGINE_RUN", "engine-fail")],
                    ))
                })),
            }],
            ..SuiteOptions::default()
        },
    );
}
