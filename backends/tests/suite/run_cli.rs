//! `agentdiff run`, `verify`, `inspect` and `runs` end to end on the local backend.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{agentdiff, assert_exit, cmd, run_json, text};

fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("a.txt"), "a\n").unwrap();
    fs::write(dir.path().join("c.txt"), "c\n").unwrap();
    fs::create_dir(dir.path().join("src")).unwrap();
    fs::write(dir.path().join("src/lib.rs"), "// lib\n").unwrap();
    dir
}

fn change<'a>(result: &'a Value, path: &str) -> &'a Value {
    result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == path)
        .unwrap_or_else(|| panic!("no change for {path} in {result:#}"))
}

const EDIT: &str = "echo x >> a.txt; echo y > b.txt; rm c.txt";

#[test]
fn edits_are_recorded_and_reviewed_under_the_builtin_policy() {
    let p = project();
    let (code, r, _) = run_json(p.path(), &[], &["sh", "-c", EDIT]);
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "review");
    assert_eq!(r["safety_outcome"], "review");
    assert_eq!(r["schema_version"], 1);
    assert_eq!(r["command_decision"]["action"], "allow");
    assert_eq!(change(&r, "a.txt")["change_type"], "modified");
    assert_eq!(change(&r, "b.txt")["change_type"], "created");
    assert_eq!(change(&r, "c.txt")["change_type"], "deleted");
    for path in ["a.txt", "b.txt", "c.txt"] {
        let c = change(&r, path);
        assert_eq!(c["decision"], "review", "{path}");
        assert_eq!(c["policy_decision"]["rule"], "filesystem.default", "{path}");
        assert_eq!(c["policy_decision"]["phase"], "post_run", "{path}");
        assert_eq!(c["reversible"], true, "{path}");
    }
    assert_eq!(r["changes"].as_array().unwrap().len(), 3, "{r:#}");
    // review_created 8 + review_modified 4 + review_deleted 12
    assert_eq!(r["blast_radius"]["score"], 24);
    assert_eq!(r["blast_radius"]["level"], "moderate");
    assert_eq!(r["runtime"]["backend"], "local");
    assert_eq!(r["runtime"]["sandboxed"], false);
    assert_eq!(r["runtime"]["network_enforcement"], false);

    // The same run under --fail-on review fails the gate.
    let p = project();
    let (code, r, _) = run_json(p.path(), &["--fail-on", "review"], &["sh", "-c", EDIT]);
    assert_eq!(r["status"], "review");
    assert_eq!(code, 72);
}

#[test]
fn writing_env_is_denied_and_fails_the_default_gate() {
    let p = project();
    let (code, r, _) = run_json(p.path(), &[], &["sh", "-c", "echo TOKEN=1 > .env"]);
    assert_eq!(r["status"], "denied");
    assert_eq!(r["safety_outcome"], "deny");
    let c = change(&r, ".env");
    assert_eq!(c["decision"], "deny");
    assert_eq!(c["policy_decision"]["rule"], "filesystem.deny[0]");
    assert_eq!(c["sensitive"], true);
    assert_eq!(code, 71);
    // --fail-on never collects evidence without failing.
    let p = project();
    let (code, r, _) = run_json(
        p.path(),
        &["--fail-on", "never"],
        &["sh", "-c", "echo TOKEN=1 > .env"],
    );
    assert_eq!(r["status"], "denied");
    assert_eq!(code, 0);
}

#[test]
fn the_childs_exit_code_passes_through() {
    let p = project();
    let (code, r, _) = run_json(p.path(), &[], &["sh", "-c", "exit 7"]);
    assert_eq!(code, 7);
    assert_eq!(r["status"], "failed");
    assert_eq!(r["exit_code"], 7);
}

#[test]
fn a_missing_executable_fails_with_127() {
    let p = project();
    let (code, r, _) = run_json(p.path(), &[], &["definitely-not-a-command-agentdiff"]);
    assert_eq!(r["status"], "failed", "{r:#}");
    assert_eq!(code, 127);
    assert!(r["execution_error"]
        .as_str()
        .unwrap()
        .contains("could not be launched"));
    // Nothing ran, so no change was decided: the summary claims no policy outcome.
    let out = agentdiff(
        p.path(),
        &["run", "--", "definitely-not-a-command-agentdiff"],
    );
    assert_exit(&out, 127);
    let summary = text(&out.stderr);
    assert!(
        summary.contains("policy outcome: none (nothing ran)"),
        "{summary}"
    );
}

#[test]
fn json_mode_keeps_stdout_one_document() {
    let p = project();
    let (_, r, out) = run_json(
        p.path(),
        &[],
        &["sh", "-c", "echo from-child; echo err >&2"],
    );
    assert_eq!(r["status"], "passed");
    let stderr = text(&out.stderr);
    assert!(stderr.contains("from-child"), "{stderr}");
    assert!(stderr.contains("err"), "{stderr}");
}

#[test]
fn a_timeout_ends_the_whole_tree() {
    let p = project();
    // A sleep duration nothing else on the machine uses marks the run's processes.
    let secs = 400_000 + std::process::id() % 100_000;
    let marker = format!("sleep {secs}");
    let started = Instant::now();
    let script = format!("{marker} & (sh -c '{marker}' &) ; wait");
    let (code, r, _) = run_json(p.path(), &["--timeout", "1"], &["sh", "-c", &script]);
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(code, 124, "{r:#}");
    assert_eq!(r["status"], "timed_out");
    assert_eq!(r["runtime"]["exit"]["timed_out"], true);
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.trim() == marker),
        "a process of the run survived:\n{ps}"
    );
}

#[test]
fn a_denied_command_is_blocked_and_never_runs() {
    let p = project();
    fs::write(
        p.path().join("agentdiff.yaml"),
        "version: 1\nprocess:\n  deny: [touch]\n",
    )
    .unwrap();
    let (code, r, _) = run_json(p.path(), &[], &["touch", "ran.txt"]);
    assert_eq!(code, 73);
    assert_eq!(r["status"], "blocked");
    assert_eq!(r["command_decision"]["action"], "deny");
    assert_eq!(r["command_decision"]["rule"], "process.deny[0]");
    assert!(!p.path().join("ran.txt").exists());
    // The refusal is sealed evidence.
    let out = agentdiff(p.path(), &["verify", r["run_id"].as_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn bad_input_gets_documented_codes_and_changes_nothing() {
    let p = project();
    fs::write(
        p.path().join("bad.yaml"),
        "version: 1\nfilesystem:\n  alow_write: []\n",
    )
    .unwrap();
    let out = agentdiff(
        p.path(),
        &["run", "--policy", "bad.yaml", "--", "touch", "x"],
    );
    assert_eq!(out.status.code(), Some(65));
    assert!(text(&out.stderr).contains("filesystem.alow_write"));
    assert!(!p.path().join("x").exists());

    let out = agentdiff(p.path(), &["run", "--runtime", "nope", "--", "true"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("unknown runtime backend `nope`"));

    let out = agentdiff(p.path(), &["run", "--image", "x", "--", "true"]);
    assert_eq!(out.status.code(), Some(64));

    let out = agentdiff(p.path(), &["run"]);
    assert_eq!(out.status.code(), Some(64));

    let out = agentdiff(
        p.path(),
        &["run", "--run-id", "../evil", "--", "touch", "x"],
    );
    assert_eq!(out.status.code(), Some(66));
    assert!(!p.path().join("x").exists());
    assert!(!p.path().join(".agentdiff/evil").exists());

    let out = agentdiff(p.path(), &["verify", "no-such-run"]);
    assert_eq!(out.status.code(), Some(66));
}

#[test]
fn allow_host_is_recorded_in_the_effective_policy() {
    let p = project();
    let (code, r, _) = run_json(
        p.path(),
        &[
            "--allow-host",
            "api.example.com:443",
            "--allow-host",
            "*.test",
        ],
        &["true"],
    );
    assert_eq!(code, 0, "{r:#}");
    // The local backend does not route the command through the egress proxy: the run says the
    // allowlist was not applied, and seals no connection log.
    let warnings = r["observation_warnings"].to_string();
    assert!(
        warnings.contains("did not apply the allowlist (network `uncontrolled`)"),
        "{r:#}"
    );
    assert_eq!(r["safety_outcome"], "review", "{r:#}");
    let id = r["run_id"].as_str().unwrap();
    let runtime: Value = serde_json::from_slice(
        &fs::read(
            p.path()
                .join(".agentdiff/runs")
                .join(id)
                .join("runtime.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(runtime.get("network").is_none(), "{runtime:#}");
    let policy: Value = serde_json::from_slice(
        &fs::read(
            p.path()
                .join(".agentdiff/runs")
                .join(id)
                .join("policy.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(policy["policy_version"], 2, "{policy:#}");
    assert_eq!(policy["source"]["kind"], "built_in");
    assert_eq!(
        policy["effective"]["network"]["egress"]["allow"],
        serde_json::json!(["api.example.com:443", "*.test"])
    );
    let schema: Value = serde_json::from_slice(
        &fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schemas/policy.schema.json"))
            .unwrap(),
    )
    .unwrap();
    let v = agentdiff_conformance::schema::validate(&schema, &policy);
    assert!(v.is_valid(), "{:#?}", v.errors);
    let out = agentdiff(p.path(), &["verify", id]);
    assert!(out.status.success(), "{}", text(&out.stdout));

    // A bad pattern is a usage error before anything runs.
    let out = agentdiff(
        p.path(),
        &["run", "--allow-host", "a*.test", "--", "touch", "x"],
    );
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--allow-host \"a*.test\""));
    assert!(!p.path().join("x").exists());
}

#[test]
fn a_requested_run_id_is_used_once() {
    let p = project();
    let (code, r, _) = run_json(p.path(), &["--run-id", "my-run.1"], &["true"]);
    assert_eq!(code, 0);
    assert_eq!(r["run_id"], "my-run.1");
    let out = agentdiff(
        p.path(),
        &["run", "--run-id", "my-run.1", "--", "touch", "again"],
    );
    assert_eq!(out.status.code(), Some(64));
    assert!(!p.path().join("again").exists());
}

#[test]
fn tampering_with_any_sealed_artifact_or_backup_is_named_by_verify() {
    let p = project();
    let (_, r, _) = run_json(p.path(), &[], &["sh", "-c", EDIT]);
    let id = r["run_id"].as_str().unwrap().to_string();
    let run_dir = p.path().join(".agentdiff/runs").join(&id);
    let ok = agentdiff(p.path(), &["verify", &id]);
    assert!(ok.status.success(), "{}", text(&ok.stdout));

    let integrity: Value =
        serde_json::from_slice(&fs::read(run_dir.join("integrity.json")).unwrap()).unwrap();
    let mut targets: Vec<(PathBuf, String)> = integrity["artifacts"]
        .as_object()
        .unwrap()
        .keys()
        .map(|name| (run_dir.join(name), name.clone()))
        .collect();
    assert!(targets.len() >= 7, "{integrity:#}");
    let objects = integrity["objects"].as_array().unwrap();
    assert!(
        !objects.is_empty(),
        "the run's backups are referenced by the seal"
    );
    for o in objects {
        let hex = o.as_str().unwrap();
        targets.push((
            p.path()
                .join(".agentdiff/objects/sha256")
                .join(&hex[..2])
                .join(&hex[2..]),
            hex.to_string(),
        ));
    }
    for (path, name) in targets {
        let original = fs::read(&path).unwrap();
        let mut flipped = original.clone();
        let i = flipped.len() / 2;
        flipped[i] ^= 0x01;
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, &flipped).unwrap();
        let out = agentdiff(p.path(), &["verify", &id]);
        let stdout = text(&out.stdout);
        assert_eq!(out.status.code(), Some(67), "{name}: {stdout}");
        assert!(
            stdout.contains(&name),
            "verify does not name {name}: {stdout}"
        );
        fs::write(&path, &original).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }
    let ok = agentdiff(p.path(), &["verify", &id]);
    assert!(ok.status.success());
}

#[test]
fn a_symlink_to_a_directory_outside_the_root_is_never_followed() {
    let p = project();
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("secret.txt"), "outside\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), p.path().join("link")).unwrap();
    let (code, r, _) = run_json(
        p.path(),
        &["--fail-on", "never"],
        &["sh", "-c", "echo changed > link/secret.txt"],
    );
    assert_eq!(code, 0);
    // The write went through the link (the local backend is not a sandbox), but the scanner
    // never followed it: nothing below the link is in the manifests or the changes.
    assert!(r["changes"].as_array().unwrap().is_empty(), "{r:#}");
    let id = r["run_id"].as_str().unwrap();
    let before = agentdiff(p.path(), &["inspect", id, "--artifact", "before"]);
    let before: Value = serde_json::from_slice(&before.stdout).unwrap();
    let entries = before["entries"].as_object().unwrap();
    assert_eq!(entries["link"]["kind"], "symlink");
    assert!(entries.keys().all(|k| !k.starts_with("link/")));
}

#[test]
fn a_fifo_in_the_tree_does_not_hang_the_scan() {
    let p = project();
    let fifo = p.path().join("pipe");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let started = Instant::now();
    let (code, r, _) = run_json(p.path(), &[], &["true"]);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(code, 0, "{r:#}");
    assert!(r["summary"]["unsupported_entries"].as_u64().unwrap() >= 1);
}

#[test]
fn the_summary_tells_a_person_what_happened() {
    let p = project();
    let out = agentdiff(p.path(), &["run", "--", "sh", "-c", EDIT]);
    assert_eq!(out.status.code(), Some(0));
    let summary = text(&out.stderr);
    for needle in [
        "task completed",
        "changes: 3 (0 expected, 3 for review, 0 protected)",
        "modified a.txt",
        "added    b.txt",
        "deleted  c.txt",
        "blast radius: moderate (24/100)",
        "policy outcome: review",
        "recovery: available",
        "status: review",
    ] {
        assert!(
            summary.contains(needle),
            "missing `{needle}` in:\n{summary}"
        );
    }
    let runs = agentdiff(p.path(), &["runs"]);
    assert!(text(&runs.stdout).contains("review"));
}

#[test]
fn the_store_is_private_and_never_committed() {
    let p = project();
    let (_, r, _) = run_json(p.path(), &[], &["true"]);
    let store = p.path().join(".agentdiff");
    assert_eq!(
        fs::read_to_string(store.join(".gitignore")).unwrap().trim(),
        "*"
    );
    let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&store), 0o700);
    let run_dir = store.join("runs").join(r["run_id"].as_str().unwrap());
    assert_eq!(mode(&run_dir), 0o700);
    for entry in fs::read_dir(&run_dir).unwrap() {
        let entry = entry.unwrap();
        assert_eq!(mode(&entry.path()), 0o600, "{:?}", entry.file_name());
    }
}

/// Every artifact of a real capsule validates against its published schema in docs/schemas.
#[test]
fn capsule_artifacts_validate_against_the_published_schemas() {
    use agentdiff_conformance::schema::validate;

    let schema_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schemas");
    let load = |name: &str| -> Value {
        serde_json::from_slice(&fs::read(schema_dir.join(name)).unwrap()).unwrap()
    };
    let check = |schema: &str, doc: &Value, what: &str| {
        let v = validate(&load(schema), doc);
        assert!(v.is_valid(), "{what} against {schema}: {:#?}", v.errors);
        assert!(
            v.ignored_keywords.is_empty(),
            "{schema} uses keywords the validator does not check: {:?}",
            v.ignored_keywords
        );
    };

    let p = project();
    fs::write(p.path().join("data.bin"), [0u8, 1, 2]).unwrap();
    // Changes of every kind, a leftover daemon, a denied path and a timeout-free exit.
    let (_, r, _) = run_json(
        p.path(),
        &["--fail-on", "never", "--task", "schema check"],
        &[
            "sh",
            "-c",
            "echo x >> a.txt; echo y > b.txt; rm c.txt; chmod 755 src/lib.rs; mkdir d; \
             echo T=1 > .env; ln -s a.txt l; (sleep 30 &) ; exit 0",
        ],
    );
    let id = r["run_id"].as_str().unwrap();
    let run_dir = p.path().join(".agentdiff/runs").join(id);
    let read = |name: &str| -> Value {
        serde_json::from_slice(&fs::read(run_dir.join(name)).unwrap()).unwrap()
    };
    check("result.schema.json", &r, "result (stdout)");
    check("result.schema.json", &read("result.json"), "result.json");
    check(
        "metadata.schema.json",
        &read("metadata.json"),
        "metadata.json",
    );
    check("policy.schema.json", &read("policy.json"), "policy.json");
    check("runtime.schema.json", &read("runtime.json"), "runtime.json");
    check(
        "integrity.schema.json",
        &read("integrity.json"),
        "integrity.json",
    );
    for name in ["before.json", "after.json"] {
        let header = read(name);
        check("manifest.schema.json", &header, name);
        assert_eq!(header["schema_version"], 2, "{name}");
        // Every tree object below the root, each against the tree schema.
        let mut stack = vec![header["root_tree"]["sha256"].as_str().unwrap().to_string()];
        let mut trees = 0;
        while let Some(hex) = stack.pop() {
            let object = p
                .path()
                .join(".agentdiff/objects/sha256")
                .join(&hex[..2])
                .join(&hex[2..]);
            let tree: Value = serde_json::from_slice(&fs::read(object).unwrap()).unwrap();
            check("manifest-tree.schema.json", &tree, name);
            for sub in tree["trees"].as_object().unwrap().values() {
                stack.push(sub.as_str().unwrap().to_string());
            }
            trees += 1;
        }
        assert_eq!(header["root_tree"]["trees"], trees, "{name}");
    }
    let events = fs::read_to_string(run_dir.join("events.jsonl")).unwrap();
    for line in events.lines() {
        check(
            "event.schema.json",
            &serde_json::from_str(line).unwrap(),
            "events.jsonl",
        );
    }
    // The typed reader reads every artifact back, and writes it out again unchanged: the reader
    // and the writer share one set of types and nothing is dropped.
    let store = agentdiff_store::Store::open_existing(p.path()).unwrap();
    let capsule = store.open_run(id).unwrap();
    let same = |typed: Value, name: &str| assert_eq!(typed, read(name), "{name} round trip");
    same(
        serde_json::to_value(capsule.metadata().unwrap()).unwrap(),
        "metadata.json",
    );
    same(
        serde_json::to_value(capsule.policy_doc().unwrap()).unwrap(),
        "policy.json",
    );
    same(
        serde_json::to_value(capsule.runtime().unwrap()).unwrap(),
        "runtime.json",
    );
    same(
        serde_json::to_value(capsule.result().unwrap()).unwrap(),
        "result.json",
    );
    let typed_events: Vec<Value> = capsule
        .events()
        .unwrap()
        .iter()
        .map(|e| serde_json::to_value(e).unwrap())
        .collect();
    let raw_events: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(typed_events, raw_events);
    assert!(capsule.launched_event().unwrap().unwrap().pid.is_some());
    // The run exercised the interesting parts of the schemas.
    assert!(r["changes"].as_array().unwrap().len() >= 6, "{r:#}");
    assert!(
        r["summary"]["leftover_processes"].as_u64().unwrap() >= 1,
        "{r:#}"
    );
}

/// A control that `doctor --probe --record` verified is cited by a run of the same backend and
/// options on this host, and only while the record is recent enough.
#[test]
fn runs_cite_recent_probe_records_for_the_same_backend_and_settings() {
    let p = project();
    let records = p.path().join("probes.json");
    let out = agentdiff(
        p.path(),
        &[
            "doctor",
            "--probe",
            "--runtime",
            "local",
            "--record",
            records.to_str().unwrap(),
            "--format",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doctor: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verified: Vec<String> = doctor["backends"][0]["probe"]["verified"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| *v == "verified")
        .map(|(k, _)| k.clone())
        .collect();
    assert!(!verified.is_empty(), "{doctor:#}");

    let rec = records.to_str().unwrap();
    let (_, r, _) = run_json(p.path(), &["--probe-records", rec], &["true"]);
    let mut cited: Vec<String> = r["runtime"]["verified_controls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["boundary"].as_str().unwrap().to_string())
        .collect();
    cited.sort();
    let mut expected = verified.clone();
    expected.sort();
    assert_eq!(cited, expected);
    // The declared labels are unchanged: a citation adds evidence, it does not relabel.
    assert_eq!(r["runtime"]["capabilities"]["network"], "uncontrolled");

    // Another backend's options do not match the record's settings digest.
    let (_, r, _) = run_json(
        p.path(),
        &[
            "--probe-records",
            rec,
            "--backend-option",
            "tracking=proc_poll",
        ],
        &["true"],
    );
    assert!(r["runtime"]["verified_controls"]
        .as_array()
        .unwrap()
        .is_empty());

    // A record older than --probe-max-age is not cited.
    let mut doc: Value = serde_json::from_slice(&fs::read(&records).unwrap()).unwrap();
    let made = doc[0]["made_at_unix"].as_u64().unwrap();
    doc[0]["made_at_unix"] = Value::from(made - 7200);
    fs::write(&records, serde_json::to_vec(&doc).unwrap()).unwrap();
    let (_, r, _) = run_json(
        p.path(),
        &["--probe-records", rec, "--probe-max-age", "1h"],
        &["true"],
    );
    assert!(r["runtime"]["verified_controls"]
        .as_array()
        .unwrap()
        .is_empty());

    // An unreadable record file is a configuration error, and nothing runs.
    let out = agentdiff(
        p.path(),
        &[
            "run",
            "--probe-records",
            "missing.json",
            "--",
            "touch",
            "ran",
        ],
    );
    assert_eq!(out.status.code(), Some(65));
    assert!(!p.path().join("ran").exists());
}

/// agentdiff killed with SIGKILL mid-run writes no runtime.json; `agentdiff cleanup` still finds
/// the run's processes from the `launched` event (root identity and run cgroup) and stops them.
#[test]
fn cleanup_stops_the_processes_of_a_run_whose_agentdiff_was_killed() {
    let p = project();
    let secs = 500_000 + std::process::id() % 100_000;
    let marker = format!("sleep {secs}");
    let mut child = cmd(p.path(), &[])
        .args([
            "run",
            "--run-id",
            "killed",
            "--fail-on",
            "never",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!("{marker} & {marker}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let events = p.path().join(".agentdiff/runs/killed/events.jsonl");
    let alive = || {
        let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
        String::from_utf8_lossy(&ps.stdout)
            .lines()
            .filter(|l| l.trim() == marker)
            .count()
    };
    let started = Instant::now();
    while !(fs::read_to_string(&events).is_ok_and(|e| e.contains("\"launched\"")) && alive() == 2) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the run did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(alive(), 2, "the command should outlive its killed monitor");

    let out = agentdiff(p.path(), &["cleanup", "killed", "--format", "json"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let started = Instant::now();
    while alive() > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "processes survived cleanup"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let report: Value = serde_json::from_str(&stdout).unwrap();
    let records = report["cleanup"]["records"].as_array().unwrap();
    assert!(records.len() >= 3, "{report:#}");
    // The unsealed capsule is reported as such, and the cleanup is a recovery artifact.
    let verify = agentdiff(p.path(), &["verify", "killed"]);
    assert_eq!(verify.status.code(), Some(67));
    assert!(p
        .path()
        .join(".agentdiff/runs/killed/cleanup-result.json")
        .exists());
}

/// `observe.include` (policy v2) brings a default-excluded directory into the transaction.
#[test]
fn observe_include_scans_a_default_excluded_directory() {
    let p = project();
    fs::create_dir(p.path().join("node_modules")).unwrap();
    fs::write(p.path().join("node_modules/dep.js"), "1\n").unwrap();
    let script = "echo 2 >> node_modules/dep.js";
    let (_, r, _) = run_json(p.path(), &["--fail-on", "never"], &["sh", "-c", script]);
    assert!(r["changes"].as_array().unwrap().is_empty(), "{r:#}");
    fs::write(
        p.path().join("agentdiff.yaml"),
        "version: 2\nobserve:\n  include: [node_modules/**]\n",
    )
    .unwrap();
    let (_, r, _) = run_json(p.path(), &["--fail-on", "never"], &["sh", "-c", script]);
    assert_eq!(change(&r, "node_modules/dep.js")["change_type"], "modified");
}

/// A version-2 policy's `runtime.backend` chooses the backend when `--runtime` is not given.
#[test]
fn the_policy_can_choose_the_backend() {
    let p = project();
    fs::write(
        p.path().join("agentdiff.yaml"),
        "version: 2\nruntime:\n  backend: no-such-backend\n",
    )
    .unwrap();
    let out = agentdiff(p.path(), &["run", "--", "touch", "x"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(text(&out.stderr).contains("unknown runtime backend `no-such-backend`"));
    assert!(!p.path().join("x").exists());
    // --runtime wins over the policy.
    let (code, r, _) = run_json(p.path(), &["--runtime", "local"], &["true"]);
    assert_eq!(code, 0);
    assert_eq!(r["runtime"]["backend"], "local");
}

/// An unavailable backend is reported as unavailable (69) by `agentdiff conformance`, even when
/// `--require-available` turns its skipped checks into failures.
#[test]
fn conformance_of_an_unavailable_backend_exits_69() {
    let p = project();
    let out = cmd(p.path(), &[])
        .args([
            "conformance",
            "--runtime",
            "srt",
            "--require-available",
            "--only",
            "AVAIL",
            "--only",
            "ARGV-001",
        ])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    super::assert_exit(&out, 69);
}

/// A hook or key planted under a name that cannot be captured (not UTF-8, or a FIFO) where the
/// built-in policy denies writes is denied like its readable twin, not waved through as review.
#[test]
fn uncaptured_entries_under_denied_paths_are_denied() {
    let p = project();
    fs::create_dir_all(p.path().join(".git/hooks")).unwrap();
    let plants = [
        "printf x > .git/hooks/\"$(printf 'post\\377')\"",
        "mkfifo .git/hooks/pre-push",
        "printf x > \"$(printf 'id\\377.pem')\"",
    ];
    for plant in plants {
        let (code, r, _) = run_json(p.path(), &["--fail-on", "deny"], &["sh", "-c", plant]);
        assert_eq!(r["safety_outcome"], "deny", "{plant}: {r:#}");
        assert_ne!(code, 0, "{plant}: --fail-on deny must fail: {r:#}");
        let kinds: Vec<&str> = r["evidence_findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|f| f["kind"].as_str())
            .collect();
        assert!(kinds.contains(&"uncaptured_denied"), "{plant}: {r:#}");
        // Clean up for the next plant, outside agentdiff.
        Command::new("sh")
            .arg("-c")
            .arg("rm -rf .git/hooks/* ./id*.pem")
            .current_dir(p.path())
            .status()
            .unwrap();
    }
    // The same name in an ordinary directory stays a review.
    let (code, r, _) = run_json(
        p.path(),
        &["--fail-on", "deny"],
        &["sh", "-c", "printf x > src/\"$(printf 'x\\377')\""],
    );
    assert_eq!(
        (code, r["safety_outcome"].as_str()),
        (0, Some("review")),
        "{r:#}"
    );
}

/// The command cannot open agentdiff's descriptors through `/proc/<agentdiff>/fd` (where the
/// run's private spool and lock files are): agentdiff is not dumpable. Checked as an unprivileged
/// user, since root passes every ptrace check.
#[test]
fn the_command_cannot_open_agentdiffs_descriptors() {
    let probe = "p=$PPID; while [ \"$p\" -gt 1 ]; do \
                 if [ \"$(cat /proc/$p/comm)\" = agentdiff ]; then \
                 if ls /proc/$p/fd >/dev/null 2>&1; then echo open > probe; \
                 else echo denied > probe; fi; exit 0; fi; \
                 p=$(awk '{print $4}' /proc/$p/stat); done; echo no-agentdiff > probe";
    let u = super::Unprivileged::new();
    let out = u
        .command(&["run", "--fail-on", "never", "--", "sh", "-c", probe])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen = fs::read_to_string(u.proj.join("probe")).unwrap();
    assert_eq!(seen.trim(), "denied", "{}", text(&out.stderr));
}

/// The command breaks the object store so the after-capture cannot write its trees: the run is
/// still sealed, with status `error`, a deny outcome and the reason, never left without a result.
#[test]
fn a_run_whose_after_capture_fails_is_sealed_as_an_error() {
    let p = project();
    let (code, r, _) = run_json(
        p.path(),
        &["--run-id", "broken"],
        &[
            "sh",
            "-c",
            "rm -rf .agentdiff/objects/tmp && touch .agentdiff/objects/tmp && echo x > new.txt",
        ],
    );
    assert_eq!(code, 70, "{r:#}");
    assert_eq!(r["status"], "error", "{r:#}");
    assert_eq!(r["safety_outcome"], "deny");
    assert_eq!(r["exit_code"], 0, "the command's own exit is kept");
    assert!(
        r["execution_error"]
            .as_str()
            .unwrap()
            .contains("could not be captured"),
        "{r:#}"
    );
    let verify = agentdiff(p.path(), &["verify", "broken"]);
    assert!(verify.status.success(), "{}", text(&verify.stdout));
}

/// Whether srt and bubblewrap are missing (after printing the skip).
fn no_srt() -> bool {
    let found = |p: &str| {
        std::process::Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if found("srt") && found("bwrap") {
        return false;
    }
    agentdiff_test_support::skip("srt and bubblewrap are not installed");
    true
}

/// Through the binary under srt (derived settings), a command tries what the sandbox must keep
/// from it: vsock and the kernel keyrings (the exec shim's seccomp guard), the configuration
/// later runs and sessions read (`.claude`, `agentdiff.yaml`), and a nested and a renamed bare
/// repository's hooks. Each attempt is its own process, so one refusal does not stop the rest.
#[test]
fn under_srt_a_command_cannot_reach_vsock_keyrings_configuration_or_nested_repositories() {
    if no_srt() {
        return;
    }
    let p = project();
    let root = p.path();
    fs::write(root.join("agentdiff.yaml"), "version: 2\n").unwrap();
    fs::create_dir(root.join(".claude")).unwrap();
    fs::write(root.join(".claude/settings.json"), "{}\n").unwrap();
    for args in [
        &["init", "-q", "sub"][..],
        &["init", "-q", "--bare", "vendor/x.git"],
    ] {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(root)
            .status();
        assert!(ok.unwrap().success());
    }
    let script = format!(
        "python3 -c 'import socket; socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM); \
         open(\"vsock.out\", \"w\")'; \
         python3 -c 'import ctypes; l = ctypes.CDLL(None); \
         l.syscall.restype = ctypes.c_long; \
         l.syscall({keyctl}, 0, -4, 0) >= 0 and open(\"keyctl.out\", \"w\")'; \
         (echo '{{\"disableAllHooks\": true}}' > .claude/settings.local.json); \
         (echo 'x: 1' >> agentdiff.yaml); (echo x > sub/.git/hooks/post-checkout); \
         (echo x > vendor/x.git/hooks/pre-receive); echo ok > ok.txt; exit 0",
        keyctl = libc::SYS_keyctl
    );
    // What this host gives a plain process: without vsock or keyrings here, the sandbox's
    // refusal of them would be the kernel's, and the test could not fail.
    let outside = tempfile::tempdir().unwrap();
    let host = std::process::Command::new("sh")
        .args(["-c", &script])
        .current_dir(outside.path())
        .status()
        .unwrap();
    assert!(host.success());
    for probe in ["vsock.out", "keyctl.out"] {
        if !outside.path().join(probe).exists() {
            eprintln!("note: this host refuses {probe:?} to a plain process too; the sandbox's refusal of it is the kernel's");
        }
    }
    let args = ["--runtime", "srt", "--fail-on", "never"];
    let (code, _, out) = run_json(root, &args, &["sh", "-c", &script]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    assert!(root.join("ok.txt").exists(), "{}", text(&out.stderr));
    for refused in [
        "vsock.out",
        "keyctl.out",
        ".claude/settings.local.json",
        "sub/.git/hooks/post-checkout",
        "vendor/x.git/hooks/pre-receive",
    ] {
        assert!(!root.join(refused).exists(), "{refused} was written");
    }
    assert_eq!(
        fs::read_to_string(root.join("agentdiff.yaml")).unwrap(),
        "version: 2\n"
    );
}

/// srt run by root leaves its command a full capability set. Through the binary, the command
/// starts with none: it can neither read the start line out of the marker FIFO (to learn the
/// run's token) nor forge the shim's `exec_failed` with it, and its exit stays its own.
#[test]
fn under_srt_the_command_starts_without_capabilities_and_cannot_forge_the_start() {
    if no_srt() {
        return;
    }
    let p = project();
    let script = r#"
import glob, os
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
open("caps.out", "w").write(caps)
marker = glob.glob(".agentdiff/runs/*/srt-start-marker.fifo")[0]
try:
    fd = os.open(marker, os.O_RDWR | os.O_NONBLOCK)
    line = os.read(fd, 4096)
    token = line.split(b"token=")[1].split()[0]
    os.write(fd, b"exec_failed token=" + token + b" errno=2\n")
    open("stolen.out", "w").write("stolen")
except (OSError, IndexError) as e:
    open("denied.out", "w").write(type(e).__name__)
"#;
    let args = ["--runtime", "srt", "--fail-on", "never"];
    let (code, r, out) = run_json(p.path(), &args, &["python3", "-c", script]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    let read = |n: &str| fs::read_to_string(p.path().join(n)).ok();
    assert_eq!(read("caps.out").as_deref(), Some("0000000000000000"));
    assert_eq!(read("stolen.out"), None, "the command read the start line");
    // The marker was there to be tried, and refused.
    assert_eq!(read("denied.out").as_deref(), Some("PermissionError"));
    let id = r["run_id"].as_str().unwrap();
    let runtime: Value = serde_json::from_str(
        &fs::read_to_string(
            p.path()
                .join(".agentdiff/runs")
                .join(id)
                .join("runtime.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(runtime["wrapper"]["command_started"], true, "{runtime:#}");
    assert_eq!(
        runtime["wrapper"]["exit_attribution"], "command",
        "{runtime:#}"
    );
}
