//! The stat cache end to end: a run reuses hashes from the previous verified run only for files
//! whose stat is unchanged and not racy, and still sees every change an unprivileged process can
//! make, including content rewritten with its timestamps put back.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};

use agentdiff_scan::Manifest;
use agentdiff_store::{Artifact, Store};

use super::{agentdiff, assert_exit, changed_paths};

const FILES: [&str; 3] = ["a.txt", "b.txt", "src/lib.rs"];

/// A project whose files are older than the racy margin (2 s) by the time the first run scans.
fn aged_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir(dir.path().join("src")).unwrap();
    for f in FILES {
        fs::write(dir.path().join(f), format!("{f}\n")).unwrap();
    }
    std::thread::sleep(Duration::from_millis(2_200));
    dir
}

fn run(root: &Path, id: &str, extra: &[&str], script: &str) -> Value {
    let mut args = vec![
        "run",
        "--format",
        "json",
        "--fail-on",
        "never",
        "--run-id",
        id,
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let out = agentdiff(root, &args);
    assert_exit(&out, 0);
    serde_json::from_slice(&out.stdout).unwrap()
}

fn events(root: &Path, id: &str) -> Vec<Value> {
    let text = fs::read_to_string(root.join(format!(".agentdiff/runs/{id}/events.jsonl"))).unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn event(root: &Path, id: &str, name: &str) -> Option<Value> {
    events(root, id).into_iter().find(|e| e["event"] == name)
}

/// The run's `stat_cache` event (the earlier scan it used, and what the scan record gave it).
fn stat_cache(root: &Path, id: &str) -> Value {
    event(root, id, "stat_cache").unwrap_or_else(|| panic!("run {id} used no earlier scan"))
}

fn reused(root: &Path, id: &str, phase: &str) -> u64 {
    event(root, id, &format!("{phase}_captured")).unwrap()["hashes_reused"]
        .as_u64()
        .unwrap()
}

fn manifest(root: &Path, id: &str, artifact: Artifact) -> Manifest {
    let store = Store::open_existing(root).unwrap();
    store
        .open_run(id)
        .unwrap()
        .read_manifest(artifact, store.objects())
        .unwrap()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[test]
fn an_unchanged_tree_reuses_the_previous_verified_run_and_records_it() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    assert!(
        event(p.path(), "r1", "stat_cache").is_none(),
        "no earlier run"
    );
    assert_eq!(reused(p.path(), "r1", "before"), 0);
    run(p.path(), "r2", &[], "true");
    let cache = stat_cache(p.path(), "r2");
    assert_eq!(cache["run_id"], "r1");
    assert_eq!(cache["artifact"], "after.json");
    assert_eq!(reused(p.path(), "r2", "before"), FILES.len() as u64);
    // The reused entries are what a full read records, and the backups exist.
    let before = manifest(p.path(), "r2", Artifact::Before);
    for f in FILES {
        let e = &before.entries[f];
        assert_eq!(
            e.sha256.as_deref(),
            Some(sha(format!("{f}\n").as_bytes()).as_str())
        );
        assert_eq!(e.backup, agentdiff_scan::BackupState::Stored, "{f}");
    }
    assert_eq!(before.stats.bytes_hashed, 0);
    let out = agentdiff(p.path(), &["verify", "r2"]);
    assert_exit(&out, 0);
    // Nothing changed: the after-scan's entries (backup state included) are the before-scan's,
    // so the two manifests are one tree and the comparison reads none of it.
    let root = |a: &str| {
        let text = fs::read_to_string(p.path().join(format!(".agentdiff/runs/r2/{a}"))).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["root_tree"]["sha256"].clone()
    };
    assert_eq!(root("before.json"), root("after.json"));
}

#[test]
fn content_rewritten_between_runs_with_mtime_restored_is_hashed_again() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    // Same size, same mtime (touch -r from a copy taken before): only ctime moves.
    let script = "cp -p a.txt ../ref-$$ && printf 'A.txt\\n' > a.txt && touch -r ../ref-$$ a.txt \
                  && rm ../ref-$$";
    let status = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(p.path())
        .status()
        .unwrap();
    assert!(status.success());
    run(p.path(), "r2", &[], "true");
    let before = manifest(p.path(), "r2", Artifact::Before);
    assert_eq!(
        before.entries["a.txt"].sha256.as_deref(),
        Some(sha(b"A.txt\n").as_str()),
        "the rewrite must be read, not taken from the cache"
    );
    assert_eq!(reused(p.path(), "r2", "before"), FILES.len() as u64 - 1);
}

#[test]
fn the_command_cannot_hide_a_rewrite_by_restoring_timestamps_or_swapping_inodes() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    // In the run: a same-size rewrite with mtime (and atime) put back by utimensat (touch -r),
    // and a rename of a prepared file over b.txt carrying b.txt's timestamps.
    let script = "cp -p a.txt ../ref-$$ && printf 'A.txt\\n' > a.txt && touch -r ../ref-$$ a.txt \
                  && rm ../ref-$$ && printf 'B.txt\\n' > .swap && touch -r b.txt .swap \
                  && mv .swap b.txt";
    let r = run(p.path(), "r2", &[], script);
    assert!(event(p.path(), "r2", "stat_cache").is_some());
    let mut paths = changed_paths(&r);
    paths.sort();
    assert_eq!(paths, vec!["a.txt", "b.txt"], "{r:#}");
    let after = manifest(p.path(), "r2", Artifact::After);
    assert_eq!(
        after.entries["a.txt"].sha256.as_deref(),
        Some(sha(b"A.txt\n").as_str())
    );
    assert_eq!(
        after.entries["b.txt"].sha256.as_deref(),
        Some(sha(b"B.txt\n").as_str())
    );
}

#[test]
fn entries_written_just_before_a_scan_are_racy_and_read_again() {
    let p = tempfile::tempdir().unwrap();
    fs::write(p.path().join("fresh.txt"), "fresh\n").unwrap();
    // Stamped a minute ahead: within the racy margin of every scan below however long each run
    // takes (a write a moment before a slow run's scan could fall out of the margin). Its entry
    // is never reused.
    fs::File::options()
        .write(true)
        .open(p.path().join("fresh.txt"))
        .unwrap()
        .set_modified(std::time::SystemTime::now() + Duration::from_secs(60))
        .unwrap();
    run(p.path(), "r1", &[], "true");
    assert_eq!(
        reused(p.path(), "r1", "after"),
        0,
        "racy in the after-scan too"
    );
    run(p.path(), "r2", &[], "true");
    assert!(event(p.path(), "r2", "stat_cache").is_some());
    assert_eq!(reused(p.path(), "r2", "before"), 0);
}

#[test]
fn trust_stat_false_hashes_every_file_in_every_scan() {
    let p = aged_project();
    fs::write(
        p.path().join("policy.yaml"),
        "version: 1\ncapture:\n  trust_stat: false\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(2_200));
    let policy = ["--policy", "policy.yaml"];
    run(p.path(), "r1", &policy, "true");
    run(p.path(), "r2", &policy, "true");
    assert!(event(p.path(), "r2", "stat_cache").is_none());
    assert_eq!(reused(p.path(), "r2", "before"), 0);
    assert_eq!(reused(p.path(), "r2", "after"), 0);
    let policy_doc: Value =
        serde_json::from_slice(&fs::read(p.path().join(".agentdiff/runs/r2/policy.json")).unwrap())
            .unwrap();
    assert_eq!(policy_doc["effective"]["capture"]["trust_stat"], false);
    // With the default, the same tree is served from the cache.
    run(p.path(), "r3", &[], "true");
    assert!(reused(p.path(), "r3", "after") > 0);
}

/// The cache's candidates are the project's latest sealed runs as the ledger names them, not
/// whichever run directory was modified last: touching an older capsule does not make it the
/// cache, and the store is not listed when the ledger names a run that qualifies.
#[test]
fn the_latest_sealed_run_feeds_the_cache_whatever_was_touched_since() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    run(p.path(), "r2", &[], "true");
    std::thread::sleep(Duration::from_millis(20));
    let touched = std::process::Command::new("touch")
        .arg(p.path().join(".agentdiff/runs/r1"))
        .status()
        .unwrap();
    assert!(touched.success());
    run(p.path(), "r3", &[], "true");
    let cache = stat_cache(p.path(), "r3");
    assert_eq!(cache["run_id"], "r2");
    assert_eq!(reused(p.path(), "r3", "before"), FILES.len() as u64);
    // Without its capsule the newest sealed run cannot feed the cache: the next one does.
    fs::remove_dir_all(p.path().join(".agentdiff/runs/r3")).unwrap();
    run(p.path(), "r4", &[], "true");
    let cache = stat_cache(p.path(), "r4");
    assert_eq!(cache["run_id"], "r2");
}

/// The file's inode and ctime: any rewrite or replacement changes them.
fn file_stamp(path: &Path) -> (u64, i64, i64) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(path).unwrap();
    (m.ino(), m.ctime(), m.ctime_nsec())
}

/// The verified-object cache and the scan record are written when a run verified something
/// new or its trees changed, not by every run: an unchanged tree's runs leave both files as
/// they are.
#[test]
fn an_unchanged_tree_rewrites_neither_the_object_cache_nor_the_scan_record() {
    let p = aged_project();
    let cache = p.path().join(".agentdiff/objects/verified-cache");
    let record = p.path().join(".agentdiff/objects/scan-record");
    let stamp = || (file_stamp(&cache), file_stamp(&record));
    run(p.path(), "r1", &[], "true");
    run(p.path(), "r2", &[], "true");
    let settled = stamp();
    run(p.path(), "r3", &[], "true");
    assert_eq!(
        stamp(),
        settled,
        "an unchanged run rewrote the cache or the record"
    );
    // A new file's backup is a new verified object, in a changed tree: both are written again.
    fs::write(p.path().join("new.txt"), "new\n").unwrap();
    run(p.path(), "r4", &[], "true");
    let (now_cache, now_record) = stamp();
    assert_ne!(now_cache, settled.0);
    assert_ne!(now_record, settled.1);
    assert_exit(&agentdiff(p.path(), &["verify", "r4"]), 0);
}

#[test]
fn a_capsule_edited_after_its_seal_never_feeds_the_cache() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    // Claim another hash for a.txt in r1's after-manifest: the header's sealed hash no longer
    // matches, and a rewritten seal does not authenticate without the key.
    let seal = p.path().join(".agentdiff/runs/r1/integrity.json");
    let text = fs::read_to_string(&seal).unwrap();
    fs::write(
        &seal,
        text.replace("\"sealed_at\": \"", "\"sealed_at\": \"1"),
    )
    .unwrap();
    run(p.path(), "r2", &[], "true");
    assert!(event(p.path(), "r2", "stat_cache").is_none());
    assert_eq!(reused(p.path(), "r2", "before"), 0);
}

/// `agentdiff run … -- true` in `root` with its own state directory (key and ledger), so the
/// test may rewrite that ledger.
fn run_with_state(root: &Path, state: &Path, id: &str) {
    let out = super::cmd(
        root,
        &["run", "--fail-on", "never", "--run-id", id, "--", "true"],
    )
    .env("AGENTDIFF_STATE_DIR", state)
    .output()
    .unwrap();
    assert_exit(&out, 0);
}

/// The ledger's tail names the recent runs and holds their seal lines, so finding the cache
/// costs the same however long the ledger is: here it is longer than a whole read accepts
/// (256 MB, a sparse hole before the real lines), and the cache is still found.
#[test]
fn a_recent_run_feeds_the_cache_without_the_whole_ledger_being_read() {
    use std::os::unix::fs::FileExt;
    let p = aged_project();
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    run_with_state(p.path(), &state, "r1");
    let ledger = state.join("ledger.jsonl");
    let lines = fs::read(&ledger).unwrap();
    let file = fs::OpenOptions::new().write(true).open(&ledger).unwrap();
    let hole: u64 = 300 << 20;
    file.set_len(hole).unwrap();
    file.write_all_at(&[b"\n".as_slice(), &lines].concat(), hole)
        .unwrap();
    drop(file);
    run_with_state(p.path(), &state, "r2");
    let cache = stat_cache(p.path(), "r2");
    assert_eq!(cache["run_id"], "r1");
    assert_eq!(reused(p.path(), "r2", "before"), FILES.len() as u64);
}

/// A run whose seal line is no longer in the ledger's tail (other projects sealed many runs
/// since) is found through the whole ledger, checked the same way.
#[test]
fn a_run_whose_seal_left_the_ledger_tail_still_feeds_the_cache() {
    use std::io::Write;
    let p = aged_project();
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    run_with_state(p.path(), &state, "r1");
    let mut ledger = fs::OpenOptions::new()
        .append(true)
        .open(state.join("ledger.jsonl"))
        .unwrap();
    // 96 KB of lines that are no seal of this project (the tail read is 64 KB).
    let other = format!("{}\n", r#"{"not":"a seal line"}"#).repeat(4_096);
    ledger.write_all(other.as_bytes()).unwrap();
    drop(ledger);
    run_with_state(p.path(), &state, "r2");
    let cache = stat_cache(p.path(), "r2");
    assert_eq!(cache["run_id"], "r1");
    assert_eq!(reused(p.path(), "r2", "before"), FILES.len() as u64);
}

/// The object of `path`'s backup in run `id`'s before manifest.
fn backup_object(root: &Path, id: &str, path: &str) -> std::path::PathBuf {
    let e = &manifest(root, id, Artifact::Before).entries[path];
    assert_eq!(e.backup, agentdiff_scan::BackupState::Stored, "{path}");
    let hex = e.sha256.clone().unwrap();
    root.join(format!(
        ".agentdiff/objects/sha256/{}/{}",
        &hex[..2],
        &hex[2..]
    ))
}

fn findings(result: &Value) -> Vec<Value> {
    result["capsule_tampered"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The directories of an unchanged tree come from the last run's scan record: neither their
/// trees nor their files' backups are read before launch, and the manifest is the one a full
/// read gives.
#[test]
fn a_warm_run_takes_unchanged_directories_from_the_scan_record() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    assert!(p.path().join(".agentdiff/objects/scan-record").is_file());
    run(p.path(), "r2", &[], "true");
    let cache = stat_cache(p.path(), "r2");
    assert!(cache["recorded_digests"].as_u64().unwrap() >= 2, "{cache}");
    assert_eq!(cache["recorded_trees_copied"], 2, "{cache}");
    assert_eq!(cache["recorded_pack_hashed"], false, "{cache}");
    let captured = event(p.path(), "r2", "before_captured").unwrap();
    assert_eq!(captured["trees_reused"], 2, "{captured}");
    let before = manifest(p.path(), "r2", Artifact::Before);
    assert_eq!(before.stats.backups_reused, FILES.len() as u64);
    for f in FILES {
        let e = &before.entries[f];
        assert_eq!(
            e.sha256.as_deref(),
            Some(sha(format!("{f}\n").as_bytes()).as_str())
        );
        assert_eq!(e.backup, agentdiff_scan::BackupState::Stored, "{f}");
    }
    // The same tree as the last run's after-scan, which a full read would give too.
    let root = |id: &str, a: &str| {
        let path = p.path().join(format!(".agentdiff/runs/{id}/{a}"));
        let v: Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
        v["root_tree"]["sha256"].clone()
    };
    assert_eq!(root("r2", "before.json"), root("r1", "after.json"));
    assert_exit(&agentdiff(p.path(), &["verify", "r2"]), 0);
    // A change in one directory: that directory is read, the other still comes from the record.
    fs::write(p.path().join("src/lib.rs"), "changed\n").unwrap();
    let result = run(p.path(), "r3", &[], "true");
    assert!(findings(&result).is_empty(), "{result}");
    let before = manifest(p.path(), "r3", Artifact::Before);
    assert_eq!(
        before.entries["src/lib.rs"].sha256.as_deref(),
        Some(sha(b"changed\n").as_str())
    );
    assert_eq!(
        before.entries["src/lib.rs"].backup,
        agentdiff_scan::BackupState::Stored
    );
}

/// Run r1, then rewrite `a.txt`'s backup object in place (same size, mtime put back) as
/// something outside agentdiff would between runs; returns the object's path.
fn first_run_then_damage_a_backup(root: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    run(root, "r1", &[], "true");
    let object = backup_object(root, "r1", "a.txt");
    fs::set_permissions(&object, fs::Permissions::from_mode(0o600)).unwrap();
    agentdiff_test_support::rewrite_in_place(&object, b"A.txt\n");
    // Past the filesystem's timestamp tick, so the change is older than the next run's listing.
    std::thread::sleep(Duration::from_millis(50));
    object
}

/// A backup rewritten in place between runs (same size, mtime put back) leaves every shard
/// directory as it was, so the record is used and the backup is not looked at before launch:
/// the check after the command finds the object's identity changed, hashes it, quarantines it
/// and withdraws the backup, saying the change predates the run.
#[test]
fn a_backup_rewritten_between_runs_is_found_after_the_command_and_withdrawn() {
    let p = aged_project();
    let object = first_run_then_damage_a_backup(p.path());
    let result = run(p.path(), "r2", &[], "true");
    let cache = stat_cache(p.path(), "r2");
    assert!(cache["recorded_digests"].as_u64().unwrap() > 0, "{cache}");
    let found = findings(&result);
    assert_eq!(found.len(), 1, "{result}");
    assert_eq!(found[0]["change"], "modified");
    assert!(
        found[0]["detail"]
            .as_str()
            .unwrap()
            .contains("before this run started"),
        "{found:?}"
    );
    assert!(!object.exists(), "the damaged object is quarantined");
    let before = manifest(p.path(), "r2", Artifact::Before);
    assert!(
        matches!(
            before.entries["a.txt"].backup,
            agentdiff_scan::BackupState::Skipped { .. }
        ),
        "{:?}",
        before.entries["a.txt"]
    );
    assert_eq!(
        before.entries["b.txt"].backup,
        agentdiff_scan::BackupState::Stored
    );
    assert_exit(&agentdiff(p.path(), &["verify", "r2"]), 0);
    // The next run stores the backup again (the store changed: no record is trusted).
    let result = run(p.path(), "r3", &[], "true");
    assert!(findings(&result).is_empty(), "{result}");
    let object = backup_object(p.path(), "r3", "a.txt");
    assert_eq!(fs::read(object).unwrap(), b"a.txt\n");
}

/// An object touched between runs without a content change (a chmod, a hard link taken by a
/// backup tool) has a new ctime: it is hashed after the command, found intact, and is no
/// finding.
#[test]
fn an_object_touched_between_runs_with_its_content_intact_is_no_finding() {
    use std::os::unix::fs::PermissionsExt;
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    let object = backup_object(p.path(), "r1", "a.txt");
    fs::set_permissions(&object, fs::Permissions::from_mode(0o400)).unwrap();
    let link = p.path().join("elsewhere");
    fs::hard_link(&object, &link).unwrap();
    fs::remove_file(&link).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let result = run(p.path(), "r2", &[], "true");
    assert!(
        stat_cache(p.path(), "r2")["recorded_digests"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(findings(&result).is_empty(), "{result}");
    assert_eq!(
        manifest(p.path(), "r2", Artifact::Before).entries["a.txt"].backup,
        agentdiff_scan::BackupState::Stored
    );
}

/// A backup removed between runs changes its shard directory: the record is not used, the
/// before-scan looks at every backup as without a record and stores the missing one again.
#[test]
fn a_backup_removed_between_runs_turns_the_record_off_and_is_stored_again() {
    let p = aged_project();
    run(p.path(), "r1", &[], "true");
    let object = backup_object(p.path(), "r1", "a.txt");
    fs::remove_file(&object).unwrap();
    let result = run(p.path(), "r2", &[], "true");
    assert!(findings(&result).is_empty(), "{result}");
    let cache = stat_cache(p.path(), "r2");
    assert_eq!(cache["recorded_digests"], 0, "{cache}");
    assert_eq!(
        fs::read(backup_object(p.path(), "r2", "a.txt")).unwrap(),
        b"a.txt\n"
    );
    assert_exit(&agentdiff(p.path(), &["verify", "r2"]), 0);
}

/// A record whose MAC does not check is ignored as a whole; damage to its pack (the copy of the
/// trees, not MAC'd: each tree is verified as it is copied) costs reads, never a wrong manifest,
/// and is repaired by the run that finds it.
#[test]
fn a_forged_record_is_ignored_and_a_damaged_pack_only_costs_reads() {
    let p = aged_project();
    let record = p.path().join(".agentdiff/objects/scan-record");
    run(p.path(), "r1", &[], "true");
    let good = fs::read(&record).unwrap();
    // The body follows the 256-byte header and the pack; flip its last byte before the MAC.
    let mut forged = good.clone();
    let at = forged.len() - 66;
    forged[at] ^= 1;
    fs::write(&record, &forged).unwrap();
    run(p.path(), "r2", &[], "true");
    assert_eq!(stat_cache(p.path(), "r2")["recorded_digests"], 0);
    // r2 rewrote it; now damage every byte of the pack.
    let mut damaged = fs::read(&record).unwrap();
    let header = String::from_utf8_lossy(&damaged[..256]).to_string();
    let pack_len: usize = header.split_whitespace().nth(4).unwrap().parse().unwrap();
    assert!(pack_len > 0, "{header}");
    for b in &mut damaged[256..256 + pack_len] {
        *b = b'x';
    }
    fs::write(&record, &damaged).unwrap();
    // Every tree fails its check as it is copied: none is, all are read from the store.
    let result = run(p.path(), "r3", &[], "true");
    assert!(findings(&result).is_empty(), "{result}");
    let cache = stat_cache(p.path(), "r3");
    assert!(cache["recorded_digests"].as_u64().unwrap() > 0, "{cache}");
    assert_eq!(cache["recorded_trees_copied"], 0, "{cache}");
    let root = |id: &str, a: &str| {
        let path = p.path().join(format!(".agentdiff/runs/{id}/{a}"));
        let v: Value = serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap();
        v["root_tree"]["sha256"].clone()
    };
    assert_eq!(root("r3", "before.json"), root("r2", "after.json"));
    assert_exit(&agentdiff(p.path(), &["verify", "r3"]), 0);
    // The damaged pack is not left for the next run.
    run(p.path(), "r4", &[], "true");
    let cache = stat_cache(p.path(), "r4");
    assert_eq!(cache["recorded_trees_copied"], 2, "{cache}");
    assert_eq!(cache["recorded_pack_hashed"], false, "{cache}");
    // Without its stamp the pack is hashed as it is copied; found whole, it is vouched for.
    fs::remove_file(p.path().join(".agentdiff/objects/scan-record.stamp")).unwrap();
    run(p.path(), "r5", &[], "true");
    let cache = stat_cache(p.path(), "r5");
    assert_eq!(cache["recorded_pack_hashed"], true, "{cache}");
    assert_eq!(cache["recorded_trees_copied"], 2, "{cache}");
    run(p.path(), "r6", &[], "true");
    let cache = stat_cache(p.path(), "r6");
    assert_eq!(cache["recorded_pack_hashed"], false, "{cache}");
}

/// A run that never launches still seals its before manifest: what its before-scan claimed from
/// the record is checked first, so a backup damaged between runs is withdrawn there too.
#[test]
fn a_run_refused_at_launch_checks_what_it_claimed_before_sealing() {
    let p = aged_project();
    let object = first_run_then_damage_a_backup(p.path());
    let out = agentdiff(
        p.path(),
        &[
            "run",
            "--run-id",
            "r2",
            "--",
            "/nonexistent/agentdiff-test-command",
        ],
    );
    assert_exit(&out, 127);
    assert!(
        stat_cache(p.path(), "r2")["recorded_digests"]
            .as_u64()
            .unwrap()
            > 0
    );
    let checked = event(p.path(), "r2", "store_changed_before_launch").expect("claims checked");
    assert_eq!(
        checked["findings"].as_array().unwrap().len(),
        1,
        "{checked}"
    );
    assert!(!object.exists(), "quarantined");
    assert!(matches!(
        manifest(p.path(), "r2", Artifact::Before).entries["a.txt"].backup,
        agentdiff_scan::BackupState::Skipped { .. }
    ));
    assert_exit(&agentdiff(p.path(), &["verify", "r2"]), 0);
}

/// A run whose command changed the store leaves no scan record: the next run reads every tree.
#[test]
fn a_run_whose_command_changed_the_store_drops_the_scan_record() {
    let p = aged_project();
    let record = p.path().join(".agentdiff/objects/scan-record");
    run(p.path(), "r4", &[], "true");
    assert!(record.exists());
    // The command deletes a backup: a finding, and no record is left.
    let object = backup_object(p.path(), "r4", "b.txt");
    let script = format!("rm -f '{}'", object.display());
    let result = run(p.path(), "r5", &[], &script);
    // The object listing came from the record (the store was as it found it): the removal is
    // still found, by name.
    let cache = stat_cache(p.path(), "r5");
    assert!(cache["recorded_digests"].as_u64().unwrap() > 0, "{cache}");
    let found = findings(&result);
    assert!(
        found
            .iter()
            .any(|f| f["change"] == "removed" && f["object"].is_string()),
        "{result}"
    );
    assert!(!record.exists(), "a record left after tampering");
    run(p.path(), "r6", &[], "true");
    assert_eq!(stat_cache(p.path(), "r6")["recorded_digests"], 0);
    assert!(record.exists());
}
