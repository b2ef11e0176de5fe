//! The example backend passes the agentdiff conformance suite, including fail-closed behaviour
//! with a missing `nice`.

use std::sync::Arc;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_nice::NiceBackend;
use agentdiff_conformance::{assert_conformant, FailClosedCase, SuiteOptions};
use agentdiff_plugins::Registry;

#[test]
fn nice_backend_is_conformant() {
    // The fail-closed cases are the ones the backend's descriptor declares, as
    // `agentdiff conformance --runtime nice` would use them.
    let registry = Registry::from_inventory().unwrap();
    let descriptor = registry.descriptor("nice").unwrap();
    let report = assert_conformant(
        Arc::new(|| Box::new(NiceBackend)),
        SuiteOptions {
            fail_closed: FailClosedCase::declared(descriptor, &BackendOptions::new()),
            ..SuiteOptions::default()
        },
    );
    // The fail-closed check really ran (it is not run when no unusable configuration is given).
    assert!(report.check("FAIL-001").unwrap().outcome.is_passed());
    assert!(report.check("ARGV-004").unwrap().outcome.is_passed());
}

#[test]
fn the_backend_registers_itself() {
    let registry = Registry::from_inventory().unwrap();
    assert!(registry.ids().contains(&"nice"), "{:?}", registry.ids());
}
