//! `agentdiff cleanup RUN` as a user runs it: identities checked before any signal, refusals, and
//! the exit codes of bad or malformed runs.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use agentdiff_backend_api::{ProcessIdentity, ProcessRecord, ProcessRelation, RunEvidence};
use agentdiff_run_fixtures as testing;
use agentdiff_store::seal::{launch_event_body, MacPurpose, SealAuthority, SealKey, StateDir};
use agentdiff_store::{Artifact, RuntimeDoc, Store};
use serde_json::{json, Value};

const NO_SUCH_RUN: i32 = 66;
const INVALID_CAPSULE: i32 = 67;
const CONFLICT: i32 = 68;

struct Sleeper(std::process::Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn sleeper() -> Sleeper {
    Sleeper(
        Command::new("sleep")
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

fn cleanup(root: &Path, run: &str, grace: &str) -> Output {
    super::agentdiff(
        root,
        &["cleanup", run, "--format", "json", "--grace-period", grace],
    )
}

/// Adds the artifacts every sealed capsule holds and seals it with the tests' key, so it
/// authenticates (cleanup acts on nothing else).
fn seal_authenticated(root: &Path, capsule: &agentdiff_store::Capsule) {
    let metadata = testing::metadata(capsule.id().as_str(), &root.display().to_string(), "local");
    capsule
        .write_artifact(Artifact::Metadata, &metadata)
        .unwrap();
    capsule
        .write_artifact(Artifact::Policy, &json!({}))
        .unwrap();
    capsule
        .write_artifact(Artifact::Result, &json!({"status": "passed"}))
        .unwrap();
    let state = StateDir::at(super::state_dir()).unwrap();
    let authority = SealAuthority::open(&state, root).unwrap();
    capsule.seal_with(&[], Some(&authority)).unwrap();
}

/// A sealed run of the local backend that recorded these processes.
fn capsule(root: &Path, run: &str, ids: &[ProcessIdentity]) -> PathBuf {
    let store = Store::open(root).unwrap();
    let capsule = store.create_run(Some(run)).unwrap();
    let processes = ids
        .iter()
        .map(|id| ProcessRecord {
            identity: id.clone(),
            ppid: 1,
            relation: ProcessRelation::Reparented,
            executable: "sleep".into(),
            first_seen_ms: 1,
            alive_after_root_exit: true,
            left_run_cgroup: None,
        })
        .collect();
    let evidence = RunEvidence {
        backend: "local".into(),
        processes,
        ..RunEvidence::default()
    };
    capsule
        .write_artifact(
            Artifact::Runtime,
            &RuntimeDoc::launched(&evidence, &[], None),
        )
        .unwrap();
    seal_authenticated(root, &capsule);
    capsule.dir().to_path_buf()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn reused_pid_in_a_copied_capsule_is_refused_and_the_process_survives() {
    let root = tempfile::tempdir().unwrap();
    let mut victim = sleeper();
    let mut id = agentdiff_process::read_identity(victim.0.id()).unwrap();
    // The stored start time differs: the pid belongs to a different process now.
    id.start_time_ticks += 3;
    let dir = capsule(root.path(), "run-1", std::slice::from_ref(&id));
    let out = cleanup(root.path(), "run-1", "0.1");
    assert_eq!(out.status.code(), Some(CONFLICT));
    let result = json_of(&out);
    assert_eq!(result["cleanup"]["records"][0]["outcome"], "pid_reused");
    assert_eq!(result["refused_or_escaped"], 1);
    assert!(
        victim.0.try_wait().unwrap().is_none(),
        "must not be signalled"
    );
    let written = fs::read_to_string(dir.join("cleanup-result.json")).unwrap();
    assert!(written.contains("pid_reused"));
    let mode = fs::metadata(dir.join("cleanup-result.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn matching_identity_is_terminated() {
    let root = tempfile::tempdir().unwrap();
    let mut victim = sleeper();
    let id = agentdiff_process::read_identity(victim.0.id()).unwrap();
    capsule(root.path(), "run-2", &[id]);
    let out = cleanup(root.path(), "run-2", "0.5");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let result = json_of(&out);
    assert_eq!(result["cleanup"]["records"][0]["outcome"], "terminated");
    assert_eq!(result["refused_or_escaped"], 0);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(victim.0.wait().unwrap().signal(), Some(libc::SIGTERM));
}

#[test]
fn missing_run_symlinks_and_bad_ids_are_refused() {
    let root = tempfile::tempdir().unwrap();
    Store::open(root.path()).unwrap();
    assert_eq!(
        cleanup(root.path(), "nope", "0").status.code(),
        Some(NO_SUCH_RUN)
    );
    assert_eq!(
        cleanup(root.path(), "../etc", "0").status.code(),
        Some(NO_SUCH_RUN)
    );

    let elsewhere = tempfile::tempdir().unwrap();
    capsule(elsewhere.path(), "real", &[]);
    std::os::unix::fs::symlink(
        elsewhere.path().join(".agentdiff/runs/real"),
        root.path().join(".agentdiff/runs/link"),
    )
    .unwrap();
    let out = cleanup(root.path(), "link", "0");
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("symbolic link"),
        "{out:?}"
    );
}

#[test]
fn malformed_runtime_evidence_is_an_invalid_capsule() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("bad")).unwrap();
    capsule
        .write_artifact(
            Artifact::Runtime,
            &json!({"schema_version": 1, "launched": true, "backend": "local", "processes": [{}]}),
        )
        .unwrap();
    seal_authenticated(root.path(), &capsule);
    assert_eq!(
        cleanup(root.path(), "bad", "0").status.code(),
        Some(INVALID_CAPSULE)
    );
}

/// A run whose agentdiff died before runtime.json: the launched event may not point cleanup at a
/// directory that is not one of agentdiff's run cgroups.
#[test]
fn a_launched_event_naming_a_foreign_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("crashed")).unwrap();
    let metadata = testing::metadata("crashed", &root.path().display().to_string(), "local");
    capsule
        .write_artifact(Artifact::Metadata, &metadata)
        .unwrap();
    let victim_dir = tempfile::tempdir().unwrap();
    let foreign = victim_dir.path().join("agentdiff-1-0");
    fs::create_dir(&foreign).unwrap();
    // MAC'd with the tests' key, as agentdiff writes it: the cgroup check is what must refuse.
    let mut fields = json!({ "pid": 1, "cgroup": foreign.display().to_string() });
    let key = SealKey::load_or_create(&StateDir::at(super::state_dir()).unwrap()).unwrap();
    let body = launch_event_body("crashed", &fields);
    fields["mac"] = json!(key.mac(MacPurpose::LaunchEvent, &body));
    capsule.event("launched", fields).unwrap();
    let out = cleanup(root.path(), "crashed", "0");
    assert_eq!(out.status.code(), Some(INVALID_CAPSULE), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not an agentdiff run cgroup"),
        "{out:?}"
    );
    assert!(foreign.exists(), "a refused directory is never removed");
}
