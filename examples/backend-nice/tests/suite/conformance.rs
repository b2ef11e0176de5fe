//! The example backend passes the agentdiff conformance suite, including fail-closed behaviour
//! with a missing `nice`.

use std::sync::Arc;

use agentdiff_backend_nice::{NiceBackend, OPT_EXECUTABLE};
use agentdiff_conformance::{assert_conformant, FailClosedCase, SuiteOptions};
use agentdiff_engine::backend::{BackendOptions, Registry};

#[test]
fn nice_backend_is_conformant() {
    let mut missing = BackendOptions::new();
    missing.push(OPT_EXECUTABLE, "/nonexistent/nice");
    let report = assert_conformant(
        Arc::new(|| Box::new(NiceBackend)),
        SuiteOptions {
            fail_closed: vec![FailClosedCase {
                name: "nice missing".into(),
                options: missing,
                factory: None,
            }],
            ..SuiteOptions::default()
        },
    );
    // The fail-closed check really ran (it is skipped when no unusable configuration is given).
    assert!(report.check("FAIL-001").unwrap().outcome.is_passed());
    assert!(report.check("ARGV-004").unwrap().outcome.is_passed());
}

#[test]
fn the_backend_registers_itself() {
    let registry = Registry::from_inventory().unwrap();
    assert!(registry.ids().contains(&"nice"), "{:?}", registry.ids());
}
