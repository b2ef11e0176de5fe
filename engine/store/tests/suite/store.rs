//! Run store behaviour through the public API: layout, permissions, run ids, objects, seal and
//! tamper detection.

// The whole file is test code (helpers included), so the test allowances of clippy.toml apply.
#![cfg(test)]

use std::fs::{self, File};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agentdiff_store::{
    Artifact, Capsule, PutOutcome, RecoveryArtifact, Store, StoreError, VerifyReport,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    out
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A store with one run holding every transaction artifact and one backup object.
fn full_run(root: &Path, id: &str) -> (Store, Capsule, String) {
    let store = Store::open(root).unwrap();
    let capsule = store.create_run(Some(id)).unwrap();
    capsule
        .event("capsule_created", json!({ "run_id": id }))
        .unwrap();
    for (artifact, value) in [
        (
            Artifact::Metadata,
            json!({ "created_at": "2026-11-30T01:22:33.000Z" }),
        ),
        (Artifact::Policy, json!({ "rules": [] })),
        (Artifact::Before, json!({ "entries": ["a"] })),
        (Artifact::After, json!({ "entries": ["a", "b"] })),
        (Artifact::Runtime, json!({ "backend": "local" })),
        (Artifact::Result, json!({ "status": "passed" })),
    ] {
        capsule.write_artifact(artifact, &value).unwrap();
    }
    capsule
        .event("decided", json!({ "status": "passed" }))
        .unwrap();
    let object = store.objects().put_bytes(b"backup of a").unwrap();
    capsule.seal(std::slice::from_ref(&object)).unwrap();
    (store, capsule, object)
}

fn subjects(report: &VerifyReport) -> Vec<&str> {
    report.problems.iter().map(|p| p.subject.as_str()).collect()
}

const SEALED_NAMES: [&str; 7] = [
    "after.json",
    "before.json",
    "events.jsonl",
    "metadata.json",
    "policy.json",
    "result.json",
    "runtime.json",
];

#[test]
fn layout_is_private_and_ignored_by_git() {
    let root = tempfile::tempdir().unwrap();
    let (store, capsule, object) = full_run(root.path(), "r1");
    let base = root.path().join(".agentdiff");
    assert_eq!(store.dir(), base);
    assert_eq!(fs::read_to_string(base.join(".gitignore")).unwrap(), "*\n");
    for dir in [
        base.clone(),
        base.join("runs"),
        base.join("runs/r1"),
        base.join("objects"),
        base.join("objects/sha256"),
        base.join("objects/sha256").join(&object[..2]),
        base.join("objects/tmp"),
    ] {
        assert_eq!(mode(&dir), 0o700, "{}", dir.display());
    }
    for name in names(capsule.dir()) {
        assert_eq!(mode(&capsule.dir().join(&name)), 0o600, "{name}");
    }
    assert_eq!(mode(&store.objects().object_path(&object).unwrap()), 0o600);
    assert_eq!(
        store.objects().object_path(&object).unwrap(),
        base.join("objects/sha256")
            .join(&object[..2])
            .join(&object[2..])
    );
}

#[test]
fn atomic_writes_leave_no_temp_files() {
    let root = tempfile::tempdir().unwrap();
    let (_store, capsule, _) = full_run(root.path(), "r1");
    let mut expected: Vec<String> = SEALED_NAMES.iter().map(|s| s.to_string()).collect();
    expected.push("integrity.json".into());
    // The `sealed` event, logged after integrity.json is durable.
    expected.push("recovery-events.jsonl".into());
    expected.sort();
    assert_eq!(names(capsule.dir()), expected);
    assert!(names(&root.path().join(".agentdiff/objects/tmp")).is_empty());
}

#[test]
fn run_ids_are_validated_before_use() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let too_long = "x".repeat(129);
    for bad in [
        "",
        ".",
        "..",
        "../x",
        "a/b",
        "-leading",
        "a\0b",
        "a..b",
        too_long.as_str(),
    ] {
        let err = store.create_run(Some(bad)).unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidRunId { .. }),
            "{bad:?}: {err}"
        );
        assert!(matches!(
            store.open_run(bad),
            Err(StoreError::InvalidRunId { .. })
        ));
    }
    assert!(names(store.runs_dir()).is_empty());
    assert!(names(store.dir())
        .iter()
        .all(|n| [".gitignore", "objects", "runs"].contains(&n.as_str())));

    let ok = "x".repeat(128);
    store.create_run(Some(&ok)).unwrap();
    let err = store.create_run(Some(&ok)).unwrap_err();
    assert!(matches!(err, StoreError::RunExists { .. }), "{err}");
    assert!(err.to_string().contains("already exists"), "{err}");
}

#[test]
fn agentdiff_symlink_or_open_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), root.path().join(".agentdiff")).unwrap();
    for err in [
        Store::open(root.path()).unwrap_err(),
        Store::open_existing(root.path()).unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::UnsafeStoreDir { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
    }
    assert!(
        names(elsewhere.path()).is_empty(),
        "nothing written through the link"
    );

    let root = tempfile::tempdir().unwrap();
    Store::open(root.path()).unwrap();
    fs::set_permissions(
        root.path().join(".agentdiff"),
        fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let err = Store::open(root.path()).unwrap_err();
    assert!(err.to_string().contains("chmod 700"), "{err}");
}

#[test]
fn symlinked_run_directory_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), store.runs_dir().join("evil")).unwrap();
    assert!(matches!(
        store.open_run("evil"),
        Err(StoreError::UnsafeStoreDir { .. })
    ));
    let runs = store.list_runs().unwrap();
    assert_eq!(runs.len(), 1);
    assert!(runs[0].problem.is_some());
}

#[test]
fn objects_are_deduplicated_across_runs() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let src = root.path().join("file.txt");
    let content = vec![7u8; 100_000];
    fs::write(&src, &content).unwrap();
    let hex = sha(&content);
    let mut file = File::open(&src).unwrap();
    let objects = store.objects();
    assert!(!objects.contains(&hex));
    assert_eq!(
        objects
            .put_from_file(&mut file, &hex, content.len() as u64)
            .unwrap(),
        PutOutcome::Stored
    );
    let before = objects.list().unwrap();
    // A second run backing up the unchanged file stores no new bytes.
    let mut file = File::open(&src).unwrap();
    assert_eq!(
        objects
            .put_from_file(&mut file, &hex, content.len() as u64)
            .unwrap(),
        PutOutcome::AlreadyPresent
    );
    assert_eq!(objects.list().unwrap(), before);
    assert_eq!(before, vec![hex.clone()]);
    assert_eq!(
        objects.read_verified(&hex, content.len() as u64).unwrap(),
        content
    );
}

#[test]
fn put_with_wrong_expected_hash_stores_nothing() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let src = root.path().join("file.txt");
    fs::write(&src, b"changed after hashing").unwrap();
    let stale = sha(b"content when hashed");
    let mut file = File::open(&src).unwrap();
    let err = store
        .objects()
        .put_from_file(&mut file, &stale, 19)
        .unwrap_err();
    assert!(matches!(err, StoreError::ChangedDuringCopy { .. }), "{err}");
    assert!(!store.objects().contains(&stale));
    assert!(store.objects().list().unwrap().is_empty());
    assert!(names(&root.path().join(".agentdiff/objects/tmp")).is_empty());
}

#[test]
fn flipped_object_byte_is_detected_on_read_and_verify() {
    let root = tempfile::tempdir().unwrap();
    let (store, capsule, object) = full_run(root.path(), "r1");
    assert!(capsule.verify(store.objects()).unwrap().ok);
    flip_byte(&store.objects().object_path(&object).unwrap());
    let err = store.objects().read_verified(&object, 1 << 20).unwrap_err();
    assert!(matches!(err, StoreError::ObjectCorrupt { .. }));
    assert!(err.to_string().contains(&object), "{err}");
    let report = capsule.verify(store.objects()).unwrap();
    assert!(!report.ok);
    assert_eq!(subjects(&report), vec![format!("object {object}").as_str()]);

    store.objects().remove(&object).unwrap();
    let report = capsule.verify(store.objects()).unwrap();
    assert_eq!(subjects(&report), vec![format!("object {object}").as_str()]);
    assert!(report.problems[0].problem.contains("missing"), "{report:?}");
}

fn flip_byte(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x20;
    let perms = fs::metadata(path).unwrap().permissions();
    fs::write(path, &bytes).unwrap();
    fs::set_permissions(path, perms).unwrap();
}

#[test]
fn verify_names_each_tampered_artifact() {
    for name in SEALED_NAMES {
        let root = tempfile::tempdir().unwrap();
        let (store, capsule, _) = full_run(root.path(), "r1");
        let clean = capsule.verify(store.objects()).unwrap();
        assert!(clean.ok && clean.sealed, "{clean:?}");
        flip_byte(&capsule.dir().join(name));
        let report = capsule.verify(store.objects()).unwrap();
        assert!(report.sealed);
        assert!(!report.ok);
        assert_eq!(subjects(&report), vec![name], "{report:?}");
        assert!(report.problems[0]
            .problem
            .contains("changed since the seal"));
    }
}

#[test]
fn verify_reports_deleted_extra_and_symlinked_artifacts() {
    let root = tempfile::tempdir().unwrap();
    let (store, capsule, _) = full_run(root.path(), "r1");
    let dir = capsule.dir().to_path_buf();

    fs::remove_file(dir.join("runtime.json")).unwrap();
    fs::write(dir.join("notes.txt"), b"added later").unwrap();
    // Same bytes, but a symlink is not the sealed file.
    let outside = root.path().join("policy-copy.json");
    fs::copy(dir.join("policy.json"), &outside).unwrap();
    fs::remove_file(dir.join("policy.json")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("policy.json")).unwrap();

    let report = capsule.verify(store.objects()).unwrap();
    assert!(!report.ok);
    let mut got = subjects(&report);
    got.sort();
    assert_eq!(got, vec!["notes.txt", "policy.json", "runtime.json"]);
    let text = |s: &str| {
        report
            .problems
            .iter()
            .find(|p| p.subject == s)
            .unwrap()
            .problem
            .clone()
    };
    assert!(text("runtime.json").contains("missing"));
    assert!(text("policy.json").contains("symbolic link"));
    assert!(text("notes.txt").contains("unexpected"));
}

#[test]
fn unsealed_and_malformed_seals_fail_verification() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("open")).unwrap();
    capsule
        .write_artifact(Artifact::Result, &json!({"status": "passed"}))
        .unwrap();
    let report = capsule.verify(store.objects()).unwrap();
    assert!(!report.sealed && !report.ok);
    assert_eq!(subjects(&report), vec!["integrity.json"]);

    let (store, capsule, _) = full_run(root.path(), "r2");
    fs::write(capsule.dir().join("integrity.json"), b"{ not json").unwrap();
    let report = capsule.verify(store.objects()).unwrap();
    assert!(report.sealed && !report.ok);
    assert_eq!(subjects(&report), vec!["integrity.json"]);

    // A seal copied from another run does not verify this one.
    let (store, other, _) = full_run(root.path(), "r3");
    let (_, capsule, _) = full_run(root.path(), "r4");
    fs::copy(
        other.dir().join("integrity.json"),
        capsule.dir().join("integrity.json"),
    )
    .unwrap();
    let report = capsule.verify(store.objects()).unwrap();
    assert!(!report.ok);
    assert!(subjects(&report).contains(&"integrity.json"), "{report:?}");
}

#[test]
fn writes_after_seal_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let (store, capsule, _) = full_run(root.path(), "r1");
    let before = fs::read(capsule.dir().join("result.json")).unwrap();
    let err = capsule
        .write_artifact(Artifact::Result, &json!({"status": "denied"}))
        .unwrap_err();
    assert!(matches!(err, StoreError::Sealed { .. }), "{err}");
    assert!(err.to_string().contains("result.json"), "{err}");
    assert_eq!(fs::read(capsule.dir().join("result.json")).unwrap(), before);
    assert!(matches!(
        capsule.event("late", Value::Null),
        Err(StoreError::Sealed { .. })
    ));
    assert!(matches!(
        capsule.seal(&[]),
        Err(StoreError::AlreadySealed { .. })
    ));
    assert!(matches!(
        capsule.write_artifact(Artifact::Integrity, &json!({})),
        Err(StoreError::ReservedArtifact { .. })
    ));
    // A handle opened later sees the seal too.
    let reopened = store.open_run("r1").unwrap();
    assert!(reopened.is_sealed());
    assert!(matches!(
        reopened.write_artifact(Artifact::After, &json!({})),
        Err(StoreError::Sealed { .. })
    ));
    assert!(capsule.verify(store.objects()).unwrap().ok);
}

#[test]
fn recovery_artifacts_after_seal_keep_verification_ok() {
    let root = tempfile::tempdir().unwrap();
    let (store, capsule, _) = full_run(root.path(), "r1");
    capsule
        .write_recovery(
            RecoveryArtifact::RollbackResult,
            &json!({"restored": ["a"], "conflicts": []}),
        )
        .unwrap();
    capsule
        .write_recovery(RecoveryArtifact::CleanupResult, &json!({"killed": []}))
        .unwrap();
    capsule
        .write_recovery(
            RecoveryArtifact::parse("rollback-20261130T020000Z.json").unwrap(),
            &json!({"restored": ["a"]}),
        )
        .unwrap();
    capsule
        .recovery_event("rollback_started", json!({"paths": 1}))
        .unwrap();
    capsule
        .recovery_event("rollback_finished", Value::Null)
        .unwrap();
    let report = capsule.verify(store.objects()).unwrap();
    assert!(report.ok, "{report:?}");

    let events = capsule.read_recovery_events().unwrap();
    // `sealed` (logged by the seal itself), then the two rollback events.
    assert_eq!(events.len(), 3);
    assert_eq!(events[0]["event"], "sealed");
    assert_eq!(events[2]["seq"], 2);
    let result: Value = capsule
        .read_recovery(RecoveryArtifact::RollbackResult)
        .unwrap();
    assert_eq!(result["restored"][0], "a");
    assert!(matches!(
        RecoveryArtifact::parse("result.json"),
        Err(StoreError::InvalidArtifactName { .. })
    ));
    assert!(matches!(
        capsule.write_recovery(RecoveryArtifact::RecoveryEvents, &json!({})),
        Err(StoreError::ReservedArtifact { .. })
    ));
    // A symlink planted under a recovery name is still a problem.
    std::os::unix::fs::symlink("/etc/passwd", capsule.dir().join("cleanup-x.json")).unwrap();
    let report = capsule.verify(store.objects()).unwrap();
    assert_eq!(subjects(&report), vec!["cleanup-x.json"]);
}

#[test]
fn events_are_sequenced_timestamped_and_sealed_last() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("ev")).unwrap();
    capsule
        .event("capsule_created", json!({"run_id": "ev"}))
        .unwrap();
    capsule
        .event("before_captured", json!({"files": 3}))
        .unwrap();
    assert!(matches!(
        capsule.event("bad", json!({"seq": 9})),
        Err(StoreError::InvalidEvent(_))
    ));
    assert!(matches!(
        capsule.event("bad", json!([1])),
        Err(StoreError::InvalidEvent(_))
    ));
    // A second handle continues the sequence.
    let again = store.open_run("ev").unwrap();
    again.event("launched", json!({"pid": 42})).unwrap();
    again.seal(&[]).unwrap();

    let raw = fs::read_to_string(capsule.dir().join("events.jsonl")).unwrap();
    assert!(raw.ends_with('\n'));
    let events = capsule.read_events().unwrap();
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        vec!["capsule_created", "before_captured", "launched", "sealing"]
    );
    // `sealed` is logged only after integrity.json is durable, outside the sealed log.
    let after: Vec<String> = capsule
        .read_recovery_events()
        .unwrap()
        .iter()
        .map(|e| e["event"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(after, vec!["sealed"]);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["seq"], i as u64);
        let at = e["at"].as_str().unwrap();
        assert!(at.ends_with('Z') && at.len() == 24, "{at}");
    }
    assert_eq!(events[1]["files"], 3);
    assert_eq!(events[2]["pid"], 42);
}

#[test]
fn artifacts_read_back_and_malformed_json_names_the_artifact() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("rd")).unwrap();
    capsule
        .write_artifact(Artifact::Runtime, &json!({"backend": "local"}))
        .unwrap();
    let text = fs::read_to_string(capsule.dir().join("runtime.json")).unwrap();
    assert!(text.ends_with("}\n"), "{text:?}");
    let value = capsule.read_artifact_value(Artifact::Runtime).unwrap();
    assert_eq!(value["backend"], "local");

    fs::write(capsule.dir().join("after.json"), b"{\"truncated\": ").unwrap();
    let err = capsule.read_artifact_value(Artifact::After).unwrap_err();
    assert!(matches!(err, StoreError::MalformedArtifact { .. }));
    assert!(err.to_string().contains("after.json"), "{err}");

    let target: PathBuf = root.path().join("outside.json");
    fs::write(&target, b"{}").unwrap();
    std::os::unix::fs::symlink(&target, capsule.dir().join("before.json")).unwrap();
    assert!(matches!(
        capsule.read_artifact_value(Artifact::Before),
        Err(StoreError::NotRegularFile { .. })
    ));
    // Sealing refuses the symlinked artifact instead of hashing through it.
    assert!(matches!(
        capsule.seal(&[]),
        Err(StoreError::NotRegularFile { .. })
    ));
    assert!(!capsule.is_sealed());
}

#[test]
fn seal_refuses_unexpected_entries() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("x")).unwrap();
    capsule
        .write_artifact(Artifact::Result, &json!({}))
        .unwrap();
    fs::write(capsule.dir().join("dropped.sh"), b"#!/bin/sh").unwrap();
    let err = capsule.seal(&[]).unwrap_err();
    assert!(matches!(err, StoreError::UnexpectedEntry { .. }), "{err}");
    assert!(!capsule.is_sealed());
    assert!(!capsule.dir().join("events.jsonl").exists());
    assert!(matches!(
        capsule.seal(&["not-a-hash".to_string()]),
        Err(StoreError::InvalidObjectId { .. })
    ));
}

#[test]
fn seal_lists_artifacts_and_sorted_unique_objects() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let capsule = store.create_run(Some("s")).unwrap();
    capsule
        .write_artifact(Artifact::Result, &json!({}))
        .unwrap();
    let a = store.objects().put_bytes(b"a").unwrap();
    let b = store.objects().put_bytes(b"b").unwrap();
    let integrity = capsule.seal(&[b.clone(), a.clone(), b.clone()]).unwrap();
    let mut expected = vec![a, b];
    expected.sort();
    assert_eq!(integrity.objects, expected);
    assert_eq!(integrity.algorithm, "sha256");
    assert_eq!(integrity.run_id, "s");
    let listed: Vec<&str> = integrity.artifacts.keys().map(String::as_str).collect();
    assert_eq!(listed, vec!["events.jsonl", "result.json"]);
    assert_eq!(
        integrity.artifacts["result.json"],
        sha(&fs::read(capsule.dir().join("result.json")).unwrap())
    );
    assert_eq!(capsule.integrity().unwrap(), integrity);
}

/// A pass over several runs (`agentdiff runs`, `verify --all`) hashes shared objects once, on
/// several threads, but never carries a bad object over as checked: each run names it, in order.
#[test]
fn a_pass_over_runs_names_a_bad_shared_object_in_every_run() {
    use agentdiff_store::seal::VerifyContext;
    use agentdiff_store::ObjectsChecked;
    let root = tempfile::tempdir().unwrap();
    let (store, first, _) = full_run(root.path(), "r1");
    // Enough objects for the hashing to be spread over threads.
    let mut shared: Vec<String> = (0..600)
        .map(|i| {
            store
                .objects()
                .put_bytes(format!("object {i}").as_bytes())
                .unwrap()
        })
        .collect();
    shared.sort();
    // Two more runs with the first one's artifacts, both sealing the shared objects.
    let sealed_sharing = |id: &str| {
        let run = store.create_run(Some(id)).unwrap();
        // Events are the run's own log and the seal is made below.
        for artifact in Artifact::ALL
            .into_iter()
            .filter(|a| !matches!(a, Artifact::Events | Artifact::Integrity))
        {
            let value = first.read_artifact_value(artifact).unwrap();
            run.write_artifact(artifact, &value).unwrap();
        }
        run.seal(&shared).unwrap();
        run
    };
    let (second, third) = (sealed_sharing("r2"), sealed_sharing("r3"));
    let ctx = VerifyContext::default();
    let clean = ObjectsChecked::default();
    for run in [&second, &third] {
        let report = run.verify_in_pass(store.objects(), &ctx, &clean).unwrap();
        assert!(report.ok, "{report:?}");
    }

    let (flipped, removed) = (&shared[200], &shared[500]);
    flip_byte(&store.objects().object_path(flipped).unwrap());
    store.objects().remove(removed).unwrap();
    let pass = ObjectsChecked::default();
    for run in [&second, &third] {
        let report = run.verify_in_pass(store.objects(), &ctx, &pass).unwrap();
        assert!(!report.ok);
        assert_eq!(
            subjects(&report),
            vec![
                format!("object {flipped}").as_str(),
                format!("object {removed}").as_str()
            ]
        );
    }
}
