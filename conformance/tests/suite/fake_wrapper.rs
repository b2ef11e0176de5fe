//! The generic fake wrapper drives a wrapping test backend through every misbehaviour, and the
//! suite names each one by its check id.

use std::sync::Arc;

use agentdiff_backend_api::{BackendOptions, Capabilities, Level};
use agentdiff_conformance::fake_wrapper::{Behaviour, FakeWrapper};
use agentdiff_conformance::testing::{honest_capabilities, TestBackend};
use agentdiff_conformance::{run_suite, FailClosedCase, Report, SuiteOptions};

async fn wrapped(
    behaviour: Behaviour,
    caps: Capabilities,
    only: &[&str],
    fail_closed: Vec<FailClosedCase>,
) -> (Report, FakeWrapper, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let w = FakeWrapper::install(dir.path(), "fake-wrapper", behaviour).unwrap();
    let path = w.path().to_path_buf();
    let report = run_suite(
        Arc::new(move || Box::new(TestBackend::wrapped(Some(path.clone()), caps.clone()))),
        SuiteOptions {
            only: only.iter().map(|s| s.to_string()).collect(),
            fail_closed,
            ..SuiteOptions::default()
        },
    )
    .await;
    println!("{}", report.to_tap());
    (report, w, dir)
}

fn requested_fs() -> Capabilities {
    Capabilities {
        filesystem_writes: Level::Requested,
        ..honest_capabilities()
    }
}

fn missing_wrapper_case() -> FailClosedCase {
    let mut options = BackendOptions::new();
    options.push("wrapper", "/nonexistent/agentdiff-fake-wrapper");
    FailClosedCase {
        name: "wrapper missing".into(),
        options,
        factory: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_faithful_wrapper_passes_and_records_exact_argv() {
    let (report, w, _d) = wrapped(
        Behaviour::Run,
        requested_fs(),
        &[
            "ARGV-",
            "EXIT-",
            "STDIO-",
            "FAIL-",
            "LABEL-",
            "EVID-",
            "HONEST-FS",
        ],
        vec![missing_wrapper_case()],
    )
    .await;
    assert!(report.failed_ids().is_empty(), "{:?}", report.failed_ids());
    assert!(report.check("FAIL-001").unwrap().outcome.is_passed());
    // Labelled requested: the probe result is information, the check is a skip, never a pass.
    let fs = report.check("HONEST-FS-001").unwrap();
    assert!(fs.outcome.is_skipped());
    assert_eq!(fs.details["probe"]["verdict"], "not_enforced");
    // The wrapper saw `--` followed by the exact command.
    let calls = w.invocations().unwrap();
    let empty_case = calls
        .iter()
        .find(|c| c.command().iter().any(|a| a == "between"))
        .expect("the ARGV-004 invocation was recorded");
    let cmd = empty_case.command();
    assert_eq!(
        cmd[cmd.len() - 4..],
        ["", "between", "", ""].map(std::ffi::OsString::from)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_dropping_an_argument_fails_the_argv_checks() {
    let (report, _w, _d) = wrapped(
        Behaviour::DropLastArgument,
        requested_fs(),
        &["ARGV-"],
        vec![],
    )
    .await;
    assert_eq!(
        report.failed_ids(),
        vec!["ARGV-001", "ARGV-002", "ARGV-003", "ARGV-004", "ARGV-005", "ARGV-006"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_swallowing_the_exit_code_fails_the_exit_checks() {
    let (report, _w, _d) = wrapped(
        Behaviour::SwallowExitCode,
        requested_fs(),
        &["EXIT-"],
        vec![],
    )
    .await;
    assert_eq!(
        report.failed_ids(),
        vec!["EXIT-002", "EXIT-003", "EXIT-004"]
    );
    assert!(report.check("EXIT-001").unwrap().outcome.is_passed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrapper_pretending_to_sandbox_fails_the_honesty_check() {
    let claims = Capabilities {
        filesystem_writes: Level::Enforced,
        sandboxed: true,
        ..honest_capabilities()
    };
    let (report, _w, _d) = wrapped(
        Behaviour::PretendSandbox,
        claims,
        &["HONEST-", "LABEL-"],
        vec![],
    )
    .await;
    assert_eq!(report.failed_ids(), vec!["HONEST-FS-001"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusing_wrapper_never_passes_a_launching_check() {
    let (report, _w, _d) = wrapped(
        Behaviour::Refuse,
        requested_fs(),
        &["ARGV-001", "EXIT-001", "STDIO-001"],
        vec![],
    )
    .await;
    assert_eq!(
        report.failed_ids(),
        vec!["ARGV-001", "EXIT-001", "STDIO-001"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_check_fails_when_the_unusable_configuration_still_runs_the_command() {
    // A "broken" configuration that in fact works: the command runs, so the check must fail.
    let dir = tempfile::tempdir().unwrap();
    let working = FakeWrapper::install(dir.path(), "still-works", Behaviour::Run).unwrap();
    let mut options = BackendOptions::new();
    options.push("wrapper", working.path().to_str().unwrap());
    let case = FailClosedCase {
        name: "not really unusable".into(),
        options,
        factory: None,
    };
    let (report, _w, _d) = wrapped(Behaviour::Run, requested_fs(), &["FAIL-"], vec![case]).await;
    assert_eq!(report.failed_ids(), vec!["FAIL-001"]);
    // And a wrapper that refuses without running passes (refusal is failing closed).
    working.set_behaviour(Behaviour::FailSetup).unwrap();
    let mut options = BackendOptions::new();
    options.push("wrapper", working.path().to_str().unwrap());
    let case = FailClosedCase {
        name: "setup fails".into(),
        options,
        factory: None,
    };
    let (report, _w, _d) = wrapped(Behaviour::Run, requested_fs(), &["FAIL-"], vec![case]).await;
    assert!(
        report.check("FAIL-001").unwrap().outcome.is_passed(),
        "{:?}",
        report.check("FAIL-001")
    );
}
