//! Signed evidence through the binary: seals signed with the user's Ed25519 key authenticate on
//! another "machine" (another state directory) only under `--trusted-keys`; attestations (DSSE +
//! in-toto) verify with agentdiff and with an independent implementation (securesystemslib), and
//! a tampered payload, a wrong key, a swapped subject digest and a replayed envelope fail both.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::Value;

use super::{agentdiff, assert_exit, cmd, json_of, run_json, text};

const UNAUTHENTICATED: i32 = 77;
const INVALID: i32 = 67;

struct Project {
    _dir: tempfile::TempDir,
    root: PathBuf,
    out: PathBuf,
}

fn project() -> Project {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(root.join("keep.txt"), "keep\n").unwrap();
    Project {
        _dir: dir,
        root,
        out,
    }
}

/// A run that writes a file, and its id.
fn a_run(p: &Project, content: &str) -> String {
    let script = format!("printf '{content}' > made.txt");
    let (code, result, out) = run_json(&p.root, &[], &["sh", "-c", &script]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    result["run_id"].as_str().unwrap().to_string()
}

/// The public key of the state directory `state` (created on first use), in a trusted-keys file.
fn trusted_file(p: &Project, state: Option<&Path>, name: &str) -> PathBuf {
    let mut c = cmd(&p.root, &["key", "show", "--format", "json"]);
    if let Some(s) = state {
        c.env("AGENTDIFF_STATE_DIR", s);
    }
    let out = c.output().unwrap();
    assert_exit(&out, 0);
    let doc = json_of(&out);
    let path = p.out.join(name);
    std::fs::write(&path, doc["pem"].as_str().unwrap()).unwrap();
    path
}

fn attest(p: &Project, run: &str, name: &str) -> PathBuf {
    let path = p.out.join(name);
    let out = agentdiff(&p.root, &["attest", run, "--out", path.to_str().unwrap()]);
    assert_exit(&out, 0);
    path
}

fn verify_attestation(p: &Project, file: &Path, keys: Option<&Path>, run: Option<&str>) -> i32 {
    let mut args = vec!["verify", "--attestation", file.to_str().unwrap()];
    if let Some(k) = keys {
        args.extend(["--trusted-keys", k.to_str().unwrap()]);
    }
    if let Some(r) = run {
        args.push(r);
    }
    agentdiff(&p.root, &args).status.code().unwrap_or(-1)
}

/// The envelope at `file` with its statement changed by `edit` (payload re-encoded, signature
/// kept): what an attacker without the key can make.
fn tampered(file: &Path, out: &Path, edit: impl Fn(&mut Value)) -> PathBuf {
    let mut env: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
    let payload = B64.decode(env["payload"].as_str().unwrap()).unwrap();
    let mut statement: Value = serde_json::from_slice(&payload).unwrap();
    edit(&mut statement);
    env["payload"] = Value::from(B64.encode(serde_json::to_vec(&statement).unwrap()));
    std::fs::write(out, serde_json::to_vec(&env).unwrap()).unwrap();
    out.to_path_buf()
}

fn swap_file_digest(st: &mut Value) {
    let subject = st["subject"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|s| s["name"] == "made.txt")
        .expect("the written file is a subject");
    subject["digest"]["sha256"] = Value::from("0".repeat(64));
}

#[test]
fn an_attestation_names_the_changed_files_and_the_capsule_and_verifies_with_the_key() {
    let p = project();
    let run = a_run(&p, "hello");
    let keys = trusted_file(&p, None, "trusted.pem");
    let file = attest(&p, &run, "a.json");
    let env: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(env["payloadType"], "application/vnd.in-toto+json");
    let statement: Value =
        serde_json::from_slice(&B64.decode(env["payload"].as_str().unwrap()).unwrap()).unwrap();
    assert_eq!(statement["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(
        statement["predicateType"],
        "https://agentdiff.dev/attestation/run/v1"
    );
    let subjects = statement["subject"].as_array().unwrap();
    let made = subjects.iter().find(|s| s["name"] == "made.txt").unwrap();
    // sha256("hello")
    assert_eq!(
        made["digest"]["sha256"],
        "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    );
    assert!(subjects
        .iter()
        .any(|s| s["name"] == format!("agentdiff-capsule:{run}")));
    assert_eq!(statement["predicate"]["run_id"], run.as_str());
    let schema: Value = serde_json::from_slice(
        &std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../docs/schemas/attestation-predicate.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let v = agentdiff_conformance::schema::validate(&schema, &statement["predicate"]);
    assert!(
        v.is_valid(),
        "predicate against its schema: {:#?}",
        v.errors
    );
    assert!(v.ignored_keywords.is_empty(), "{:?}", v.ignored_keywords);
    assert_eq!(statement["predicate"]["backend"], "local");
    assert!(statement["predicate"]["labels"]["filesystem_writes"].is_string());

    assert_eq!(verify_attestation(&p, &file, Some(&keys), None), 0);
    assert_eq!(verify_attestation(&p, &file, Some(&keys), Some(&run)), 0);
    // Who signed shows where the seal is shown.
    let key_id = json_of(&agentdiff(&p.root, &["key", "show", "--format", "json"]))["key_id"]
        .as_str()
        .unwrap()
        .to_string();
    let inspect = agentdiff(&p.root, &["inspect", &run]);
    let html = agentdiff(&p.root, &["inspect", &run, "--format", "html"]);
    for shown in [
        text(&inspect.stdout) + &text(&inspect.stderr),
        text(&html.stdout),
    ] {
        assert!(shown.contains(&key_id), "the signer is not shown: {shown}");
    }
    // Without a trusted key nothing is authenticated.
    assert_eq!(verify_attestation(&p, &file, None, None), UNAUTHENTICATED);
}

#[test]
fn tampering_a_wrong_key_and_a_replayed_envelope_fail() {
    let p = project();
    let run_a = a_run(&p, "a");
    let run_b = a_run(&p, "b");
    let keys = trusted_file(&p, None, "trusted.pem");
    let other_state = p.out.join("other-state");
    let wrong = trusted_file(&p, Some(&other_state), "wrong.pem");
    let file = attest(&p, &run_a, "a.json");

    let swapped = tampered(&file, &p.out.join("swapped.json"), swap_file_digest);
    assert_eq!(verify_attestation(&p, &swapped, Some(&keys), None), INVALID);
    let renamed = tampered(&file, &p.out.join("renamed.json"), |st| {
        st["predicate"]["status"] = Value::from("passed-by-hand");
    });
    assert_eq!(verify_attestation(&p, &renamed, Some(&keys), None), INVALID);
    // Another key: nothing it signed, and nothing of ours it can vouch for.
    assert_eq!(
        verify_attestation(&p, &file, Some(&wrong), None),
        UNAUTHENTICATED
    );
    // A genuine envelope of run A offered for run B.
    assert_eq!(
        verify_attestation(&p, &file, Some(&keys), Some(&run_b)),
        INVALID
    );
}

#[test]
fn a_capsule_on_another_machine_authenticates_only_with_trusted_keys() {
    let p = project();
    let run = a_run(&p, "x");
    let keys = trusted_file(&p, None, "trusted.pem");
    // "Another machine": its own state directory, with its own seal key and an empty ledger.
    let elsewhere = p.out.join("elsewhere");
    let verify = |extra: &[&str]| {
        let mut args = vec!["verify", run.as_str()];
        args.extend_from_slice(extra);
        let mut c = cmd(&p.root, &args);
        c.env("AGENTDIFF_STATE_DIR", &elsewhere);
        c.output().unwrap()
    };
    // Its seal key comes into being on first use there.
    let mut init = cmd(&p.root, &["key", "show"]);
    init.env("AGENTDIFF_STATE_DIR", &elsewhere);
    assert_exit(&init.output().unwrap(), 0);
    assert_exit(&verify(&[]), UNAUTHENTICATED);
    let out = verify(&["--trusted-keys", keys.to_str().unwrap(), "--format", "json"]);
    assert_exit(&out, 0);
    let report = json_of(&out);
    assert_eq!(report["verdict"], "authenticated");
    assert_eq!(report["authentication"]["by_signature"], true);
    // A changed artifact is still found under the trusted key.
    let result = p
        .root
        .join(".agentdiff/runs")
        .join(&run)
        .join("result.json");
    let mut bytes = std::fs::read(&result).unwrap();
    let at = bytes.iter().position(|b| *b == b'{').unwrap();
    bytes.insert(at + 1, b' ');
    std::fs::write(&result, bytes).unwrap();
    assert_exit(
        &verify(&["--trusted-keys", keys.to_str().unwrap()]),
        INVALID,
    );
}

#[test]
fn run_attest_writes_the_runs_attestation_and_a_key_file_inside_the_project_is_refused() {
    let p = project();
    let file = p.out.join("run.json");
    let (code, result, out) = run_json(
        &p.root,
        &["--attest", file.to_str().unwrap()],
        &["sh", "-c", "echo y > y.txt"],
    );
    assert_eq!(code, 0, "{}", text(&out.stderr));
    let keys = trusted_file(&p, None, "trusted.pem");
    let run = result["run_id"].as_str().unwrap();
    assert_eq!(verify_attestation(&p, &file, Some(&keys), Some(run)), 0);

    let inside = p.root.join("signing.key");
    std::fs::write(&inside, [9u8; 32]).unwrap();
    let mut c = cmd(&p.root, &["attest", run]);
    c.env("AGENTDIFF_SIGNING_KEY_FILE", &inside);
    let out = c.output().unwrap();
    assert_exit(&out, 65);
    assert!(
        text(&out.stderr).contains("inside the project root"),
        "{}",
        text(&out.stderr)
    );
}

/// The independent verifier: securesystemslib's DSSE envelope and Ed25519 key, plus the check
/// that the statement attests the expected capsule. Prints `ok` or the failure.
const PY_VERIFY: &str = r#"
import json, sys
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
env_path, key_path, run_id, seal = sys.argv[1:5]
keydict = json.load(open(key_path))
key = SSlibKey(keydict["keyid"], keydict["keytype"], keydict["scheme"], keydict["keyval"])
envelope = Envelope.from_dict(json.load(open(env_path)))
try:
    envelope.verify([key], 1)
except Exception as e:
    print("signature:", type(e).__name__, e); sys.exit(1)
statement = json.loads(envelope.payload)
want = "agentdiff-capsule:" + run_id
found = [s for s in statement["subject"] if s["name"] == want and s["digest"]["sha256"] == seal]
if not found:
    print("subject: not an attestation of", want); sys.exit(1)
print("ok")
"#;

fn python_has_securesystemslib() -> bool {
    Command::new("python3")
        .args([
            "-c",
            "import securesystemslib.dsse, securesystemslib.signer",
        ])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn an_independent_dsse_verifier_accepts_ours_and_rejects_each_forgery() {
    if !python_has_securesystemslib() {
        agentdiff_test_support::skip(
            "python3 with securesystemslib is not installed (pip install securesystemslib \
             cryptography)",
        );
        return;
    }
    let p = project();
    let run_a = a_run(&p, "a");
    let run_b = a_run(&p, "b");
    let key_out = agentdiff(&p.root, &["key", "show", "--format", "json"]);
    assert_exit(&key_out, 0);
    let sslib = p.out.join("key.json");
    std::fs::write(&sslib, json_of(&key_out)["securesystemslib"].to_string()).unwrap();
    let other_state = p.out.join("other");
    let mut other = cmd(&p.root, &["key", "show", "--format", "json"]);
    other.env("AGENTDIFF_STATE_DIR", &other_state);
    let other_out = other.output().unwrap();
    assert_exit(&other_out, 0);
    let wrong = p.out.join("wrong.json");
    std::fs::write(&wrong, json_of(&other_out)["securesystemslib"].to_string()).unwrap();
    let seal_of = |run: &str| {
        let out = agentdiff(&p.root, &["verify", run, "--format", "json"]);
        json_of(&out)["authentication"]["seal_digest"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (seal_a, seal_b) = (seal_of(&run_a), seal_of(&run_b));
    let file = attest(&p, &run_a, "a.json");
    let py = |env: &Path, key: &Path, run: &str, seal: &str| {
        let out = Command::new("python3")
            .args(["-c", PY_VERIFY])
            .arg(env)
            .arg(key)
            .args([run, seal])
            .output()
            .unwrap();
        (out.status.success(), text(&out.stdout) + &text(&out.stderr))
    };
    let (ok, said) = py(&file, &sslib, &run_a, &seal_a);
    assert!(ok, "{said}");
    let swapped = tampered(&file, &p.out.join("swapped.json"), swap_file_digest);
    assert!(!py(&swapped, &sslib, &run_a, &seal_a).0);
    let changed = tampered(&file, &p.out.join("changed.json"), |st| {
        st["predicate"]["exit_code"] = Value::from(0);
        st["predicate"]["safety_outcome"] = Value::from("allow");
        st["predicate"]["changes"] = Value::from(Vec::<Value>::new());
    });
    assert!(!py(&changed, &sslib, &run_a, &seal_a).0);
    assert!(!py(&file, &wrong, &run_a, &seal_a).0);
    // The genuine envelope of run A, offered as run B's.
    assert!(!py(&file, &sslib, &run_b, &seal_b).0);
}

/// Without --trusted-keys, a payload changed after `agentdiff attest` (its signer's key is this
/// user's own) or replaced by garbage is forged, as is an envelope of another run offered with
/// RUN; only a well-formed, unchanged envelope stays not authenticated (77).
#[test]
fn a_changed_or_garbage_payload_is_forged_without_trusted_keys() {
    let p = project();
    let run_a = a_run(&p, "a");
    let run_b = a_run(&p, "b");
    let file = attest(&p, &run_a, "a.json");
    assert_eq!(verify_attestation(&p, &file, None, None), UNAUTHENTICATED);
    assert_eq!(
        verify_attestation(&p, &file, None, Some(&run_a)),
        UNAUTHENTICATED
    );
    let renamed = tampered(&file, &p.out.join("renamed.json"), |st| {
        st["subject"][0]["name"] = Value::from("other.txt");
    });
    assert_eq!(verify_attestation(&p, &renamed, None, None), INVALID);
    assert_eq!(
        verify_attestation(&p, &renamed, None, Some(&run_a)),
        INVALID
    );
    let mut env: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    env["payload"] = Value::from(B64.encode("not a statement at all"));
    let garbage = p.out.join("garbage.json");
    std::fs::write(&garbage, serde_json::to_vec(&env).unwrap()).unwrap();
    assert_eq!(verify_attestation(&p, &garbage, None, None), INVALID);
    assert_eq!(
        verify_attestation(&p, &garbage, None, Some(&run_a)),
        INVALID
    );
    let out = agentdiff(
        &p.root,
        &[
            "verify",
            "--attestation",
            garbage.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert_eq!(json_of(&out)["verdict"], "forged");
    // Signed by a key nobody here knows: intact as far as can be told, but with RUN it must
    // still name that run's capsule.
    let mut env: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    env["signatures"][0]["keyid"] = Value::from("f".repeat(64));
    let foreign = p.out.join("foreign.json");
    std::fs::write(&foreign, serde_json::to_vec(&env).unwrap()).unwrap();
    assert_eq!(
        verify_attestation(&p, &foreign, None, None),
        UNAUTHENTICATED
    );
    assert_eq!(
        verify_attestation(&p, &foreign, None, Some(&run_b)),
        INVALID
    );
    assert_eq!(verify_attestation(&p, &file, None, Some(&run_b)), INVALID);
}
