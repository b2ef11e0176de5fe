//! The conformance suite against the srt backend: with the fake srt, and with the real srt.

use std::path::Path;
use std::sync::Arc;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_srt::{SrtBackend, OPT_EXECUTABLE, OPT_EXEC_SHIM, OPT_SETTINGS};
use agentdiff_conformance::{assert_conformant, FailClosedCase, SuiteOptions};

use super::common::{FAKE_SRT, SHIM};

const SETTINGS: &str = r#"{"filesystem":{"denyRead":[],"allowWrite":["."],"denyWrite":[]},"network":{"allowedDomains":[],"deniedDomains":[]}}"#;

fn suite_options(srt: &str, dir: &Path) -> SuiteOptions {
    let settings = dir.join("srt-settings.json");
    std::fs::write(&settings, SETTINGS).unwrap();
    let mut o = BackendOptions::new();
    o.push(OPT_EXEC_SHIM, SHIM);
    o.push(OPT_SETTINGS, settings.to_str().unwrap());
    o.push(OPT_EXECUTABLE, srt);
    let mut missing = o.clone();
    missing.push(OPT_EXECUTABLE, "/nonexistent/agentdiff-missing-srt");
    SuiteOptions {
        backend_options: o,
        fail_closed: vec![FailClosedCase {
            name: "srt executable missing".into(),
            options: missing,
            factory: None,
        }],
        ..SuiteOptions::default()
    }
}

#[test]
fn srt_backend_is_conformant_with_the_fake_srt() {
    let dir = tempfile::tempdir().unwrap();
    assert_conformant(
        Arc::new(|| Box::new(SrtBackend::new())),
        suite_options(FAKE_SRT, dir.path()),
    );
}

#[test]
fn srt_backend_is_conformant_with_the_real_srt_and_no_options() {
    // Nothing but the exec shim (the test has no `agentdiff` binary): the settings are derived
    // from the policy, as for a user who names none.
    let mut o = BackendOptions::new();
    o.push(OPT_EXEC_SHIM, SHIM);
    let report = assert_conformant(
        Arc::new(|| Box::new(SrtBackend::new())),
        SuiteOptions {
            // The case the backend declares (srt missing), as `agentdiff conformance` uses it.
            fail_closed: FailClosedCase::from_specs(agentdiff_backend_srt::FAIL_CLOSED, &o),
            backend_options: o,
            ..SuiteOptions::default()
        },
    );
    // The derived settings allow writes only below the root: the probe proves the outside write
    // is refused on this host (reported as information: the label stays `requested`). Without
    // srt, assert_conformant printed the skip (and failed under AGENTDIFF_REQUIRE_REAL_BACKENDS).
    if report.availability.is_ready() {
        assert_eq!(
            report.check("HONEST-FS-001").unwrap().details["probe"]["verdict"],
            "verified"
        );
    }
}
