//! Table tests of the decision step: literal manifests and evidence in, `RunResult` out; nothing
//! is launched, scanned or written. At the end, whole transactions with a fake backend (what a
//! backend that fails after launch leaves on record).

use std::collections::BTreeMap;
use std::ffi::OsStr;

use super::decide::{self, Evidence, RunFrame};
use super::{Refusal, Status};
use agentdiff_backend_api::{
    BackendError, CleanupOutcome, CleanupRecord, ExitInfo, FailureKind, PortRecord, ProcessRecord,
    ProcessRelation, RunEvidence,
};
use agentdiff_policy::{Action, Decision, Policy};
use agentdiff_process::ProcessIdentity;
use agentdiff_scan::{BackupSkip, BackupState, Entry, EntryKind, Manifest, Unsupported};

const POLICY: &str = "version: 1
filesystem:
  allow_write: [src/**]
  review: [docs/**]
  deny: [.env]
  default: review
process:
  review: [curl]
  default: allow
";

fn policy(extra: &str) -> Policy {
    Policy::from_yaml_or_json(&format!("{POLICY}{extra}"), "test.yaml").unwrap()
}

fn frame() -> RunFrame {
    RunFrame {
        run_id: "r1".into(),
        task: Some("task".into()),
        started_at: "2026-01-01T00:00:00.000Z".into(),
        finished_at: "2026-01-01T00:00:01.000Z".into(),
        duration_ms: 1000,
    }
}

fn file(sha: &str, backup: BackupState) -> Entry {
    Entry {
        kind: EntryKind::File,
        size: 1,
        mode: 0o644,
        mtime_ns: 1,
        ctime_ns: 1,
        dev: 1,
        ino: sha.len() as u64,
        nlink: 1,
        sha256: Some(sha.repeat(64 / sha.len())),
        symlink_target: None,
        backup,
    }
}

fn dir() -> Entry {
    Entry {
        kind: EntryKind::Directory,
        sha256: None,
        backup: BackupState::NotApplicable,
        ..file("d", BackupState::NotApplicable)
    }
}

fn manifest(entries: &[(&str, Entry)]) -> Manifest {
    Manifest {
        schema_version: 1,
        root: "/p".into(),
        ignore_lines: Vec::new(),
        entries: entries
            .iter()
            .map(|(p, e)| ((*p).to_string(), e.clone()))
            .collect::<BTreeMap<_, _>>(),
        unsupported: Vec::new(),
        excluded: Vec::new(),
        excluded_programs: None,
        git_layouts: Vec::new(),
        stats: Default::default(),
    }
}

fn exited(code: i32) -> RunEvidence {
    RunEvidence {
        backend: "test".into(),
        enforcement: agentdiff_backend_api::Enforcement::None,
        tracking: agentdiff_backend_api::Tracking::SubreaperProcPoll,
        exit: ExitInfo {
            code: Some(code),
            ..ExitInfo::default()
        },
        ..RunEvidence::default()
    }
}

fn identity(pid: u32) -> ProcessIdentity {
    ProcessIdentity {
        pid,
        start_time_ticks: 1,
        boot_id: "b".into(),
    }
}

fn command(p: &Policy, argv0: &str) -> Decision {
    p.decide_command(OsStr::new(argv0))
}

/// One decision case: the tree before and after, how the command ended, what was decided.
struct Case {
    name: &'static str,
    policy_extra: &'static str,
    argv0: &'static str,
    before: Manifest,
    after: Manifest,
    run: RunEvidence,
    private_workspace: bool,
    tampered: Vec<agentdiff_store::TamperFinding>,
}

impl Case {
    fn new(name: &'static str, before: Manifest, after: Manifest) -> Case {
        Case {
            name,
            policy_extra: "",
            argv0: "true",
            before,
            after,
            run: exited(0),
            private_workspace: false,
            tampered: Vec::new(),
        }
    }

    fn decide(&self) -> super::RunResult {
        let policy = policy(self.policy_extra);
        let command = command(&policy, self.argv0);
        let comparison = agentdiff_scan::compare(&self.before, &self.after);
        let ev = Evidence {
            policy: &policy,
            command_decision: &command,
            before: &self.before,
            after: &self.after,
            comparison: &comparison,
            run: &self.run,
            private_workspace: self.private_workspace,
            verified_controls: &[],
            capsule_tampered: &self.tampered,
            network: None,
            git_dirs: &[],
        };
        decide::decide(&ev, frame())
    }
}

/// The decision of a command `true` that exited 0, under `policy_text`, for `comparison`.
fn decide_clean_exit(
    policy_text: &str,
    before: &Manifest,
    after: &Manifest,
    comparison: &agentdiff_scan::Comparison,
) -> super::RunResult {
    let policy = Policy::from_yaml_or_json(policy_text, "test.yaml").unwrap();
    let case = Case::new("clean exit", before.clone(), after.clone());
    let command = command(&policy, case.argv0);
    let ev = Evidence {
        policy: &policy,
        command_decision: &command,
        before,
        after,
        comparison,
        run: &case.run,
        private_workspace: false,
        verified_controls: &[],
        capsule_tampered: &[],
        network: None,
        git_dirs: &[],
    };
    decide::decide(&ev, frame())
}

fn stored() -> BackupState {
    BackupState::Stored
}

#[test]
fn status_and_safety_outcome_follow_the_evidence() {
    let src = || manifest(&[("src/a.rs", file("a", stored()))]);
    let mut cases = vec![
        (
            Case::new("nothing changed", src(), src()),
            Status::Passed,
            Action::Allow,
        ),
        (
            Case::new(
                "allowed write",
                src(),
                manifest(&[("src/a.rs", file("b", BackupState::NotRequested))]),
            ),
            Status::Passed,
            Action::Allow,
        ),
        (
            Case::new(
                "reviewed creation",
                src(),
                manifest(&[
                    ("src/a.rs", file("a", stored())),
                    ("docs/x.md", file("c", BackupState::NotRequested)),
                ]),
            ),
            Status::Review,
            Action::Review,
        ),
        (
            Case::new(
                "denied and reviewed: deny wins",
                src(),
                manifest(&[
                    ("src/a.rs", file("a", stored())),
                    ("docs/x.md", file("c", BackupState::NotRequested)),
                    (".env", file("e", BackupState::NotRequested)),
                ]),
            ),
            Status::Denied,
            Action::Deny,
        ),
        (
            Case::new(
                "denied deletion",
                manifest(&[(".env", file("e", stored()))]),
                manifest(&[]),
            ),
            Status::Denied,
            Action::Deny,
        ),
    ];
    let mut reviewed_command = Case::new("command under review", src(), src());
    reviewed_command.argv0 = "/usr/bin/curl";
    cases.push((reviewed_command, Status::Review, Action::Review));

    let mut port_error = Case::new("port observation failed", src(), src());
    port_error.run.ports.errors.push("no /proc/net".into());
    cases.push((port_error, Status::Review, Action::Review));

    let mut backend_warning = Case::new("backend warning", src(), src());
    backend_warning
        .run
        .warnings
        .push("tracking degraded".into());
    cases.push((backend_warning, Status::Review, Action::Review));

    let mut cleanup_error = Case::new("cleanup error", src(), src());
    cleanup_error
        .run
        .cleanup
        .errors
        .push("could not kill".into());
    cases.push((cleanup_error, Status::Review, Action::Review));

    let mut unsupported = Case::new("fifo appeared", src(), src());
    unsupported.after.unsupported.push(Unsupported {
        path: "pipe".into(),
        kind: "fifo".into(),
        reason: "not a regular file".into(),
    });
    cases.push((unsupported, Status::Review, Action::Review));

    let mut failed_with_deny = Case::new(
        "non-zero exit outranks deny",
        src(),
        manifest(&[
            ("src/a.rs", file("a", stored())),
            (".env", file("e", BackupState::NotRequested)),
        ]),
    );
    failed_with_deny.run = exited(3);
    cases.push((failed_with_deny, Status::Failed, Action::Deny));

    for (case, status, safety) in cases {
        let result = case.decide();
        assert_eq!(
            (result.status, result.safety_outcome),
            (status, safety),
            "case `{}`: {:?}",
            case.name,
            result.observation_warnings
        );
        assert_eq!(result.run_id, "r1", "case `{}`", case.name);
        assert_eq!(result.exit_code, case.run.exit.code, "case `{}`", case.name);
    }
}

#[test]
fn capsule_tampering_denies_an_otherwise_clean_run() {
    let tree = || manifest(&[("a.txt", file("aa", stored()))]);
    let mut case = Case::new("tampered", tree(), tree());
    case.tampered = vec![agentdiff_store::TamperFinding {
        path: "runs/r/before.json".into(),
        change: "modified".into(),
        detail: "changed".into(),
        object: None,
    }];
    let r = case.decide();
    assert_eq!(r.status, Status::Denied);
    assert_eq!(r.safety_outcome, Action::Deny);
    assert_eq!(r.capsule_tampered, case.tampered);
    let clean = Case::new("clean", tree(), tree()).decide();
    assert_eq!(clean.status, Status::Passed);
    assert!(clean.capsule_tampered.is_empty());
}

#[test]
fn exit_maps_to_status_by_precedence() {
    let exit = |code: Option<i32>, signal, timed_out, interrupted_by| ExitInfo {
        code,
        signal,
        timed_out,
        interrupted_by,
        duration_ms: 0,
    };
    let launch_failed = FailureKind::LaunchFailed {
        message: "not found".into(),
    };
    let wrapper_failed = FailureKind::WrapperSetupFailed {
        message: "bwrap".into(),
    };
    let table: Vec<(&str, ExitInfo, Option<&FailureKind>, Action, Status)> = vec![
        (
            "clean",
            exit(Some(0), None, false, None),
            None,
            Action::Allow,
            Status::Passed,
        ),
        (
            "review",
            exit(Some(0), None, false, None),
            None,
            Action::Review,
            Status::Review,
        ),
        (
            "deny",
            exit(Some(0), None, false, None),
            None,
            Action::Deny,
            Status::Denied,
        ),
        (
            "non-zero",
            exit(Some(1), None, false, None),
            None,
            Action::Allow,
            Status::Failed,
        ),
        (
            "signalled",
            exit(None, Some(9), false, None),
            None,
            Action::Allow,
            Status::Failed,
        ),
        (
            "launch failed",
            exit(Some(0), None, false, None),
            Some(&launch_failed),
            Action::Allow,
            Status::Failed,
        ),
        (
            "wrapper failed",
            exit(Some(0), None, false, None),
            Some(&wrapper_failed),
            Action::Deny,
            Status::Failed,
        ),
        (
            "timed out",
            exit(None, Some(15), true, None),
            None,
            Action::Deny,
            Status::TimedOut,
        ),
        (
            "interrupted beats timeout",
            exit(None, Some(15), true, Some(2)),
            None,
            Action::Allow,
            Status::Terminated,
        ),
        (
            "interrupted after a clean exit",
            exit(Some(0), None, false, Some(15)),
            None,
            Action::Allow,
            Status::Terminated,
        ),
    ];
    for (name, exit, failure, safety, want) in table {
        assert_eq!(
            decide::status(&exit, failure, safety),
            want,
            "case `{name}`"
        );
    }
}

#[test]
fn failures_become_the_execution_error() {
    let mut case = Case::new("wrapper", manifest(&[]), manifest(&[]));
    case.run.failure = Some(FailureKind::WrapperSetupFailed {
        message: "no userns".into(),
    });
    let result = case.decide();
    assert_eq!(result.status, Status::Failed);
    assert_eq!(
        result.execution_error.as_deref(),
        Some("the wrapper failed before the command started: no userns")
    );
    let runtime = result.runtime.unwrap();
    assert_eq!(runtime.backend, "test");
    assert_eq!(
        runtime.tracking,
        agentdiff_backend_api::Tracking::SubreaperProcPoll
    );
}

#[test]
fn limits_are_review_findings_with_observed_values() {
    let before = manifest(&[
        ("src/a.rs", file("a", stored())),
        ("src/b.rs", file("b", stored())),
    ]);
    let after = manifest(&[
        ("src/a.rs", file("c", BackupState::NotRequested)),
        ("src/n1.rs", file("d", BackupState::NotRequested)),
        ("src/n2.rs", file("e", BackupState::NotRequested)),
        ("src/dir", dir()),
    ]);
    let mut case = Case::new("limits", before, after);
    case.policy_extra = "limits:
  files_changed: 3
  files_deleted: 0
  processes_spawned: 1
  duration_seconds: 2
";
    // Three processes: the root and two children (two spawned, one over the limit).
    for (pid, relation) in [
        (10, ProcessRelation::Root),
        (11, ProcessRelation::Descendant),
        (12, ProcessRelation::Reparented),
    ] {
        case.run.processes.push(ProcessRecord {
            identity: identity(pid),
            ppid: 1,
            relation,
            executable: "sh".into(),
            first_seen_ms: 0,
            alive_after_root_exit: false,
            left_run_cgroup: None,
        });
    }
    case.run.exit.duration_ms = 2999;
    let result = case.decide();
    let got: Vec<(&str, u64, u64)> = result
        .limit_violations
        .iter()
        .map(|v| (v.limit.as_str(), v.limit_value, v.observed))
        .collect();
    // The created directory is a change but not a file: 4 files changed, not 5; 2999 ms is 2 s,
    // which is not over a 2 s limit.
    assert_eq!(
        got,
        vec![
            ("files_changed", 3, 4),
            ("files_deleted", 0, 1),
            ("processes_spawned", 1, 2),
        ]
    );
    assert_eq!(result.changes.len(), 5);
    assert_eq!(
        (result.status, result.safety_outcome),
        (Status::Review, Action::Review)
    );
    assert!(result.blast_radius.score > 0);

    case.run.exit.duration_ms = 3000;
    let result = case.decide();
    assert!(result
        .limit_violations
        .iter()
        .any(|v| v.limit == "duration_seconds" && v.observed == 3));
}

#[test]
fn limits_within_budget_leave_an_allowed_run_passed() {
    let mut case = Case::new(
        "within",
        manifest(&[]),
        manifest(&[("src/a.rs", file("a", BackupState::NotRequested))]),
    );
    case.policy_extra = "limits:\n  files_changed: 1\n  files_deleted: 0\n";
    let result = case.decide();
    assert!(result.limit_violations.is_empty());
    assert_eq!(result.status, Status::Passed);
}

#[test]
fn a_process_that_left_the_run_cgroup_denies_an_otherwise_clean_run() {
    let m = manifest(&[("a.rs", file("a", BackupState::NotRequested))]);
    let mut case = Case::new("escape", m.clone(), m);
    case.run.processes.push(ProcessRecord {
        identity: identity(11),
        ppid: 10,
        relation: ProcessRelation::Reparented,
        executable: "sleep".into(),
        first_seen_ms: 5,
        alive_after_root_exit: true,
        left_run_cgroup: Some("/".into()),
    });
    let result = case.decide();
    assert_eq!(
        (result.status, result.safety_outcome),
        (Status::Denied, Action::Deny)
    );
    assert_eq!(result.evidence_findings.len(), 1);
    assert_eq!(result.evidence_findings[0].kind, "left_run_cgroup");
    assert_eq!(result.evidence_findings[0].process, Some(identity(11)));
}

#[test]
fn summary_counts_each_kind_once() {
    let mut before = manifest(&[
        ("src/a.rs", file("a", stored())),
        ("docs/old.md", file("o", stored())),
        (
            "docs/big.bin",
            file(
                "g",
                BackupState::Skipped {
                    reason: BackupSkip::TooLarge,
                    detail: None,
                },
            ),
        ),
    ]);
    let mut after = manifest(&[
        ("src/a.rs", file("b", BackupState::NotRequested)),
        ("docs/new.md", file("n", BackupState::NotRequested)),
        (".env", file("e", BackupState::NotRequested)),
    ]);
    // The same unsupported entry on both sides counts once; a different one counts too.
    let sock = Unsupported {
        path: "run.sock".into(),
        kind: "socket".into(),
        reason: "socket".into(),
    };
    before.unsupported.push(sock.clone());
    after.unsupported.push(sock);
    after.unsupported.push(Unsupported {
        path: "p".into(),
        kind: "fifo".into(),
        reason: "fifo".into(),
    });
    let mut case = Case::new("summary", before, after);
    case.run.cleanup.records = vec![
        CleanupRecord {
            identity: identity(20),
            executable: "sleep".into(),
            outcome: CleanupOutcome::Killed,
            detail: None,
        },
        CleanupRecord {
            identity: identity(21),
            executable: "sh".into(),
            outcome: CleanupOutcome::AlreadyExited,
            detail: None,
        },
    ];
    case.run.ports.opened.push(PortRecord {
        protocol: "tcp".into(),
        address: "127.0.0.1".into(),
        port: 8080,
        inode: 1,
        attributed: true,
        owner: Some(identity(20)),
    });
    let result = case.decide();
    let s = &result.summary;
    // src/a.rs allowed; docs/new.md, docs/old.md, docs/big.bin reviewed; .env denied.
    assert_eq!((s.expected, s.unexpected, s.protected), (1, 3, 1));
    // Reversible: src/a.rs and docs/old.md (backed up), docs/new.md and .env (created);
    // docs/big.bin has no backup.
    assert_eq!(s.reversible, 4);
    assert_eq!(s.leftover_processes, 1);
    assert_eq!(s.opened_ports, 1);
    assert_eq!(s.unsupported_entries, 2);
    assert!(result.recovery_available);
    let big = result
        .changes
        .iter()
        .find(|c| c.path == "docs/big.bin")
        .unwrap();
    assert!(!big.reversible);
    assert!(
        big.recovery_reason.contains("larger than"),
        "{}",
        big.recovery_reason
    );
}

#[test]
fn recovery_needs_rollback_enabled_and_a_host_tree() {
    let before = || manifest(&[("src/a.rs", file("a", stored()))]);
    let after = || manifest(&[("src/a.rs", file("b", BackupState::NotRequested))]);
    let mut disabled = Case::new("rollback disabled", before(), after());
    disabled.policy_extra = "rollback:\n  enabled: false\n";
    let mut private = Case::new("private workspace", before(), after());
    private.private_workspace = true;
    let enabled = Case::new("rollback enabled", before(), after());
    for (case, reversible, available) in [
        (disabled, 1, false),
        (private, 0, false),
        (enabled, 1, true),
    ] {
        let result = case.decide();
        assert_eq!(
            (result.summary.reversible, result.recovery_available),
            (reversible, available),
            "case `{}`",
            case.name
        );
    }
}

#[test]
fn refused_launches_map_to_status_and_refusal() {
    let b = || "x".to_string();
    let table = [
        (
            BackendError::Unavailable {
                backend: b(),
                reason: "no srt".into(),
                remedy: "install it".into(),
            },
            Status::Error,
            Refusal::BackendUnavailable,
            "runtime backend `x` is unavailable: no srt; install it",
        ),
        (
            BackendError::InvalidRequest {
                backend: b(),
                message: "bad option".into(),
            },
            Status::Error,
            Refusal::InvalidRequest,
            "invalid request for runtime backend `x`: bad option",
        ),
        (
            BackendError::Launch {
                backend: b(),
                message: "ENOENT".into(),
            },
            Status::Failed,
            Refusal::LaunchFailed,
            "the command could not be launched: ENOENT",
        ),
        (
            BackendError::Runtime {
                backend: b(),
                message: "lost".into(),
            },
            Status::Error,
            Refusal::Internal,
            "runtime backend `x` failed while the command ran: lost",
        ),
    ];
    for (err, status, refusal, message) in table {
        let got = decide::refused_launch(&err);
        assert_eq!(
            (got.status, got.refusal, got.message.as_str()),
            (status, refusal, message)
        );
    }
}

#[test]
fn runs_that_never_started_never_read_as_clean() {
    let policy = policy("");
    let decision = command(&policy, "rm");
    for (status, safety) in [
        (Status::Blocked, Action::Deny),
        (Status::Error, Action::Review),
        (Status::Failed, Action::Review),
    ] {
        let result = decide::not_run(&decision, status, Some("why".into()), frame());
        assert_eq!((result.status, result.safety_outcome), (status, safety));
        assert!(result.changes.is_empty() && result.runtime.is_none());
        assert!(!result.recovery_available);
        assert_eq!(result.execution_error.as_deref(), Some("why"));
        assert_eq!(result.duration_ms, 1000);
    }
}

#[test]
fn uncaptured_entries_where_the_policy_denies_are_denied() {
    let policy = "version: 1\nfilesystem:\n  deny: [\".git/**\", \"**/*.pem\", \"ci/run\"]\n  default: allow\n";
    let decide_with = |path: &str, kind: &str| {
        let before = manifest(&[("src/a.rs", file("a", stored()))]);
        let mut after = before.clone();
        after.unsupported.push(Unsupported {
            path: path.into(),
            kind: kind.into(),
            reason: "test".into(),
        });
        let comparison = agentdiff_scan::compare(&before, &after);
        decide_clean_exit(policy, &before, &after, &comparison)
    };
    // Undecodable names and special files under denied paths: the name itself cannot be judged
    // (`\xff...` reads as an absolute path once `\` is a separator), so the ancestors and the
    // U+FFFD reading decide.
    for (path, kind) in [
        (".git/hooks/\\xffpost-commit", "non_utf8_name"),
        (".git/hooks/pre-commit", "fifo"),
        ("\\xffid.pem", "non_utf8_name"),
        ("keys/a\\xff.pem", "non_utf8_name"),
        (".git/\\xff", "non_utf8_name"),
        ("ci/run", "socket"),
    ] {
        let r = decide_with(path, kind);
        assert_eq!(r.safety_outcome, Action::Deny, "{path}: {r:#?}");
        let f = r
            .evidence_findings
            .iter()
            .find(|f| f.kind == "uncaptured_denied")
            .unwrap_or_else(|| panic!("{path}: {:?}", r.evidence_findings));
        assert!(f.detail.contains(kind), "{}", f.detail);
    }
    // Elsewhere it stays a review warning, not a denial.
    for (path, kind) in [
        ("src/\\xffa.rs", "non_utf8_name"),
        ("\\xff", "non_utf8_name"),
        ("tmp/pipe", "fifo"),
        ("a\\x.pe", "non_utf8_name"),
    ] {
        let r = decide_with(path, kind);
        assert_eq!(r.safety_outcome, Action::Review, "{path}: {r:#?}");
        assert!(
            r.evidence_findings.is_empty(),
            "{path}: {:?}",
            r.evidence_findings
        );
        assert!(!r.observation_warnings.is_empty(), "{path}");
    }
}

#[test]
fn an_incomplete_comparison_fails_closed_and_still_lists_denied_writes() {
    // The stored trees, compared as a run does: the command planted a hook and changed a file,
    // then destroyed the before root tree it could reach in the store.
    let tmp = tempfile::tempdir().unwrap();
    let store = agentdiff_store::Store::open(tmp.path()).unwrap();
    let capsule = store.create_run(Some("r1")).unwrap();
    let objects = store.objects();
    let before = manifest(&[
        (".git", dir()),
        (".git/hooks", dir()),
        ("src", dir()),
        ("src/a.rs", file("a", stored())),
    ]);
    let mut after = before.clone();
    after
        .entries
        .insert(".git/hooks/post-checkout".into(), file("e", stored()));
    after.entries.insert("src/a.rs".into(), file("b", stored()));
    let b_root = capsule
        .write_manifest(agentdiff_store::Artifact::Before, &before, objects)
        .unwrap();
    let a_root = capsule
        .write_manifest(agentdiff_store::Artifact::After, &after, objects)
        .unwrap();
    std::fs::write(objects.object_path(&b_root).unwrap(), b"{}").unwrap();
    objects.forget_verified();
    let comparison = agentdiff_scan::compare_trees(&before, &b_root, &after, &a_root, objects);
    assert!(!comparison.incomplete.is_empty());

    let policy = "version: 1\nfilesystem:\n  deny: [\".git/**\"]\n  default: allow\n";
    let r = decide_clean_exit(policy, &before, &after, &comparison);
    assert_eq!(r.safety_outcome, Action::Deny, "{r:#?}");
    assert_eq!(r.status, Status::Denied);
    assert!(r
        .evidence_findings
        .iter()
        .any(|f| f.kind == "comparison_incomplete" && f.action == Action::Deny));
    let hook = r
        .changes
        .iter()
        .find(|c| c.path == ".git/hooks/post-checkout")
        .unwrap_or_else(|| panic!("{:?}", r.changes));
    assert_eq!(hook.decision, Action::Deny);
    assert!(
        !hook.reversible,
        "an unverified entry is never rolled back blindly"
    );
    assert!(r.changes.iter().any(|c| c.path == "src/a.rs"));
}

#[test]
fn a_before_tree_lost_everywhere_is_recorded_unreadable_and_the_capsule_still_verifies() {
    use agentdiff_scan::TreeSource;
    use agentdiff_store::Artifact;
    let tmp = tempfile::tempdir().unwrap();
    let store = agentdiff_store::Store::open(tmp.path()).unwrap();
    let capsule = store.create_run(Some("r1")).unwrap();
    let objects = store.objects();
    let backed = |content: &[u8]| Entry {
        sha256: Some(objects.put_bytes(content).unwrap()),
        ..file("a", stored())
    };
    let (a, f) = (backed(b"a\n"), backed(b"f\n"));
    let a_hex = a.sha256.clone().unwrap();
    let before = manifest(&[("a.txt", a), ("d", dir()), ("d/f", f)]);
    let root = capsule
        .write_manifest(Artifact::Before, &before, objects)
        .unwrap();
    let captured = super::capture::Captured {
        manifest: Manifest {
            entries: BTreeMap::new(),
            ..before.clone()
        },
        root_tree: root.clone(),
        failed_backups: Default::default(),
        // No private copy: as if it had been destroyed too.
        spool: None,
        digests: None,
    };
    let snapshot = store.snapshot(&[]).unwrap();
    // The command deletes a backup and destroys the tree of `d/` in the store.
    let d_tree = objects.tree(&root).unwrap().trees["d"].clone();
    std::fs::remove_file(objects.object_path(&a_hex).unwrap()).unwrap();
    std::fs::write(objects.object_path(&d_tree).unwrap(), b"{}").unwrap();

    let t = super::guard::after_command(&store, &capsule, &snapshot, &captured).unwrap();
    let why = t.unreadable.as_deref().unwrap();
    assert!(why.contains("d:"), "{why}");
    assert_eq!(t.added_unsupported.len(), 1);
    assert_eq!(t.added_unsupported[0].path, "d");
    let new_root = t.rewritten_root.unwrap();
    assert_ne!(new_root, root);
    // The rewritten manifest references only objects that exist and verify: the lost backup
    // was withdrawn, the lost tree left out.
    let refs = capsule
        .manifest_references(Artifact::Before, objects)
        .unwrap();
    assert!(refs.contains(&new_root));
    assert!(
        !refs.contains(&a_hex) && !refs.contains(&d_tree),
        "{refs:?}"
    );
    for hex in &refs {
        objects.verify_object(hex).unwrap();
    }

    // Compared with the after-state, what lies below `d/` is unverified, never a plain creation.
    let mut header = captured.manifest.clone();
    header.unsupported.extend(t.added_unsupported);
    let mut after = before.clone();
    after.entries.insert("d/new".into(), file("n", stored()));
    let a_root = capsule
        .write_manifest(Artifact::After, &after, objects)
        .unwrap();
    let c = agentdiff_scan::compare_trees(&header, &new_root, &after, &a_root, objects);
    let below: Vec<_> = c
        .changes
        .iter()
        .filter(|c| c.path.starts_with("d/"))
        .collect();
    assert_eq!(below.len(), 2, "{:?}", c.changes);
    assert!(below.iter().all(|c| c
        .unverified
        .as_deref()
        .is_some_and(|n| n.contains("ancestor d"))));
}

/// A backend whose command writes `.env`, leaves a `sleep` behind, and whose `wait` then fails,
/// as an external backend's does when the command kills its plugin.
mod losing_backend {
    use std::path::PathBuf;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use agentdiff_backend_api::{
        Availability, BackendError, BackendOptions, BoxFuture, Capabilities, CleanupReport,
        Enforcement, LaunchCommand, LaunchContext, LaunchSpec, PreparedLaunch, Result, RunEvidence,
        RunningCommand, RuntimeBackend,
    };
    use agentdiff_process::ProcessIdentity;

    pub struct Losing {
        /// Where the command writes the pid of the `sleep` it leaves behind.
        pub pidfile: PathBuf,
        /// The launched root, kept so the test can see how it ended.
        pub root: Arc<Mutex<Option<std::process::Child>>>,
    }

    impl RuntimeBackend for Losing {
        fn id(&self) -> &'static str {
            "losing"
        }
        fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
            Capabilities::default()
        }
        async fn availability(&self, _options: &BackendOptions) -> Availability {
            Availability::Ready {
                detail: "test double".into(),
            }
        }
        fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
            let command = LaunchCommand {
                program: spec.argv[0].clone(),
                args: spec.argv[1..].to_vec(),
                env: spec.env.clone(),
                cwd: spec.workdir.clone(),
            };
            Ok(PreparedLaunch::new(
                "losing",
                spec,
                command,
                Enforcement::None,
                (),
            ))
        }
        async fn launch(
            &self,
            prepared: PreparedLaunch,
            _ctx: LaunchContext,
        ) -> Result<Box<dyn RunningCommand>> {
            let script = format!(
                "echo SECRET=x > .env; sleep 300 & echo $! > {}; wait",
                self.pidfile.display()
            );
            let child = std::process::Command::new("sh")
                .args(["-c", &script])
                .current_dir(prepared.cwd())
                .spawn()
                .map_err(|e| BackendError::Launch {
                    backend: "losing".into(),
                    message: e.to_string(),
                })?;
            let pid = child.id();
            *self.root.lock().unwrap() = Some(child);
            // The command has written and forked before the backend fails.
            for _ in 0..500 {
                let written = std::fs::read_to_string(&self.pidfile).unwrap_or_default();
                if written.ends_with('\n') {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(Box::new(Lost { pid }))
        }
        async fn cleanup_run(
            &self,
            _run_id: &str,
            _ids: &[ProcessIdentity],
            _grace: Duration,
        ) -> CleanupReport {
            CleanupReport::default()
        }
    }

    struct Lost {
        pid: u32,
    }

    impl RunningCommand for Lost {
        fn pid(&self) -> Option<u32> {
            Some(self.pid)
        }
        fn wait(self: Box<Self>) -> BoxFuture<'static, Result<RunEvidence>> {
            Box::pin(async move {
                Err(BackendError::Runtime {
                    backend: "losing".into(),
                    message: "the plugin died before reporting the exit".into(),
                })
            })
        }
    }
}

/// The backend fails after the command ran (a plugin the command killed): the run is recorded as
/// launched, its `.env` write is captured and denied, the status is `failed` with the backend's
/// failure, and the processes the command left are ended by identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_fails_after_launch_still_records_and_classifies_the_changes() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::ExitStatusExt;
    use std::sync::{Arc, Mutex};
    let base = tempfile::tempdir().unwrap();
    let (proj, state) = (base.path().join("proj"), base.path().join("state"));
    std::fs::create_dir(&proj).unwrap();
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(proj.join("README"), "x\n").unwrap();
    let backend = losing_backend::Losing {
        pidfile: base.path().join("sleep.pid"),
        root: Arc::new(Mutex::new(None)),
    };
    let (_tx, interrupt) = tokio::sync::watch::channel(None);
    let req = super::RunRequest {
        root: proj.clone(),
        policy: agentdiff_policy::LoadedPolicy {
            policy: policy(""),
            source: agentdiff_policy::PolicySource::BuiltIn,
        },
        argv: vec!["sh".into()],
        task: None,
        timeout: None,
        run_id: Some("lost".into()),
        backend: &backend,
        options: Default::default(),
        stdio: agentdiff_backend_api::StdioMode::Inherit,
        interrupt,
        env_mode: None,
        env_pass: Vec::new(),
        grace: std::time::Duration::from_millis(200),
        poll_interval: std::time::Duration::from_millis(20),
        progress: None,
        verified_controls: Vec::new(),
        state_dir: Some(agentdiff_store::seal::StateDir::at(&state).unwrap()),
    };
    let outcome = super::run(req).await.unwrap();
    let r = &outcome.result;

    assert_eq!(outcome.refusal, None, "the command ran: no refusal");
    assert_eq!(r.status, Status::Failed, "{r:#?}");
    assert_eq!(r.safety_outcome, Action::Deny);
    let env = r.changes.iter().find(|c| c.path == ".env").expect(".env");
    assert_eq!(env.decision, Action::Deny);
    assert_eq!(r.summary.protected, 1);
    let rt = r
        .runtime
        .as_ref()
        .expect("runtime evidence of a launched run");
    assert_eq!(rt.exit.code, None, "how the command ended is unknown");
    assert!(
        matches!(&rt.failure, Some(FailureKind::BackendFailed { message }) if message.contains("plugin died")),
        "{:?}",
        rt.failure
    );
    assert!(r
        .execution_error
        .as_deref()
        .is_some_and(|e| e.contains("before it reported how the command ended")));

    // On record: launched, the failure, the after-state, and a seal.
    let capsule = agentdiff_store::Store::open(&proj)
        .unwrap()
        .open_run("lost")
        .unwrap();
    let events: Vec<String> = capsule
        .read_events()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"].as_str().map(str::to_string))
        .collect();
    for expected in ["launched", "backend_failed", "exited", "decided"] {
        assert!(
            events.iter().any(|e| e == expected),
            "{expected}: {events:?}"
        );
    }
    assert!(!events.iter().any(|e| e == "launch_refused"), "{events:?}");
    assert!(outcome.capsule_dir.join("after.json").exists());
    assert!(outcome.capsule_dir.join("integrity.json").exists());

    // The launched root and the `sleep` it left were ended, not left running.
    let mut root = backend.root.lock().unwrap().take().unwrap();
    let status = root.wait().unwrap();
    assert!(status.signal().is_some(), "the root was ended: {status:?}");
    let pid: u32 = std::fs::read_to_string(base.path().join("sleep.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let gone = (0..100).any(|_| {
        let ended = agentdiff_process::read_stat(pid).map_or(true, |s| s.is_zombie());
        if !ended {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        ended
    });
    assert!(gone, "the command's leftover sleep {pid} still runs");
}

/// A change below a git directory found before the run is decided as the same path below
/// `.git/` would be, whatever the directory is called; so is anything below a `.git` component
/// the command planted. Other paths keep their own decision.
#[test]
fn changes_below_any_git_directory_are_decided_as_git_metadata() {
    use super::classify::decide_with_git_dirs;
    let policy = Policy::builtin();
    let dirs = vec![".repo".to_string(), "sub/.git".to_string()];
    for path in [
        ".repo/hooks/pre-commit",
        ".repo/config",
        ".repo",
        "sub/.git",
        "x/.git",
    ] {
        let d = decide_with_git_dirs(&policy, path, &dirs);
        assert_eq!(d.action, Action::Deny, "{path}: {d:?}");
        assert_eq!(d.subject, path);
    }
    let without = decide_with_git_dirs(&policy, ".repo/hooks/pre-commit", &[]);
    assert_eq!(without.action, Action::Review, "{without:?}");
    let other = decide_with_git_dirs(&policy, ".repository/x", &dirs);
    assert_eq!(other.action, Action::Review, "{other:?}");
}

/// A project root the command turned into a bare repository (git uses it where there is no
/// `.git`): git's own names at the root are git metadata, the project's other paths are not.
#[test]
fn a_root_with_git_layout_makes_gits_own_names_there_git_metadata() {
    use super::classify::decide_with_git_dirs;
    let policy = Policy::builtin();
    let root = vec![String::new()];
    for path in ["config", "HEAD", "hooks/post-checkout", "refs/heads/main"] {
        let d = decide_with_git_dirs(&policy, path, &root);
        assert_eq!(d.action, Action::Deny, "{path}: {d:?}");
    }
    for path in ["src/main.rs", "configs/a", "README"] {
        let d = decide_with_git_dirs(&policy, path, &root);
        assert_eq!(d.action, Action::Review, "{path}: {d:?}");
    }
    let d = decide_with_git_dirs(&policy, "config", &[]);
    assert_eq!(d.action, Action::Review, "{d:?}");
}

/// A repository the command made under another name (a bare `docs/tools`) is git metadata as
/// soon as the after-scan shows its layout: denied, though no discovery before the run saw it.
/// Git metadata the sweep found in an excluded directory is denied as well, with its path.
#[test]
fn a_git_layout_in_either_scan_makes_changes_below_it_git_metadata() {
    let before = manifest(&[("docs", dir())]);
    let mut after = manifest(&[
        ("docs", dir()),
        ("docs/tools", dir()),
        ("docs/tools/HEAD", file("h", stored())),
        ("docs/tools/config", file("c", stored())),
        ("docs/readme", file("r", stored())),
    ]);
    after.git_layouts = vec!["docs/tools".into()];
    let git_denied = "version: 1\nfilesystem:\n  deny: ['.git/**', '**/.git/**']\n";
    let decide = |before: &Manifest, after: &Manifest| {
        let comparison = agentdiff_scan::compare(before, after);
        decide_clean_exit(git_denied, before, after, &comparison)
    };
    let r = decide(&before, &after);
    let action = |p: &str| r.changes.iter().find(|c| c.path == p).unwrap().decision;
    assert_eq!(action("docs/tools"), Action::Deny);
    assert_eq!(action("docs/tools/config"), Action::Deny);
    assert_eq!(action("docs/readme"), Action::Review);
    assert_eq!(r.safety_outcome, Action::Deny);

    let sweep = |programs: Vec<agentdiff_scan::programs::Program>, layouts: Vec<String>| {
        agentdiff_scan::programs::ProgramSweep {
            programs,
            entries_seen: 1,
            incomplete: Vec::new(),
            git_layouts: layouts,
        }
    };
    let program = |path: &str| agentdiff_scan::programs::Program {
        path: path.into(),
        kind: EntryKind::File,
        reason: agentdiff_scan::programs::ProgramReason::GitMetadata,
        size: 1,
        mode: 0o644,
        mtime_ns: 1,
        ctime_ns: 1,
        dev: 1,
        ino: 1,
        symlink_target: None,
    };
    let mut before = manifest(&[]);
    before.excluded_programs = Some(sweep(vec![program("node_modules/dep/.git/config")], vec![]));
    let mut after = before.clone();
    after.excluded_programs = Some(sweep(
        vec![
            program("build/b/config"),
            program("node_modules/dep/.git/config"),
        ],
        vec!["build/b".into()],
    ));
    after.git_layouts = vec!["build/b".into()];
    let r = decide(&before, &after);
    let findings: Vec<(&str, Action)> = r
        .evidence_findings
        .iter()
        .map(|f| (f.detail.split(':').next().unwrap(), f.action))
        .collect();
    // The untouched repository in node_modules is no finding.
    assert_eq!(findings, vec![("build/b", Action::Deny)], "{r:#?}");
    assert!(
        r.evidence_findings[0].detail.contains("new build/b/config"),
        "{r:#?}"
    );
    assert_eq!(r.status, Status::Denied);
}
