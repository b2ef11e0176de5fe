//! The conformance suite against the local backend.

use std::sync::Arc;

use agentdiff_backend_local::LocalBackend;
use agentdiff_conformance::{assert_conformant, SuiteOptions};

#[test]
fn local_backend_is_conformant() {
    let report = assert_conformant(
        Arc::new(|| Box::new(LocalBackend::new())),
        SuiteOptions::default(),
    );
    assert!(!report.capabilities.sandboxed);
    assert!(!report.capabilities.network_enforcement);
}
