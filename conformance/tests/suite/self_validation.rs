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
    // No fail-closed case was given: FAIL-001 is not run, so the report never says conformant.
    assert!(report.check("FAIL-001").unwrap().outcome.is_not_run());
    assert_eq!(report.not_run_ids(), vec!["FAIL-001"]);
    assert!(!report.conformant());
    assert!(report
        .to_tap()
        .contains("NOT conformant: MUST check(s) not run: FAIL-001"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dishonest_backend_fails_exactly_the_filesystem_checks() {
    let report = suite(TestBackend::dishonest).await;
    // It claims filesystem confinement but hands the command the harness's host files as its
    // streams (STDIO-003) and lets it write outside the root (HONEST-FS-001).
    assert_eq!(report.failed_ids(), vec!["STDIO-003", "HONEST-FS-001"]);
    let stdio = report.check("STDIO-003").unwrap();
    assert_eq!(stdio.details["planted"], true, "{:?}", stdio.details);
    let fs = report.check("HONEST-FS-001").unwrap();
    assert_eq!(
        fs.details["probe"]["verdict"], "not_enforced",
        "{:?}",
        fs.details
    );
    assert!(!report.conformant());
    // The probe evidence is in the report: a sentinel's hash changed.
    let probe = report
        .probes
        .iter()
        .find(|p| p.probe == agentdiff_conformance::ProbeKind::OutsideWrite)
        .unwrap();
    let locations = probe.evidence["locations"].as_array().unwrap();
    assert!(
        locations
            .iter()
            .any(|l| l["sha256_before"] != l["sha256_after"]),
        "{locations:?}"
    );
}

/// Proxy variables set, network not unshared: the `filtered` label fails the egress check, and
/// only it (the loopback honesty check does not apply below `enforced`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtered_label_without_an_unshared_network_fails_the_egress_check() {
    let report = suite(TestBackend::falsely_filtered).await;
    assert_eq!(report.failed_ids(), vec!["NET-FILTER-001"]);
    let check = report.check("NET-FILTER-001").unwrap();
    assert_eq!(
        check.details["probe"]["verdict"], "not_enforced",
        "{:?}",
        check.details
    );
    let summary = check.details["probe"]["summary"].as_str().unwrap();
    assert!(summary.contains("direct connection reached"), "{summary}");
    // The honest reference backend is not labelled filtered: the check does not apply to it.
    let reference = suite(TestBackend::reference).await;
    assert!(reference
        .check("NET-FILTER-001")
        .unwrap()
        .outcome
        .is_skipped());
}

/// A backend that only makes `/tmp` private hides the scratch directory (in `$TMPDIR`) and would
/// pass a probe that wrote only there; the sentinels in `/var/tmp` and `$HOME` catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_tmp_only_backend_fails_the_filesystem_honesty_check() {
    let bwrap_works = std::process::Command::new("bwrap")
        .args(["--bind", "/", "/", "--", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !bwrap_works && agentdiff_conformance::skip_unless_required("bwrap cannot run here") {
        return;
    }
    let report = suite(TestBackend::private_tmp_only).await;
    // The double also hides the suite's own scratch files next to the root, which the timing and
    // daemon checks watch; those fail too, but the point here is the filesystem honesty check.
    assert!(
        report.failed_ids().contains(&"HONEST-FS-001"),
        "{:?}",
        report.failed_ids()
    );
    assert!(!report.conformant());
    let probe = report
        .probes
        .iter()
        .find(|p| p.probe == agentdiff_conformance::ProbeKind::OutsideWrite)
        .unwrap();
    let locations = probe.evidence["locations"].as_array().unwrap();
    let changed = |dir: &str| {
        locations.iter().any(|l| {
            l["sentinel"].as_str().unwrap().starts_with(dir)
                && (l["sha256_before"] != l["sha256_after"] || l["new_file_created"] == true)
        })
    };
    // The private /tmp held: the sentinel next to the root is unchanged; /var/tmp is not.
    assert!(!changed(
        &std::env::temp_dir()
            .canonicalize()
            .unwrap()
            .display()
            .to_string()
    ));
    assert!(changed("/var/tmp"), "{locations:?}");
    // The suite removed every file it planted.
    for l in locations {
        assert!(!std::path::Path::new(l["sentinel"].as_str().unwrap()).exists());
    }
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
    for c in report.checks.iter().filter(|c| c.id != "FAIL-001") {
        assert!(c.outcome.is_skipped(), "{} {:?}", c.id, c.outcome);
    }
    // Without a fail-closed case FAIL-001 is not run: neither a skip nor a pass, and the
    // report is not conformant.
    let fail = report.check("FAIL-001").unwrap();
    assert!(fail.outcome.is_not_run(), "{:?}", fail.outcome);
    assert_eq!(report.summary.passed, 0);
    assert_eq!(report.summary.skipped, 2);
    assert_eq!(report.summary.must_not_run, 1);
    assert!(!report.conformant());
    let tap = report.to_tap();
    assert_eq!(tap.matches("# SKIP").count(), 2, "{tap}");
    assert!(
        tap.contains("FAIL-001 [MUST]") && tap.contains("(not run)"),
        "{tap}"
    );
    assert!(tap.contains("outcome: not_run"), "{tap}");
}

/// A backend whose prepare() panics and whose launch() never returns.
struct Crashing {
    hang: bool,
}

impl agentdiff_backend_api::RuntimeBackend for Crashing {
    fn id(&self) -> &'static str {
        "conformance-crashing"
    }
    fn capabilities(
        &self,
        _o: &agentdiff_backend_api::BackendOptions,
    ) -> agentdiff_backend_api::Capabilities {
        agentdiff_backend_api::Capabilities::default()
    }
    async fn availability(
        &self,
        _o: &agentdiff_backend_api::BackendOptions,
    ) -> agentdiff_backend_api::Availability {
        agentdiff_backend_api::Availability::Ready {
            detail: "test".into(),
        }
    }
    fn prepare(
        &self,
        spec: &agentdiff_backend_api::LaunchSpec,
    ) -> agentdiff_backend_api::Result<agentdiff_backend_api::PreparedLaunch> {
        if self.hang {
            return TestBackend::reference().prepare(spec);
        }
        panic!("prepare exploded")
    }
    async fn launch(
        &self,
        _p: agentdiff_backend_api::PreparedLaunch,
        _c: agentdiff_backend_api::LaunchContext,
    ) -> agentdiff_backend_api::Result<Box<dyn agentdiff_backend_api::RunningCommand>> {
        std::future::pending().await
    }
    async fn cleanup_run(
        &self,
        _run: &str,
        _ids: &[agentdiff_backend_api::ProcessIdentity],
        _g: std::time::Duration,
    ) -> agentdiff_backend_api::CleanupReport {
        agentdiff_backend_api::CleanupReport::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_or_hanging_check_is_a_failure() {
    let report = run_suite(
        Arc::new(|| Box::new(Crashing { hang: false })),
        SuiteOptions {
            only: vec!["EXIT-001".into()],
            ..SuiteOptions::default()
        },
    )
    .await;
    let c = report.check("EXIT-001").unwrap();
    assert!(
        matches!(&c.outcome, agentdiff_conformance::Outcome::Failed { reason } if reason.contains("crashed") && reason.contains("prepare exploded")),
        "{:?}",
        c.outcome
    );
    let report = run_suite(
        Arc::new(|| Box::new(Crashing { hang: true })),
        SuiteOptions {
            only: vec!["EXIT-001".into()],
            check_timeout: std::time::Duration::from_secs(2),
            ..SuiteOptions::default()
        },
    )
    .await;
    let c = report.check("EXIT-001").unwrap();
    assert!(
        matches!(&c.outcome, agentdiff_conformance::Outcome::Failed { reason } if reason.contains("did not finish")),
        "{:?}",
        c.outcome
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unavailable_backend_skips_launching_checks_unless_real_backends_are_required() {
    let make = || -> Box<dyn agentdiff_backend_api::DynRuntimeBackend> {
        Box::new(TestBackend::wrapped(
            Some("/nonexistent/wrapper".into()),
            agentdiff_conformance::testing::honest_capabilities(),
        ))
    };
    let lenient = run_suite(
        Arc::new(make),
        SuiteOptions {
            only: vec!["AVAIL-".into(), "EXIT-001".into()],
            require_available: false,
            ..SuiteOptions::default()
        },
    )
    .await;
    assert!(lenient.check("AVAIL-001").unwrap().outcome.is_passed());
    assert!(lenient.check("EXIT-001").unwrap().outcome.is_skipped());
    let strict = run_suite(
        Arc::new(make),
        SuiteOptions {
            only: vec!["AVAIL-".into(), "EXIT-001".into()],
            require_available: true,
            ..SuiteOptions::default()
        },
    )
    .await;
    assert_eq!(strict.failed_ids(), vec!["AVAIL-001", "EXIT-001"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_storing_the_joined_command_line_fails_the_redaction_checks() {
    let report = run_suite(
        factory(TestBackend::leaky_evidence),
        SuiteOptions {
            only: vec!["EVID-".into(), "TXN-".into()],
            ..SuiteOptions::default()
        },
    )
    .await;
    println!("{}", report.to_tap());
    assert_eq!(report.failed_ids(), vec!["EVID-002", "TXN-001"]);
}

/// A backend whose evidence keeps only the root fails the daemon check with the daemon seen on
/// the host and missing from the evidence. The check's second attempt is only for a daemon the
/// host never saw (a loaded machine can miss one), so it cannot turn this failure into a pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_recording_only_its_root_fails_the_daemon_check() {
    let report = run_suite(
        factory(TestBackend::root_only),
        SuiteOptions {
            only: vec!["PROC-".into()],
            ..SuiteOptions::default()
        },
    )
    .await;
    println!("{}", report.to_tap());
    assert_eq!(report.failed_ids(), vec!["PROC-002"]);
    let check = report.check("PROC-002").unwrap();
    assert!(
        check.details["daemon_host_identity"]["pid"].is_u64(),
        "{:?}",
        check.details
    );
    assert!(
        matches!(&check.outcome, agentdiff_conformance::Outcome::Failed { reason } if reason.contains("is not among the recorded processes")),
        "{:?}",
        check.outcome
    );
    let attempts = check.details["attempts"].as_u64();
    assert!(matches!(attempts, Some(1 | 2)), "{:?}", check.details);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_leaking_the_host_environment_fails_the_environment_honesty_check() {
    let report = run_suite(
        factory(TestBackend::host_environment),
        SuiteOptions {
            only: vec!["HONEST-".into(), "EVID-003".into()],
            ..SuiteOptions::default()
        },
    )
    .await;
    println!("{}", report.to_tap());
    assert_eq!(report.failed_ids(), vec!["HONEST-ENV-001"]);
    let env = report.check("HONEST-ENV-001").unwrap();
    assert!(!env.details["probe"]["evidence"]["host_variables_leaked"]
        .as_array()
        .unwrap()
        .is_empty());
}

/// A backend that says it holds the start but starts the command at once would let the
/// command's first writes land before the before-capture, where they are never recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_does_not_hold_the_start_it_declares_fails_the_hold_check() {
    let only = SuiteOptions {
        only: vec!["HOLD-001".into()],
        ..SuiteOptions::default()
    };
    let report = run_suite(factory(TestBackend::ignores_hold), only.clone()).await;
    println!("{}", report.to_tap());
    assert_eq!(report.failed_ids(), vec!["HOLD-001"]);
    let hold = report.check("HOLD-001").unwrap();
    assert_eq!(hold.details["ran_while_held"], true, "{:?}", hold.details);
    // A backend that does not declare it is not held, and the check says so.
    let report = run_suite(factory(TestBackend::reference), only).await;
    assert!(report.check("HOLD-001").unwrap().outcome.is_skipped());
}
