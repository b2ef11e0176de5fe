//! The suite validated against its own test backends: the honest one passes, the dishonest and
//! the broken ones fail with the right check ids.

use std::sync::Arc;

use agentdiff_conformance::testing::TestBackend;
use agentdiff_conformance::{run_suite, BackendFactory, Report, SuiteOptions};

fn factory(make: fn() -> TestBackend) -> BackendFactory {
    Arc::new(move || Box::new(make()))
}

async fn suite(make: fn() -> TestBackend) -> Report {
    let report = run_suite(factory(make), SuiteOptions::default()).await;
    println!("{}", report.to_tap());
    report
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_backend_passes_every_applicable_check() {
    let report = suite(TestBackend::reference).await;
    assert!(
        report.failed_ids().is_empty(),
        "failed: {:?}",
        report.failed_ids()
    );
    assert!(report.conformant());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dishonest_backend_fails_exactly_the_filesystem_honesty_check() {
    let report = suite(TestBackend::dishonest).await;
    assert_eq!(report.failed_ids(), vec!["HONEST-FS-001"]);
    let fs = report.check("HONEST-FS-001").unwrap();
    assert_eq!(
        fs.details["probe"]["verdict"], "not_enforced",
        "{:?}",
        fs.details
    );
    assert!(!report.conformant());
    // The probe evidence is in the report: the sentinel's hash changed.
    let probe = report
        .probes
        .iter()
        .find(|p| p.probe == agentdiff_conformance::ProbeKind::OutsideWrite)
        .unwrap();
    assert_ne!(
        probe.evidence["sha256_before"],
        probe.evidence["sha256_after"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_backend_fails_the_argv_checks_it_breaks() {
    let report = suite(TestBackend::broken_argv).await;
    assert_eq!(
        report.failed_ids(),
        vec!["ARGV-002", "ARGV-004", "ARGV-006"]
    );
    assert!(
        !report.conformant(),
        "ARGV-002 and ARGV-004 are MUST checks"
    );
    let empty = report.check("ARGV-004").unwrap();
    assert!(
        matches!(&empty.outcome, agentdiff_conformance::Outcome::Failed { reason } if reason.contains("sent 4 arguments, the command received 1")),
        "{:?}",
        empty.outcome
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_checks_are_reported_with_reasons_and_never_as_passes() {
    let report = run_suite(
        factory(TestBackend::reference),
        SuiteOptions {
            only: vec!["WORK-".into(), "HONEST-NET".into(), "FAIL-".into()],
            ..SuiteOptions::default()
        },
    )
    .await;
    assert_eq!(report.checks.len(), 3);
    for c in &report.checks {
        assert!(c.outcome.is_skipped(), "{} {:?}", c.id, c.outcome);
    }
    assert_eq!(report.summary.passed, 0);
    assert_eq!(report.summary.skipped, 3);
    let tap = report.to_tap();
    assert_eq!(tap.matches("# SKIP").count(), 3, "{tap}");
}
