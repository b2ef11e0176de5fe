//! Evidence the command cannot forge: each attack of the capsule-integrity issue, through the real
//! binary (in-run tampering, planted objects, incomplete or re-keyed seals, forged cleanup
//! evidence, secrets in argv and environment), plus a bit-flip sweep over a real capsule.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use agentdiff_store::seal::{StateDir, VerifyContext};
use agentdiff_store::{Integrity, Store, Verdict};
use serde_json::Value;

use super::{json_of, text};
use sha2::{Digest, Sha256};

const INVALID_CAPSULE: i32 = 67;
const GATE_DENIED: i32 = 71;
const UNAUTHENTICATED: i32 = 77;

/// A project with a private state directory (key and ledger) beside it, never the user's.
struct Project {
    _dir: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
}

fn project() -> Project {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    fs::create_dir(&root).unwrap();
    fs::write(root.join("a.txt"), "a\n").unwrap();
    fs::write(root.join("b.txt"), "b\n").unwrap();
    let state = dir.path().join("state");
    Project {
        root: root.canonicalize().unwrap(),
        state,
        _dir: dir,
    }
}

impl Project {
    fn agentdiff(&self, args: &[&str]) -> Output {
        self.agentdiff_with_state(args, &self.state)
    }

    fn agentdiff_with_state(&self, args: &[&str], state: &Path) -> Output {
        self.cmd(args)
            .env("AGENTDIFF_STATE_DIR", state)
            .output()
            .unwrap()
    }

    /// [`super::cmd`] with this project's own state directory.
    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = super::cmd(&self.root, args);
        c.env("AGENTDIFF_STATE_DIR", &self.state);
        c
    }

    /// `agentdiff run --format json --run-id ID -- sh -c SCRIPT` → (exit code, result).
    fn run(&self, id: &str, script: &str) -> (i32, Value) {
        let out = self.agentdiff(&[
            "run", "--format", "json", "--run-id", id, "--", "sh", "-c", script,
        ]);
        (out.status.code().unwrap_or(-1), json_of(&out))
    }

    fn run_dir(&self, id: &str) -> PathBuf {
        self.root.join(".agentdiff/runs").join(id)
    }

    fn verify(&self, id: &str) -> (i32, Value) {
        let out = self.agentdiff(&["verify", id, "--format", "json"]);
        (out.status.code().unwrap_or(-1), json_of(&out))
    }

    /// Rewrites integrity.json as an attacker without the key would: edit it, recompute the
    /// digest, write it canonically (the MAC cannot be recomputed).
    fn forge_seal(&self, id: &str, edit: impl FnOnce(&mut Integrity)) {
        let path = self.run_dir(id).join("integrity.json");
        let mut seal: Integrity = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        edit(&mut seal);
        seal.digest = seal.compute_digest();
        let mut bytes = serde_json::to_vec_pretty(&seal).unwrap();
        bytes.push(b'\n');
        fs::write(&path, bytes).unwrap();
    }
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn problems(report: &Value) -> String {
    report["problems"].to_string()
}

/// Attack 1: the command appends to every file under `.agentdiff/` during the run.
#[test]
fn a_command_rewriting_its_own_capsule_is_caught_and_the_seal_holds_what_agentdiff_wrote() {
    let p = project();
    let (code, _) = p.run("first", "echo 1 >> b.txt");
    assert_eq!(code, 0);
    let (code, result) = p.run(
        "second",
        "echo changed >> a.txt; for f in $(find .agentdiff -type f); do echo X >> \"$f\"; done",
    );
    assert_eq!(code, GATE_DENIED, "{result:#}");
    assert_eq!(result["status"], "denied");
    assert_eq!(result["safety_outcome"], "deny");
    let tampered: Vec<String> = result["capsule_tampered"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect();
    for must in [
        "runs/second/metadata.json",
        "runs/second/policy.json",
        "runs/second/before.json",
        "runs/second/events.jsonl",
        "runs/first/result.json",
        "runs/first/integrity.json",
        // The orphan notice's hint is the store's too.
        "last-run",
    ] {
        assert!(
            tampered.iter().any(|t| t == must),
            "{must} not named: {tampered:?}"
        );
    }
    assert!(
        tampered.iter().any(|t| t.starts_with("objects/sha256/")),
        "objects not named: {tampered:?}"
    );
    // a.txt's backup object was appended to: its change is not counted as recoverable.
    let a = result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "a.txt")
        .unwrap();
    assert_eq!(a["reversible"], false, "{a:#}");
    assert!(
        a["recovery_reason"].as_str().unwrap().contains("tamper"),
        "{a:#}"
    );

    // The capsule holds what agentdiff wrote: it authenticates, and no artifact ends in "X".
    let (code, report) = p.verify("second");
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["verdict"], "authenticated");
    for name in [
        "metadata.json",
        "policy.json",
        "before.json",
        "events.jsonl",
    ] {
        let bytes = fs::read(p.run_dir("second").join(name)).unwrap();
        assert!(!bytes.ends_with(b"X\n"), "{name} kept the command's bytes");
    }
    // The earlier run the command appended to no longer verifies.
    let (code, report) = p.verify("first");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert_eq!(report["verdict"], "forged");
    // The quarantined objects are kept aside, never used as backups.
    assert!(p.root.join(".agentdiff/objects/quarantine").is_dir());
}

/// Attack 2: garbage of the right size planted under a file's hash, during a run and between runs.
#[test]
fn a_planted_object_never_stands_in_for_a_backup() {
    let p = project();
    let plant =
        "h=$(sha256sum new.txt | cut -c1-64); d=.agentdiff/objects/sha256/$(echo $h | cut -c1-2); \
                 mkdir -p $d; printf 'garbag' > $d/$(echo $h | cut -c3-)";
    let (code, result) = p.run("plant", &format!("echo hello > new.txt; {plant}"));
    assert_eq!(code, GATE_DENIED, "{result:#}");
    let found = result["capsule_tampered"].to_string();
    assert!(found.contains("planted"), "{found}");
    let hello = sha(b"hello\n");
    let object = p
        .root
        .join(".agentdiff/objects/sha256")
        .join(&hello[..2])
        .join(&hello[2..]);
    assert!(!object.exists(), "the planted object was not quarantined");

    // Planted again between runs: the next run verifies before reusing, and stores the real bytes.
    // (The command's `mkdir -p` left the shard 0755, which the store refuses to use: fail closed.
    // Make it private, as a careful attacker would, so the planted bytes are what is tested.)
    fs::create_dir_all(object.parent().unwrap()).unwrap();
    Command::new("chmod")
        .arg("700")
        .arg(object.parent().unwrap())
        .status()
        .unwrap();
    fs::write(&object, "garbag").unwrap();
    let (code, result) = p.run("remove", "rm new.txt");
    assert_eq!(code, 0, "{result:#}");
    assert_eq!(result["recovery_available"], true, "{result:#}");
    assert_eq!(fs::read(&object).unwrap(), b"hello\n");
    let out = p.agentdiff(&["rollback", "remove", "--all"]);
    super::assert_exit(&out, 0);
    assert_eq!(fs::read(p.root.join("new.txt")).unwrap(), b"hello\n");
}

/// Attack 2, between runs, against the verified-object cache: an object rewritten in place with
/// the same size and its mtime put back, one replaced by a file of another size, and then a cache
/// file edited to vouch for a rewritten object. None of them is reused as a backup.
#[test]
fn objects_rewritten_resized_or_vouched_for_between_runs_are_never_reused() {
    use std::os::unix::fs::MetadataExt;
    let p = project();
    let cache = p.root.join(".agentdiff/objects/verified-cache");
    let object = |content: &[u8]| {
        let h = sha(content);
        p.root
            .join(".agentdiff/objects/sha256")
            .join(&h[..2])
            .join(&h[2..])
    };
    let (a, b) = (object(b"a\n"), object(b"b\n"));
    // Same size, other bytes, mtime restored: only the ctime shows the write.
    let rewrite_in_place = |path: &Path| agentdiff_test_support::rewrite_in_place(path, b"A\n");
    let remove_and_restore = |id: &str| {
        let (code, result) = p.run(id, "rm a.txt b.txt");
        assert_eq!(code, 0, "{result:#}");
        assert_eq!(result["recovery_available"], true, "{result:#}");
        assert_eq!(
            fs::read(&a).unwrap(),
            b"a\n",
            "a rewritten object was reused"
        );
        assert_eq!(
            fs::read(&b).unwrap(),
            b"b\n",
            "a replaced object was reused"
        );
        let out = p.agentdiff(&["rollback", id, "--all"]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
        assert_eq!(fs::read(p.root.join("a.txt")).unwrap(), b"a\n");
        assert_eq!(fs::read(p.root.join("b.txt")).unwrap(), b"b\n");
    };

    // With the genuine cache: a rewritten in place, b replaced by a file of another size.
    let (code, result) = p.run("warm", "true");
    assert_eq!(code, 0, "{result:#}");
    assert!(cache.is_file(), "no verified-object cache after a run");
    rewrite_in_place(&a);
    let planted = b.with_extension("planted");
    fs::write(&planted, "not the backup of b\n").unwrap();
    fs::rename(&planted, &b).unwrap();
    remove_and_restore("remove");

    // The cache edited to vouch for a's new identity (its MAC cannot be recomputed without the
    // key, so the whole file is ignored).
    let (code, result) = p.run("warm-again", "true");
    assert_eq!(code, 0, "{result:#}");
    rewrite_in_place(&a);
    let meta = fs::metadata(&a).unwrap();
    let ns = |s: i64, n: i64| s * 1_000_000_000 + n;
    // The record of a's object (64 bytes: digest, inode, size, mtime_ns, ctime_ns, little-endian)
    // rewritten to vouch for a's new identity.
    let mut edited = fs::read(&cache).unwrap();
    let digest = hex::decode(sha(b"a\n")).unwrap();
    let at = edited
        .windows(32)
        .position(|w| w == digest.as_slice())
        .expect("a's object is not in the cache");
    edited[at + 32..at + 40].copy_from_slice(&meta.ino().to_le_bytes());
    edited[at + 40..at + 48].copy_from_slice(&meta.len().to_le_bytes());
    edited[at + 48..at + 56].copy_from_slice(&ns(meta.mtime(), meta.mtime_nsec()).to_le_bytes());
    edited[at + 56..at + 64].copy_from_slice(&ns(meta.ctime(), meta.ctime_nsec()).to_le_bytes());
    fs::write(&cache, edited).unwrap();
    remove_and_restore("remove-again");
}

/// Attack 3: the seal says what a capsule must hold, covers itself, and binds its run id.
#[test]
fn an_incomplete_or_renamed_capsule_does_not_verify() {
    let p = project();
    assert_eq!(p.run("r1", "echo x >> a.txt").0, 0);
    let dir = p.run_dir("r1");
    let pristine = tempfile::tempdir().unwrap();
    let copy = |from: &Path, to: &Path| {
        fs::create_dir_all(to).unwrap();
        Command::new("chmod").arg("700").arg(to).status().unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    copy(&dir, pristine.path());
    let restore = || {
        fs::remove_dir_all(&dir).unwrap();
        copy(pristine.path(), &dir);
    };

    // result.json deleted together with its line in the seal.
    fs::remove_file(dir.join("result.json")).unwrap();
    p.forge_seal("r1", |s| {
        s.artifacts.remove("result.json");
    });
    let (code, report) = p.verify("r1");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert!(problems(&report).contains("result.json"), "{report:#}");
    assert!(problems(&report).contains("required"), "{report:#}");
    restore();

    // A manifest's root tree dropped from the seal's list and corrupted.
    let before: Value =
        serde_json::from_slice(&fs::read(dir.join("before.json")).unwrap()).unwrap();
    let entries = before["root_tree"]["sha256"].as_str().unwrap().to_string();
    p.forge_seal("r1", |s| s.objects.retain(|o| *o != entries));
    let object = p
        .root
        .join(".agentdiff/objects/sha256")
        .join(&entries[..2])
        .join(&entries[2..]);
    let original = fs::read(&object).unwrap();
    fs::write(&object, b"[]").unwrap();
    let (code, report) = p.verify("r1");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert!(
        problems(&report).contains("not listed in the seal"),
        "{report:#}"
    );
    fs::write(&object, original).unwrap();
    restore();

    // A copied run directory whose seal is renamed to the new id.
    let renamed = p.run_dir("r2");
    copy(&dir, &renamed);
    p.forge_seal("r2", |s| s.run_id = "r2".into());
    let (code, report) = p.verify("r2");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert_eq!(report["authentication"]["state"], "forged", "{report:#}");
    // Unchanged, it is still bound to r1.
    fs::remove_dir_all(&renamed).unwrap();
    copy(&dir, &renamed);
    let (code, report) = p.verify("r2");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert!(problems(&report).contains("belongs to run"), "{report:#}");
    fs::remove_dir_all(&renamed).unwrap();

    let (code, report) = p.verify("r1");
    assert_eq!(code, 0, "{report:#}");
}

/// The seal lists only the manifests' root trees; verify walks them, so a subtree or a backup below
/// a root (never listed in integrity.json) that is removed or altered is still named.
#[test]
fn verify_walks_the_manifest_trees_below_the_sealed_roots() {
    let p = project();
    fs::create_dir_all(p.root.join("src/deep")).unwrap();
    fs::write(p.root.join("src/deep/lib.rs"), "// lib\n").unwrap();
    let (code, r) = p.run("r1", "echo more >> a.txt");
    assert_eq!(code, 0, "{r:#}");
    let seal: Integrity =
        serde_json::from_slice(&fs::read(p.run_dir("r1").join("integrity.json")).unwrap()).unwrap();
    assert_eq!(
        seal.objects.len(),
        2,
        "only the two root trees: {:?}",
        seal.objects
    );
    let object = |hex: &str| {
        p.root
            .join(".agentdiff/objects/sha256")
            .join(&hex[..2])
            .join(&hex[2..])
    };
    let read_json =
        |path: PathBuf| -> Value { serde_json::from_slice(&fs::read(path).unwrap()).unwrap() };
    let before = read_json(p.run_dir("r1").join("before.json"));
    let root = read_json(object(before["root_tree"]["sha256"].as_str().unwrap()));
    let src = root["trees"]["src"].as_str().unwrap().to_string();
    let deep = read_json(object(&src))["trees"]["deep"]
        .as_str()
        .unwrap()
        .to_string();
    let backup = sha(b"// lib\n");
    for (what, hex) in [("subtree", deep.as_str()), ("backup", backup.as_str())] {
        assert!(
            !seal.objects.contains(&hex.to_string()),
            "{what} is not listed"
        );
        let path = object(hex);
        let original = fs::read(&path).unwrap();
        fs::write(&path, b"changed").unwrap();
        let (code, report) = p.verify("r1");
        assert_eq!(code, INVALID_CAPSULE, "{what}: {report:#}");
        assert!(problems(&report).contains(hex), "{what}: {report:#}");
        fs::write(&path, original).unwrap();
        let aside = path.with_extension("aside");
        fs::rename(&path, &aside).unwrap();
        let (code, report) = p.verify("r1");
        assert_eq!(code, INVALID_CAPSULE, "{what} removed: {report:#}");
        assert!(
            problems(&report).contains(hex),
            "{what} removed: {report:#}"
        );
        fs::rename(&aside, &path).unwrap();
    }
    let (code, report) = p.verify("r1");
    assert_eq!(code, 0, "{report:#}");
}

/// Attack 4: an edited result.json with its SHA-256 (and the seal digest) recomputed.
#[test]
fn a_recomputed_seal_without_the_key_is_forged() {
    let p = project();
    assert_eq!(p.run("r1", "echo x >> a.txt").0, 0);
    let dir = p.run_dir("r1");
    let result = fs::read_to_string(dir.join("result.json")).unwrap();
    let edited = result.replace("\"review\"", "\"passed\"");
    assert_ne!(result, edited);
    fs::write(dir.join("result.json"), &edited).unwrap();
    p.forge_seal("r1", |s| {
        s.artifacts
            .insert("result.json".into(), sha(edited.as_bytes()));
    });
    let (code, report) = p.verify("r1");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert_eq!(report["verdict"], "forged");
    assert_eq!(report["authentication"]["state"], "forged");
    let out = p.agentdiff(&["verify", "r1"]);
    assert!(
        text(&out.stdout).starts_with("FORGED"),
        "{}",
        text(&out.stdout)
    );
    // The ledger records the genuine seal: stripping the MAC does not make it "unauthenticated".
    p.forge_seal("r1", |s| s.mac = None);
    let (code, report) = p.verify("r1");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert!(problems(&report).contains("ledger"), "{report:#}");
}

/// A genuine capsule verified without this user's key (another machine) is intact but not
/// authenticated, and says so; an older-format seal is named as such.
#[test]
fn without_the_key_a_genuine_capsule_is_intact_but_not_authenticated() {
    let p = project();
    assert_eq!(p.run("r1", "echo x >> a.txt").0, 0);
    let elsewhere = tempfile::tempdir().unwrap();
    let out = p.agentdiff_with_state(&["verify", "r1"], elsewhere.path());
    super::assert_exit(&out, UNAUTHENTICATED);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("NOT authenticated"), "{stdout}");
    assert!(stdout.contains("no seal key"), "{stdout}");
    assert!(
        !elsewhere.path().join("seal.key").exists(),
        "verify must not create a key"
    );

    // The previous format: no seal_format, digest, MAC or signature.
    let path = p.run_dir("r1").join("integrity.json");
    let mut seal: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let map = seal.as_object_mut().unwrap();
    for k in ["seal_format", "digest", "mac", "signature"] {
        map.remove(k);
    }
    fs::write(&path, serde_json::to_vec_pretty(&seal).unwrap()).unwrap();
    let out = p.agentdiff_with_state(&["verify", "r1"], elsewhere.path());
    super::assert_exit(&out, UNAUTHENTICATED);
    assert!(
        text(&out.stdout).contains("older seal format"),
        "{}",
        text(&out.stdout)
    );
    // Here, the ledger knows the run was sealed with the current format: an old-format seal for
    // it is a mismatch.
    let (code, report) = p.verify("r1");
    assert_eq!(code, INVALID_CAPSULE, "{report:#}");
    assert_eq!(report["format"], "legacy");
}

/// `verify --all` checks every run and names ledgered runs whose capsule is gone.
#[test]
fn verify_all_reports_every_run_and_ledgered_runs_that_are_missing() {
    let p = project();
    assert_eq!(p.run("r1", "true").0, 0);
    assert_eq!(p.run("r2", "true").0, 0);
    let out = p.agentdiff(&["verify", "--all"]);
    super::assert_exit(&out, 0);
    assert_eq!(text(&out.stdout).matches("authenticated: run").count(), 2);
    fs::remove_dir_all(p.run_dir("r1")).unwrap();
    let out = p.agentdiff(&["verify", "--all", "--format", "json"]);
    super::assert_exit(&out, INVALID_CAPSULE);
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all["missing_from_store"], serde_json::json!(["r1"]));
    assert_eq!(all["runs"][0]["verdict"], "authenticated");
}

/// A file or symlink planted in `runs/` is named as unverifiable; it does not stop the pass from
/// checking every real run.
#[test]
fn verify_all_goes_on_past_entries_that_are_not_capsules() {
    let p = project();
    assert_eq!(p.run("r1", "true").0, 0);
    assert_eq!(p.run("r2", "true").0, 0);
    let runs = p.run_dir("r1").parent().unwrap().to_path_buf();
    fs::write(runs.join("planted"), "not a run\n").unwrap();
    std::os::unix::fs::symlink(p.run_dir("r2"), runs.join("link")).unwrap();
    let out = p.agentdiff(&["verify", "--all", "--format", "json"]);
    super::assert_exit(&out, INVALID_CAPSULE);
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdicts: Vec<(&str, &str)> = all["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap(),
                r["verdict"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [("r1", "authenticated"), ("r2", "authenticated")],
        "{all:#}"
    );
    let odd: Vec<&str> = all["unverifiable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(odd, ["link", "planted"], "{all:#}");
    let out = p.agentdiff(&["verify", "--all"]);
    super::assert_exit(&out, INVALID_CAPSULE);
    assert!(
        text(&out.stdout).contains("CANNOT VERIFY: run planted"),
        "{}",
        text(&out.stdout)
    );
}

struct Victim(std::process::Child);
impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn victim() -> (Victim, Value) {
    let child = Command::new("sleep")
        .arg("300")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let id = agentdiff_process::read_identity(child.id()).unwrap();
    (Victim(child), serde_json::to_value(id).unwrap())
}

/// Attack 5: a capsule edited to name an unrelated process (its real pid and start time) with
/// the digests recomputed, and an unsealed run with a forged `launched` event: cleanup refuses and
/// the process survives.
#[test]
fn cleanup_refuses_forged_evidence_and_the_unrelated_process_survives() {
    let p = project();
    assert_eq!(p.run("r1", "true").0, 0);
    let (mut v, identity) = victim();
    let dir = p.run_dir("r1");
    let mut runtime: Value =
        serde_json::from_slice(&fs::read(dir.join("runtime.json")).unwrap()).unwrap();
    runtime["processes"] = serde_json::json!([{ "identity": identity, "ppid": 1,
        "relation": "reparented", "executable": "sleep", "first_seen_ms": 1,
        "alive_after_root_exit": true }]);
    let bytes = serde_json::to_vec_pretty(&runtime).unwrap();
    fs::write(dir.join("runtime.json"), &bytes).unwrap();
    p.forge_seal("r1", |s| {
        s.artifacts.insert("runtime.json".into(), sha(&bytes));
    });
    let out = p.agentdiff(&["cleanup", "r1", "--grace-period", "0.2"]);
    super::assert_exit(&out, INVALID_CAPSULE);
    assert!(
        text(&out.stderr).contains("refusing to clean up"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        v.0.try_wait().unwrap().is_none(),
        "the unrelated process was signalled"
    );

    // An unsealed run directory with a forged `launched` event.
    let forged = p.run_dir("ghost");
    fs::create_dir(&forged).unwrap();
    Command::new("chmod")
        .arg("700")
        .arg(&forged)
        .status()
        .unwrap();
    fs::write(forged.join("metadata.json"), r#"{"backend":"local"}"#).unwrap();
    let event = serde_json::json!({"seq": 0, "at": "x", "event": "launched",
        "root": identity, "pid": identity["pid"], "mac": "00".repeat(32)});
    fs::write(forged.join("events.jsonl"), format!("{event}\n")).unwrap();
    let out = p.agentdiff(&["cleanup", "ghost", "--grace-period", "0.2"]);
    super::assert_exit(&out, INVALID_CAPSULE);
    assert!(
        text(&out.stderr).contains("launched"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        v.0.try_wait().unwrap().is_none(),
        "the unrelated process was signalled"
    );

    // --force acts anyway, and says what the risk is.
    let out = p.agentdiff(&["cleanup", "r1", "--force", "--grace-period", "0.2"]);
    assert!(
        text(&out.stderr).contains("forged"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        v.0.wait().unwrap().code().is_none(),
        "--force should have signalled it"
    );
}

/// Attack 6: credential argv forms and guessable environment values do not reach the capsule.
#[test]
fn argv_secrets_are_redacted_and_environment_fingerprints_are_keyed() {
    let p = project();
    let bin = p.root.parent().unwrap().join("bin");
    fs::create_dir(&bin).unwrap();
    agentdiff_test_support::write_executable(&bin.join("mysql"), "#!/bin/sh\nexit 0\n", 0o755);
    let mysql = bin.join("mysql").display().to_string();
    let out = p
        .cmd(&["run", "--run-id", "secrets", "--", "sh", "-c", "true", "x"])
        .args(["-u", "admin:Pw-one-q9z", "--oauth2-bearer", "Tok-two-q9z"])
        .args([
            "-H",
            "X-Api-Key: Key-three-q9z",
            "-H",
            "Authorization: Bearer Tok-four-q9z",
        ])
        .env("PIN", "4821")
        .env("SOME_VALUE", "Env-six-q9z")
        .output()
        .unwrap();
    super::assert_exit(&out, 0);
    let out = p.agentdiff(&[
        "run",
        "--run-id",
        "mysql",
        "--",
        &mysql,
        "-uroot",
        "-pPw-five-q9z",
        "db",
    ]);
    super::assert_exit(&out, 0);
    for run in ["secrets", "mysql"] {
        for entry in fs::read_dir(p.run_dir(run)).unwrap() {
            let body = fs::read_to_string(entry.unwrap().path()).unwrap();
            for secret in [
                "Pw-one",
                "Tok-two",
                "Key-three",
                "Tok-four",
                "Pw-five",
                "Env-six",
            ] {
                assert!(
                    !body.contains(secret),
                    "{secret} reached the capsule of {run}"
                );
            }
        }
    }
    let runtime: Value =
        serde_json::from_slice(&fs::read(p.run_dir("secrets").join("runtime.json")).unwrap())
            .unwrap();
    let fp = runtime["environment"]["variables"]["PIN"].as_str().unwrap();
    assert!(fp.starts_with("hmac-sha256:"), "{fp}");
    let guessed = (0..10_000).any(|pin| {
        let unkeyed = agentdiff_host::redact::fingerprint("PIN", format!("{pin:04}").as_bytes());
        fp.contains(&unkeyed["sha256:".len()..])
    });
    assert!(!guessed, "the PIN is recoverable offline from {fp}");
}

/// ≥ 1,000 single-bit flips over every artifact, every integrity.json field and the manifest
/// entries object of a real capsule: every one is detected (the verdict is never authenticated or
/// intact).
#[test]
fn bit_flips_anywhere_in_a_capsule_are_all_detected() {
    let p = project();
    fs::write(p.root.join("c.txt"), "c\n").unwrap();
    assert_eq!(
        p.run("r1", "echo x >> a.txt; rm b.txt; echo n > n.txt").0,
        0
    );
    let store = Store::open_existing(&p.root).unwrap();
    let ctx = VerifyContext::for_user(&StateDir::at(&p.state).unwrap(), &p.root).unwrap();
    let capsule = store.open_run("r1").unwrap();
    assert_eq!(
        capsule.verify_with(store.objects(), &ctx).unwrap().verdict,
        Verdict::Authenticated
    );
    let dir = p.run_dir("r1");
    // Every sealed file (recovery artifacts such as recovery-events.jsonl are written after the
    // seal and are, by design, not covered by it).
    let mut targets: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            agentdiff_store::Artifact::from_file_name(name).is_some()
        })
        .collect();
    assert_eq!(targets.len(), 8, "{targets:?}");
    targets.sort();
    let before: Value =
        serde_json::from_slice(&fs::read(dir.join("before.json")).unwrap()).unwrap();
    let entries = before["root_tree"]["sha256"].as_str().unwrap();
    targets.push(store.objects().object_path(entries).unwrap());

    // Deterministic xorshift so a failure can be replayed.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut flips = 0;
    let mut undetected = Vec::new();
    let mut flip_at = |path: &Path, byte: usize, bit: u8, flips: &mut usize| {
        let original = fs::read(path).unwrap();
        let mut bytes = original.clone();
        bytes[byte] ^= 1 << bit;
        fs::write(path, &bytes).unwrap();
        let report = capsule.verify_with(store.objects(), &ctx).unwrap();
        if matches!(
            report.verdict,
            Verdict::Authenticated | Verdict::IntactNotAuthenticated
        ) {
            undetected.push(format!("{} byte {byte} bit {bit}", path.display()));
        }
        fs::write(path, &original).unwrap();
        *flips += 1;
    };
    for path in &targets {
        let len = fs::metadata(path).unwrap().len() as usize;
        for _ in 0..110 {
            let byte = (next() % len as u64) as usize;
            let bit = (next() % 8) as u8;
            flip_at(path, byte, bit, &mut flips);
        }
    }
    // Every field of integrity.json: 40 flips inside each field's line(s).
    let seal_path = dir.join("integrity.json");
    let seal_text = fs::read_to_string(&seal_path).unwrap();
    for field in [
        "schema_version",
        "seal_format",
        "algorithm",
        "run_id",
        "sealed_at",
        "artifacts",
        "objects",
        "digest",
        "mac",
    ] {
        let start = seal_text.find(&format!("\"{field}\"")).unwrap();
        let end = seal_text[start..]
            .find("\n  \"")
            .map(|e| start + e)
            .unwrap_or(seal_text.len());
        for _ in 0..40 {
            let byte = start + (next() % (end - start) as u64) as usize;
            let bit = (next() % 8) as u8;
            flip_at(&seal_path, byte, bit, &mut flips);
        }
    }
    assert!(flips >= 1000, "only {flips} flips");
    assert!(
        undetected.is_empty(),
        "{} of {flips} flips undetected: {undetected:?}",
        undetected.len()
    );
    assert_eq!(
        capsule.verify_with(store.objects(), &ctx).unwrap().verdict,
        Verdict::Authenticated
    );
}
