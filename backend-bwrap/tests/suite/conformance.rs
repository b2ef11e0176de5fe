//! The conformance suite against the bwrap backend with the real bubblewrap: every label it
//! declares `enforced` must withstand its probe, handed the egress proxy its `filtered` network
//! must withstand the egress probe, and a missing bwrap must fail closed.

use std::sync::Arc;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_bwrap::{BwrapBackend, OPT_EXECUTABLE, OPT_EXEC_SHIM};
use agentdiff_conformance::{assert_conformant, FailClosedCase, Outcome, SuiteOptions};

const SHIM: &str = env!("CARGO_BIN_EXE_agentdiff-bwrap-exec-shim");

fn suite_options() -> SuiteOptions {
    let mut o = BackendOptions::new();
    o.push(OPT_EXEC_SHIM, SHIM);
    let mut missing = o.clone();
    missing.push(OPT_EXECUTABLE, "/nonexistent/agentdiff-missing-bwrap");
    SuiteOptions {
        backend_options: o,
        fail_closed: vec![FailClosedCase {
            name: "bwrap executable missing".into(),
            options: missing,
            factory: None,
        }],
        ..SuiteOptions::default()
    }
}

#[test]
fn bwrap_backend_is_conformant_and_its_enforced_labels_are_proved() {
    let report = assert_conformant(Arc::new(|| Box::new(BwrapBackend::new())), suite_options());
    if !report.availability.is_ready() {
        agentdiff_conformance::skip_unless_required("bwrap is not available here");
        return;
    }
    for id in [
        "HONEST-FS-001",
        "HONEST-NET-001",
        "NET-FILTER-001",
        "HONEST-PROC-001",
        "HONEST-PRIV-001",
        "HONEST-ENV-001",
        "FAIL-001",
        "HOLD-001",
    ] {
        let check = report.check(id).unwrap_or_else(|| panic!("no {id}"));
        assert!(
            matches!(check.outcome, Outcome::Passed),
            "{id}: {:?} {}",
            check.outcome,
            check.details
        );
    }
}
