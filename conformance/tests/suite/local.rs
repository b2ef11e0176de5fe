//! The suite against the built-in `local` backend.

use std::sync::Arc;

use agentdiff_backend_local::LocalBackend;
use agentdiff_conformance::{run_suite, SuiteOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_backend_is_conformant() {
    let report = run_suite(
        Arc::new(|| Box::new(LocalBackend::new())),
        SuiteOptions::default(),
    )
    .await;
    println!("{}", report.to_tap());
    assert!(
        report.failed_ids().is_empty(),
        "failed: {:?}",
        report.failed_ids()
    );
    // The seed's wording: the local backend is neither sandboxed nor network-enforcing, and it
    // claims no enforcement, so no honesty probe is required of it.
    assert!(!report.capabilities.sandboxed);
    assert!(!report.capabilities.network_enforcement);
    for id in [
        "ARGV-001",
        "EXIT-004",
        "TIME-001",
        "PROC-002",
        "CLEAN-001",
        "EVID-001",
        "EVID-002",
    ] {
        assert!(
            report.check(id).unwrap().outcome.is_passed(),
            "{id} must run and pass"
        );
    }
}
