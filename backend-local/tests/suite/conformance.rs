//! The conformance suite against the local backend.

use std::sync::Arc;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_local::{LocalBackend, FAIL_CLOSED};
use agentdiff_conformance::{assert_conformant, FailClosedCase, SuiteOptions};

#[test]
fn local_backend_is_conformant() {
    let report = assert_conformant(
        Arc::new(|| Box::new(LocalBackend::new())),
        SuiteOptions {
            fail_closed: FailClosedCase::from_specs(FAIL_CLOSED, &BackendOptions::new()),
            ..SuiteOptions::default()
        },
    );
    assert!(report.check("FAIL-001").unwrap().outcome.is_passed());
    assert!(!report.capabilities.sandboxed);
    assert!(!report.capabilities.network_enforcement);
}
