//! External backends through the unmodified `agentdiff` binary: `agentdiff-backend-nice` (the
//! Rust example built with the SDK) and the example in Python, put on `PATH`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

use super::{assert_exit, cmd, json_of, text};

/// The workspace root (this crate lives in `backends/`).
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace holds backends/")
}

/// `agentdiff-backend-nice`, built now by cargo (a no-op when it is up to date) so the test never
/// runs a stale copy.
fn nice_executable() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(workspace())
            .args(["build", "--quiet", "-p", "agentdiff-backend-nice", "--bin"])
            .arg("agentdiff-backend-nice")
            .output()
            .expect("cargo runs");
        assert!(
            out.status.success(),
            "building the example failed: {}",
            text(&out.stderr)
        );
        let exe = super::bin().with_file_name("agentdiff-backend-nice");
        assert!(exe.is_file(), "{} was not built", exe.display());
        exe
    })
}

/// The example backend written in Python.
fn python_example() -> PathBuf {
    workspace().join("examples/backend-python/agentdiff-backend-lowprio")
}

/// Whether `python3` runs here; otherwise the test is skipped (failed under
/// AGENTDIFF_REQUIRE_REAL_BACKENDS=1).
fn python_missing() -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    !ok && agentdiff_conformance::skip_unless_required("python3 is not installed")
}

/// A directory for `PATH` holding programs named as plugins.
struct PluginDir {
    dir: tempfile::TempDir,
}

impl PluginDir {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A copy of `target` named `name`: plugin discovery judges the file a link resolves to, and
    /// the build's own output lies below `target/`, a directory it refuses plugins from.
    fn install(&self, name: &str, target: &Path) -> PathBuf {
        let p = self.dir.path().join(name);
        agentdiff_test_support::copy_executable(target, &p, 0o755);
        p
    }

    fn with_nice(self) -> Self {
        self.install("agentdiff-backend-nice", nice_executable());
        self
    }

    fn with_python(self) -> Self {
        self.install("agentdiff-backend-lowprio", &python_example());
        self
    }

    /// A copy of the Python example named `agentdiff-backend-ID`, with `edits` (old, new) applied.
    fn python_variant(&self, id: &str, edits: &[(&str, &str)]) -> PathBuf {
        let mut source = fs::read_to_string(python_example()).unwrap();
        for (old, new) in edits {
            assert!(
                source.contains(old),
                "the example no longer contains {old:?}"
            );
            source = source.replace(old, new);
        }
        let p = self.dir.path().join(format!("agentdiff-backend-{id}"));
        agentdiff_test_support::write_executable(&p, &source, 0o755);
        p
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// `PATH` with `dirs` first.
fn path_with(dirs: &[&Path]) -> std::ffi::OsString {
    let mut all: Vec<PathBuf> = dirs.iter().map(|d| d.to_path_buf()).collect();
    all.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    std::env::join_paths(all).unwrap()
}

fn agentdiff_on(path: &std::ffi::OsStr, cwd: &Path, args: &[&str]) -> Output {
    cmd(cwd, args)
        .env("PATH", path)
        .output()
        .expect("agentdiff runs")
}

fn runtime_json(root: &Path, result: &Value) -> Value {
    let id = result["run_id"].as_str().unwrap();
    let p = root.join(".agentdiff/runs").join(id).join("runtime.json");
    serde_json::from_str(&fs::read_to_string(p).unwrap()).unwrap()
}

/// Each named check is in the conformance report and passed (a missing check names itself).
fn assert_passed(report: &Value, ids: &[&str]) {
    let checks = report["checks"]
        .as_array()
        .expect("the report lists its checks");
    for id in ids {
        let check = checks
            .iter()
            .find(|c| c["id"] == *id)
            .unwrap_or_else(|| panic!("{id} is not in the report: {report:#}"));
        assert_eq!(check["outcome"], "passed", "{check:#}");
    }
}

#[test]
fn doctor_lists_the_external_backend_with_its_path_and_protocol() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new().with_nice().with_python();
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(&path, project.path(), &["doctor", "--format", "json"]);
    assert_exit(&out, 0);
    let doc = json_of(&out);
    let nice = doc["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "nice")
        .unwrap_or_else(|| panic!("nice is not listed: {doc:#}"));
    // The SDK's `serve` speaks protocols 1 and 2; the handshake settles on 2.
    assert_eq!(nice["external"]["protocol"], 2);
    assert_eq!(
        nice["external"]["path"],
        plugins
            .path()
            .join("agentdiff-backend-nice")
            .display()
            .to_string()
    );
    assert_eq!(nice["availability"]["state"], "ready", "{nice:#}");
    assert_eq!(nice["options"][0]["name"], "nice-executable");
    let lowprio = doc["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "lowprio")
        .unwrap_or_else(|| panic!("lowprio is not listed: {doc:#}"));
    // The Python example speaks protocols 1 and 2; the handshake settles on 2.
    assert_eq!(lowprio["external"]["protocol"], 2);
    assert_eq!(lowprio["availability"]["state"], "ready", "{lowprio:#}");
    assert_eq!(lowprio["capabilities"]["processes"], "uncontrolled");
    // A plugin's labels are its own word: never the recommendation.
    assert_ne!(doc["recommended"]["id"], "nice");
    let out = agentdiff_on(&path, project.path(), &["doctor"]);
    assert!(
        text(&out.stdout).contains("external backend: "),
        "{}",
        text(&out.stdout)
    );
    let out = agentdiff_on(&path, project.path(), &["doctor", "--runtime", "nice"]);
    assert!(
        text(&out.stdout).contains("recommended: none (external backends are never recommended)"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_run_through_the_external_backend_records_changes_and_passes_the_exit_code() {
    let plugins = PluginDir::new().with_nice();
    let project = tempfile::tempdir().unwrap();
    fs::write(project.path().join("a.txt"), "a\n").unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &[
            "run",
            "--format",
            "json",
            "--runtime",
            "nice",
            "--",
            "sh",
            "-c",
            "echo x >> a.txt; echo y > b.txt; echo to-the-user; exit 3",
        ],
    );
    assert_exit(&out, 3);
    // The command's stdout reached agentdiff's stderr directly (--format json), not through JSON.
    assert!(
        text(&out.stderr).contains("to-the-user"),
        "{}",
        text(&out.stderr)
    );
    let r = json_of(&out);
    let changes: Vec<&str> = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["a.txt", "b.txt"], "{r:#}");
    assert_eq!(r["runtime"]["backend"], "nice");
    assert_eq!(r["runtime"]["exit"]["code"], 3);
    let rt = runtime_json(project.path(), &r);
    let origin = &rt["wrapper"]["external_backend"];
    assert_eq!(origin["protocol"], 2, "{rt:#}");
    assert!(origin["path"]
        .as_str()
        .unwrap()
        .ends_with("agentdiff-backend-nice"));
    // The SDK keeps the command unreaped until agentdiff's ack, so even this short command is
    // checked.
    assert_eq!(origin["launched_process"], "verified", "{origin:#}");
    assert_eq!(rt["wrapper_argv"][1], "-n", "{rt:#}");
}

/// An external plugin's isolation claims (`sandboxed`, enforcement) are its word: every report
/// says "(declared by plugin)", decoded from the typed wrapper facts.
#[test]
fn reports_mark_an_external_plugin_s_claims_as_declared() {
    let plugins = PluginDir::new().with_nice();
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let args = [
        "run",
        "--run-id",
        "ext-1",
        "--runtime",
        "nice",
        "--",
        "true",
    ];
    let out = agentdiff_on(&path, project.path(), &args);
    assert_exit(&out, 0);
    assert!(
        text(&out.stderr).contains("(declared by plugin)"),
        "{}",
        text(&out.stderr)
    );
    for format in ["summary", "markdown", "html"] {
        let out = agentdiff_on(
            &path,
            project.path(),
            &["inspect", "ext-1", "--format", format],
        );
        assert_exit(&out, 0);
        let shown = text(&out.stdout);
        assert!(shown.contains("(declared by plugin)"), "{format}: {shown}");
    }
}

#[test]
fn an_unknown_runtime_lists_built_in_and_path_ids_and_writes_no_capsule() {
    let plugins = PluginDir::new().with_nice();
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &["run", "--runtime", "nope", "--", "true"],
    );
    assert_exit(&out, 64);
    let err = text(&out.stderr);
    assert!(err.contains("unknown runtime backend `nope`"), "{err}");
    assert!(
        err.contains("local") && err.contains("on PATH: nice"),
        "{err}"
    );
    assert!(!project.path().join(".agentdiff").exists());
}

#[test]
fn built_in_ids_cannot_be_shadowed_and_duplicates_name_both_paths() {
    let a = PluginDir::new();
    let b = PluginDir::new();
    a.install("agentdiff-backend-local", nice_executable());
    let first = a.install("agentdiff-backend-twin", nice_executable());
    let second = b.install("agentdiff-backend-twin", Path::new("/bin/true"));
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[a.path(), b.path()]);
    // `local` stays the built-in backend.
    let out = agentdiff_on(
        &path,
        project.path(),
        &[
            "run",
            "--format",
            "json",
            "--runtime",
            "local",
            "--",
            "true",
        ],
    );
    assert_exit(&out, 0);
    assert!(json_of(&out)["runtime"]["wrapper"].is_null());
    let out = agentdiff_on(
        &path,
        project.path(),
        &["run", "--runtime", "twin", "--", "true"],
    );
    assert_exit(&out, 64);
    let err = text(&out.stderr);
    assert!(
        err.contains(&first.display().to_string()) && err.contains(&second.display().to_string()),
        "{err}"
    );
    let out = agentdiff_on(&path, project.path(), &["doctor", "--format", "json"]);
    let doc = json_of(&out);
    let refused: Vec<&str> = doc["external_backends_refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(refused, ["local", "twin"], "{doc:#}");
}

#[test]
fn the_conformance_suite_passes_for_the_external_nice_backend() {
    let plugins = PluginDir::new().with_nice();
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &["conformance", "--runtime", "nice", "--format", "json"],
    );
    assert_exit(&out, 0);
    let report = json_of(&out);
    assert_eq!(report["summary"]["must_failed"], 0, "{report:#}");
    // Every check ran and passed, or was skipped for a label the backend does not claim; bytes
    // that are not UTF-8 cross the protocol too (ARGV-006).
    assert_eq!(report["summary"]["failed"], 0, "{report:#}");
    assert_passed(&report, &["FAIL-001", "ARGV-006", "PROTO-004", "PROTO-005"]);
}

#[test]
fn a_run_through_the_python_backend_records_changes_and_passes_the_exit_code() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new().with_python();
    let project = tempfile::tempdir().unwrap();
    fs::write(project.path().join("a.txt"), "a\n").unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &[
            "run",
            "--format",
            "json",
            "--runtime",
            "lowprio",
            "--",
            "sh",
            "-c",
            "rm a.txt; echo y > b.txt; echo to-the-user; exit 4",
        ],
    );
    assert_exit(&out, 4);
    assert!(
        text(&out.stderr).contains("to-the-user"),
        "{}",
        text(&out.stderr)
    );
    let r = json_of(&out);
    let changes: Vec<(&str, &str)> = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap(),
                c["change_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        [("a.txt", "deleted"), ("b.txt", "created")],
        "{r:#}"
    );
    assert_eq!(r["runtime"]["backend"], "lowprio");
    let rt = runtime_json(project.path(), &r);
    let origin = &rt["wrapper"]["external_backend"];
    // The plugin keeps the command unreaped until `ack`: always verified.
    assert_eq!(origin["launched_process"], "verified", "{rt:#}");
    assert_eq!(
        origin["facts"]["plugin"], "agentdiff-backend-lowprio",
        "{rt:#}"
    );
}

#[test]
fn the_conformance_suite_passes_for_the_python_backend() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new().with_python();
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &["conformance", "--runtime", "lowprio", "--format", "json"],
    );
    let report = json_of(&out);
    assert_exit(&out, 0);
    assert_eq!(report["summary"]["must_failed"], 0, "{report:#}");
    assert_passed(
        &report,
        &[
            "FAIL-001",
            "PROTO-001",
            "PROTO-002",
            "PROTO-003",
            "PROTO-004",
            "PROTO-005",
        ],
    );
}

/// `agentdiff conformance --only ONLY` on plugin `id` from `plugins`, which must fail (exit 74):
/// the JSON report.
fn failing_conformance(plugins: &PluginDir, id: &str, only: &str) -> Value {
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let args = [
        "conformance",
        "--runtime",
        id,
        "--only",
        only,
        "--format",
        "json",
    ];
    let out = agentdiff_on(&path, project.path(), &args);
    assert_exit(&out, 74);
    json_of(&out)
}

#[test]
fn a_lying_python_backend_fails_the_honesty_check() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new();
    plugins.python_variant(
        "liar",
        &[(
            r#""filesystem_writes": "uncontrolled""#,
            r#""filesystem_writes": "enforced""#,
        )],
    );
    let report = failing_conformance(&plugins, "liar", "HONEST-FS");
    let check = &report["checks"][0];
    assert_eq!(check["id"], "HONEST-FS-001");
    assert_eq!(check["outcome"], "failed", "{check:#}");
}

/// A third-party backend that declares no fail-closed case: `FAIL-001` (MUST) cannot run, so the
/// report says "not run" and the backend is not conformant (exit 74), whatever else passed;
/// naming a case with `--fail-closed-option` runs it.
#[test]
fn a_python_backend_without_a_fail_closed_case_is_never_reported_conformant() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new();
    plugins.python_variant(
        "nofail",
        &[(r#""fail_closed": FAIL_CLOSED}"#, r#""fail_closed": []}"#)],
    );
    let report = failing_conformance(&plugins, "nofail", "FAIL");
    let check = &report["checks"][0];
    assert_eq!(check["id"], "FAIL-001");
    assert_eq!(check["outcome"], "not_run", "{check:#}");
    assert_eq!(report["summary"]["must_not_run"], 1, "{report:#}");
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let tap = agentdiff_on(
        &path,
        project.path(),
        &["conformance", "--runtime", "nofail", "--only", "FAIL"],
    );
    assert_exit(&tap, 74);
    let stdout = String::from_utf8_lossy(&tap.stdout);
    assert!(
        stdout.contains("NOT conformant: MUST check(s) not run: FAIL-001"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&tap.stderr);
    assert!(stderr.contains("--fail-closed-option"), "{stderr}");
    let named = agentdiff_on(
        &path,
        project.path(),
        &[
            "conformance",
            "--runtime",
            "nofail",
            "--only",
            "FAIL",
            "--fail-closed-option",
            "nice-executable=/nonexistent/agentdiff-missing-nice",
        ],
    );
    assert_exit(&named, 0);
    let stdout = String::from_utf8_lossy(&named.stdout);
    assert!(stdout.contains("\nok 1 - FAIL-001"), "{stdout}");
    assert!(!stdout.contains("not ok"), "{stdout}");
}

#[test]
fn a_python_backend_that_accepts_any_protocol_version_fails_proto_002() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new();
    plugins.python_variant(
        "anyversion",
        &[(
            r#"shared = [v for v in offered if v in PROTOCOLS] if hello.get("type") == "hello" else []"#,
            r#"shared = offered if hello.get("type") == "hello" else []"#,
        )],
    );
    let report = failing_conformance(&plugins, "anyversion", "PROTO-00");
    let outcomes: Vec<(&str, &str)> = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        outcomes,
        [
            ("PROTO-001", "passed"),
            ("PROTO-002", "failed"),
            ("PROTO-003", "passed"),
            ("PROTO-004", "passed"),
            ("PROTO-005", "passed"),
        ],
        "{report:#}"
    );
}

/// A plugin that reaps its command before agentdiff's `ack` fails PROTO-004 every time: the
/// suite holds the `ack` back, so the race agentdiff usually wins is lost on purpose.
#[test]
fn a_python_backend_that_reaps_before_the_ack_fails_proto_004() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new();
    plugins.python_variant(
        "reaper",
        &[(
            "if acked and child.poll() is not None:",
            "if child.poll() is not None:",
        )],
    );
    let report = failing_conformance(&plugins, "reaper", "PROTO-004");
    let check = &report["checks"][0];
    assert_eq!(check["id"], "PROTO-004");
    assert_eq!(check["outcome"], "failed", "{check:#}");
    assert!(
        check["reason"]
            .as_str()
            .unwrap_or("")
            .contains("already reaped"),
        "{check:#}"
    );
}

#[test]
fn cleanup_of_an_external_run_goes_through_the_plugin() {
    let plugins = PluginDir::new().with_nice();
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &["run", "--format", "json", "--runtime", "nice", "--", "true"],
    );
    assert_exit(&out, 0);
    let id = json_of(&out)["run_id"].as_str().unwrap().to_string();
    let out = agentdiff_on(&path, project.path(), &["cleanup", &id]);
    assert_exit(&out, 0);
    // Without the plugin on PATH the run's backend is unknown: a clear error, nothing signalled.
    let out = cmd(project.path(), &["cleanup", &id]).output().unwrap();
    assert_exit(&out, 69);
    assert!(
        text(&out.stderr).contains("neither built in nor on PATH"),
        "{}",
        text(&out.stderr)
    );
}

/// The user's terminal reaches the command through the plugin (it opens /dev/tty), Ctrl-C ends
/// it, and the exit is reported as SIGINT with the capsule sealed.
#[test]
fn a_terminal_and_ctrl_c_reach_the_command_through_both_external_backends() {
    if python_missing() {
        return;
    }
    if Command::new("tmux").arg("-V").output().is_err()
        && agentdiff_conformance::skip_unless_required("tmux is not installed")
    {
        return;
    }
    let plugins = PluginDir::new().with_nice().with_python();
    let path = path_with(&[plugins.path()]);
    for id in ["nice", "lowprio"] {
        let dir = super::terminal_cli::ctrl_c_case_on(Some(&path), &["--runtime", id], false);
        let result: Value = serde_json::from_slice(
            &fs::read(dir.path().join(".agentdiff/runs/tty-run/result.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(result["runtime"]["backend"], id, "{result:#}");
    }
}

/// SIGINT to agentdiff's whole process group (no terminal hand-over here) reaches the plugin only
/// as the protocol's `interrupt`: the command is ended and reported as interrupted (exit 130).
#[test]
fn a_group_interrupt_is_forwarded_to_the_command_through_both_external_backends() {
    use std::os::unix::process::CommandExt;
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new().with_nice().with_python();
    let path = path_with(&[plugins.path()]);
    for id in ["nice", "lowprio"] {
        let project = tempfile::tempdir().unwrap();
        let child = cmd(
            project.path(),
            &[
                "run",
                "--format",
                "json",
                "--runtime",
                id,
                "--",
                "sh",
                "-c",
                "echo started > started.txt; exec sleep 30",
            ],
        )
        .env("PATH", &path)
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
        let started = project.path().join("started.txt");
        let t = std::time::Instant::now();
        while !started.exists() && t.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(started.exists(), "{id}: the command did not start");
        // SAFETY: kill(2) on the process group this test created.
        unsafe { libc::kill(-(child.id() as i32), libc::SIGINT) };
        let out = child.wait_with_output().unwrap();
        assert_exit(&out, 130);
        let r = json_of(&out);
        assert_eq!(r["runtime"]["backend"], id);
        assert_eq!(r["runtime"]["exit"]["interrupted_by"], 2, "{id}: {r:#}");
    }
}

/// A plugin that is on PATH but cannot be described — it exits at once, or answers garbage —
/// is an unavailable backend (69), not a usage error, and the run writes no capsule.
#[test]
fn a_plugin_that_cannot_be_described_is_an_unavailable_backend() {
    let plugins = PluginDir::new();
    for (id, body) in [
        ("quits", "#!/bin/sh\nexit 3\n"),
        ("babbles", "#!/bin/sh\necho 'not json' >&4\nsleep 5\n"),
    ] {
        let p = plugins.path().join(format!("agentdiff-backend-{id}"));
        agentdiff_test_support::write_executable(&p, body, 0o755);
        let project = tempfile::tempdir().unwrap();
        let path = path_with(&[plugins.path()]);
        let out = agentdiff_on(
            &path,
            project.path(),
            &["run", "--runtime", id, "--", "true"],
        );
        assert_exit(&out, 69);
        let err = text(&out.stderr);
        assert!(err.contains(&format!("external backend `{id}`")), "{err}");
        assert!(!project.path().join(".agentdiff").exists(), "{id}");
    }
}

/// What a run whose plugin failed after the launch must still show: launched, `failed` with the
/// backend's failure and no exit code, `.env` a denied change, the after-state captured; exit 70.
fn assert_lost_run_recorded(project: &Path, out: &Output) -> Value {
    assert_exit(out, 70);
    let r = json_of(out);
    assert_eq!(r["status"], "failed", "{r:#}");
    assert_eq!(r["safety_outcome"], "deny", "{r:#}");
    let env = r["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == ".env")
        .unwrap_or_else(|| panic!(".env is not recorded: {r:#}"));
    assert_eq!(env["decision"], "deny", "{r:#}");
    assert_eq!(r["summary"]["protected"], 1, "{r:#}");
    assert_eq!(r["runtime"]["failure"]["kind"], "backend_failed", "{r:#}");
    assert!(r["runtime"]["exit"]["code"].is_null(), "{r:#}");
    assert!(r["execution_error"]
        .as_str()
        .is_some_and(|e| e.contains("before it reported how the command ended")));
    let dir = project
        .join(".agentdiff/runs")
        .join(r["run_id"].as_str().unwrap());
    assert!(dir.join("after.json").is_file(), "no after-state captured");
    let events = fs::read_to_string(dir.join("events.jsonl")).unwrap();
    assert!(events.contains("\"backend_failed\""), "{events}");
    assert!(!events.contains("\"launch_refused\""), "{events}");
    r
}

/// `agentdiff run --format json --runtime nice -- sh -c SCRIPT` in `project`.
fn run_nice_json(plugins: &PluginDir, project: &Path, script: &str) -> Output {
    let path = path_with(&[plugins.path()]);
    let args = [
        "run",
        "--format",
        "json",
        "--runtime",
        "nice",
        "--",
        "sh",
        "-c",
        script,
    ];
    agentdiff_on(&path, project, &args)
}

/// The command kills its plugin (`kill -9 $PPID`) after writing `.env` and starting a `sleep`:
/// the run is still recorded with its changes, and what the command left running is ended.
#[test]
fn a_command_that_kills_its_plugin_still_has_its_changes_recorded_and_denied() {
    let plugins = PluginDir::new().with_nice();
    let project = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let pidfile = outside.path().join("sleep.pid");
    let script = format!(
        "echo SECRET=x > .env; sleep 300 & echo $! > {}; kill -9 $PPID; wait",
        pidfile.display()
    );
    let out = run_nice_json(&plugins, project.path(), &script);
    let r = assert_lost_run_recorded(project.path(), &out);
    assert!(
        r["execution_error"]
            .as_str()
            .is_some_and(|e| e.contains("without answering")),
        "{r:#}"
    );
    let pid: u32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = stat
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'));
    assert!(!running, "the command's sleep {pid} was left running");
}

/// Variations on the same attack through the plugin's response pipe (`/proc/$PPID/fd/4`):
/// garbage, and a forged `exited` report while the command still runs. Where the write is refused
/// (not root: the plugin is not dumpable) the command kills its plugin instead. Every way ends
/// with the changes recorded.
#[test]
fn a_command_that_writes_into_its_plugins_pipe_cannot_erase_its_changes() {
    let forged = r#"{"type":"exited","report":{"exit":{"code":0,"signal":null,"timed_out":false,"interrupted_by":null,"duration_ms":1}}}"#;
    for payload in ["garbage", forged] {
        let plugins = PluginDir::new().with_nice();
        let project = tempfile::tempdir().unwrap();
        let script = format!(
            "echo SECRET=x > .env; echo '{payload}' > /proc/$PPID/fd/4 2>/dev/null || kill -9 \
             $PPID; sleep 1"
        );
        let out = run_nice_json(&plugins, project.path(), &script);
        assert_lost_run_recorded(project.path(), &out);
    }
}

/// The execution error of a run through a Python plugin variant `name` whose `launched` answer
/// is replaced by `after_launch`, once its command wrote `.env`: the run must be recorded as lost,
/// the command's changes captured and denied.
fn lost_run_error(name: &str, after_launch: &str) -> String {
    let plugins = PluginDir::new();
    plugins.python_variant(
        name,
        &[(
            r#"channel.send({"type": "launched", "pid": child.pid, "start_time_ticks": start_time(child.pid)})"#,
            after_launch,
        )],
    );
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let args = [
        "run",
        "--format",
        "json",
        "--runtime",
        name,
        "--",
        "sh",
        "-c",
        "echo SECRET=x > .env",
    ];
    let out = agentdiff_on(&path, project.path(), &args);
    let r = assert_lost_run_recorded(project.path(), &out);
    r["execution_error"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A plugin that dies between the `launch` request and its `launched` answer (here, after its
/// command finished) may have run the command: the run is recorded as lost, with the command's
/// changes captured and denied, never as "not launched".
#[test]
fn a_plugin_that_dies_before_answering_launch_still_has_its_commands_changes_recorded() {
    if python_missing() {
        return;
    }
    let error = lost_run_error("mute", "child.wait(); os._exit(9)");
    assert!(error.contains("may have run"), "{error}");
}

/// A plugin that answers `launched` with a pid it does not own (here its own parent, agentdiff),
/// after its command ran and wrote `.env`: the launch cannot be verified, so it is lost, not
/// refused — the after-state is captured and `.env` denied — and the named process is not signalled.
#[test]
fn a_plugin_that_names_a_process_it_does_not_own_still_has_its_commands_changes_recorded() {
    if python_missing() {
        return;
    }
    let error = lost_run_error(
        "liar",
        r#"child.wait(); channel.send({"type": "launched", "pid": os.getppid(), "start_time_ticks": start_time(os.getppid())})"#,
    );
    assert!(
        error.contains("not a descendant") && error.contains("may have run"),
        "{error}"
    );
}

/// The example plugins are not dumpable (the Rust SDK's `serve` and the Python example): a command
/// of the same user cannot open their descriptors through `/proc/<plugin>/fd`. Checked as an
/// unprivileged user, since root passes every ptrace check.
#[test]
fn the_command_cannot_open_its_plugins_descriptors() {
    let nice = PluginDir::new().with_nice();
    assert_plugin_descriptors_closed(&nice, "nice");
    if !python_missing() {
        let python = PluginDir::new().with_python();
        assert_plugin_descriptors_closed(&python, "lowprio");
    }
}

fn assert_plugin_descriptors_closed(plugins: &PluginDir, runtime: &str) {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(plugins.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let probe = "if ! tr '\\0' ' ' < /proc/$PPID/cmdline | grep -q agentdiff-backend-; then \
                 echo not-the-plugin; \
                 elif ls /proc/$PPID/fd >/dev/null 2>&1; then echo open; else echo denied; fi \
                 > probe";
    let u = super::Unprivileged::new();
    let args = [
        "run",
        "--fail-on",
        "never",
        "--runtime",
        runtime,
        "--",
        "sh",
        "-c",
        probe,
    ];
    let out = u
        .command(&args)
        .env("PATH", path_with(&[plugins.path()]))
        .output()
        .unwrap();
    assert!(out.status.success(), "{runtime}: {}", text(&out.stderr));
    let seen = fs::read_to_string(u.proj.join("probe")).unwrap();
    assert_eq!(seen.trim(), "denied", "{runtime}: {}", text(&out.stderr));
}

/// A program that, if ever executed, leaves `marker` behind.
fn plant(dir: &Path, id: &str, marker: &Path) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let p = dir.join(format!("agentdiff-backend-{id}"));
    let body = format!("#!/bin/sh\necho ran > '{}'\nexit 1\n", marker.display());
    agentdiff_test_support::write_executable(&p, &body, 0o755);
    p
}

/// Programs planted where a sandboxed command could write them (the issue's `.venv/bin`, a
/// `node_modules/.bin` outside any project, a marked project's `tools/`, the current project's
/// own `tools/`, a directory others can write) are refused by plugin discovery with the reason,
/// listed by `doctor`, and never executed — by `doctor` or by `run --runtime ID`.
#[test]
fn planted_plugins_are_refused_and_never_executed() {
    use std::os::unix::fs::PermissionsExt;
    let project = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let marker = elsewhere.path().join("executed");
    let marked = elsewhere.path().join("other-project");
    fs::create_dir_all(&marked).unwrap();
    fs::write(marked.join("agentdiff.yaml"), "version: 1\n").unwrap();
    let shared = elsewhere.path().join("shared");
    let cases = [
        (project.path().join(".venv/bin"), "pwn", "`.venv`"),
        (
            elsewhere.path().join("dep/node_modules/.bin"),
            "nm",
            "`node_modules`",
        ),
        (marked.join("tools"), "marked", "inside the project root"),
        (
            project.path().join("tools"),
            "here",
            "inside the project root",
        ),
        (shared.clone(), "shared", "writable by group or others"),
    ];
    let mut dirs = Vec::new();
    for (dir, id, _) in &cases {
        plant(dir, id, &marker);
        dirs.push(dir.as_path());
    }
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).unwrap();
    let path = path_with(&dirs);
    let out = agentdiff_on(&path, project.path(), &["doctor", "--format", "json"]);
    assert_exit(&out, 0);
    let doc = json_of(&out);
    let refused = doc["external_backends_refused"].as_array().unwrap();
    for (_, id, reason) in &cases {
        let entry = refused
            .iter()
            .find(|r| r["id"] == *id)
            .unwrap_or_else(|| panic!("{id} is not listed as refused: {doc:#}"));
        let error = entry["error"].as_str().unwrap();
        assert!(
            error.contains(reason) && error.contains("not run"),
            "{id}: {error}"
        );
    }
    assert!(!marker.exists(), "doctor executed a planted plugin");
    let out = agentdiff_on(
        &path,
        project.path(),
        &["run", "--runtime", "pwn", "--", "true"],
    );
    assert_exit(&out, 69);
    assert!(
        text(&out.stderr).contains("refusing runtime backend `pwn`"),
        "{}",
        text(&out.stderr)
    );
    assert!(!marker.exists(), "run executed a planted plugin");
}

#[test]
fn hook_install_refuses_an_external_backend_for_shell_calls() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new().with_python();
    let project = tempfile::tempdir().unwrap();
    let out = agentdiff_on(
        &path_with(&[plugins.path()]),
        project.path(),
        &[
            "hook",
            "install",
            "--root",
            project.path().to_str().unwrap(),
            "--runtime",
            "lowprio",
        ],
    );
    assert_eq!(out.status.code(), Some(64), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("external backend"),
        "{}",
        text(&out.stderr)
    );
    assert!(!project.path().join(".claude").exists());
}

/// Root and `unshare` (the Python example's `network=filtered` needs both); `true` when the test
/// returns (skipped, or failing under AGENTDIFF_REQUIRE_REAL_BACKENDS=1).
fn no_root_unshare() -> bool {
    let ok = Command::new("unshare")
        .args(["--net", "true"])
        .status()
        .is_ok_and(|s| s.success());
    !ok && agentdiff_conformance::skip_unless_required("root with `unshare --net` (util-linux)")
}

/// `agentdiff conformance --only NET-FILTER` on plugin `id` with `network=filtered`.
fn egress_conformance(plugins: &PluginDir, id: &str) -> (Output, Value) {
    let project = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let args = [
        "conformance",
        "--runtime",
        id,
        "--backend-option",
        "network=filtered",
        "--only",
        "NET-FILTER",
        "--format",
        "json",
    ];
    let out = agentdiff_on(&path, project.path(), &args);
    let report = json_of(&out);
    (out, report)
}

#[test]
fn a_protocol_2_python_backend_routing_through_the_proxy_is_verified_filtered() {
    if python_missing() || no_root_unshare() {
        return;
    }
    let plugins = PluginDir::new().with_python();
    let (out, report) = egress_conformance(&plugins, "lowprio");
    assert_exit(&out, 0);
    assert_passed(&report, &["NET-FILTER-001"]);
    let check = &report["checks"][0];
    assert_eq!(
        check["details"]["probe"]["verdict"], "verified",
        "{check:#}"
    );
}

#[test]
fn a_python_backend_that_claims_filtered_but_keeps_the_network_fails_the_egress_check() {
    if python_missing() || no_root_unshare() {
        return;
    }
    let plugins = PluginDir::new();
    // Still says `egress_routed` and sets the proxy variables, but never enters a namespace of
    // its own nor starts a forwarder: the command keeps the host's network.
    plugins.python_variant(
        "leaky",
        &[(
            "argv = filtered_wrapper(spec, protocol) + argv",
            "filtered_wrapper(spec, protocol)",
        )],
    );
    let (out, report) = egress_conformance(&plugins, "leaky");
    assert_exit(&out, 74);
    let check = &report["checks"][0];
    assert_eq!(check["id"], "NET-FILTER-001");
    assert_eq!(check["outcome"], "failed", "{check:#}");
    let reason = check["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("direct connection"), "{check:#}");
}

#[test]
fn a_protocol_1_python_backend_still_runs_and_is_conformant() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new();
    plugins.python_variant("old", &[("PROTOCOLS = (1, 2)", "PROTOCOLS = (1,)")]);
    let project = tempfile::tempdir().unwrap();
    fs::write(
        project.path().join("agentdiff.yaml"),
        "version: 2\nnetwork:\n  egress:\n    allow: [api.example.com]\n",
    )
    .unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        project.path(),
        &[
            "run",
            "--runtime",
            "old",
            "--format",
            "json",
            "--fail-on",
            "never",
            "--",
            "sh",
            "-c",
            "echo x > a.txt",
        ],
    );
    assert_exit(&out, 0);
    let r = json_of(&out);
    let rt = runtime_json(project.path(), &r);
    assert_eq!(rt["wrapper"]["external_backend"]["protocol"], 1, "{rt:#}");
    // Never filtered: the allowlist was not applied, and the run says so.
    assert_ne!(rt["capabilities"]["network"], "filtered");
    assert!(
        r.to_string().contains("did not apply the allowlist"),
        "{r:#}"
    );
    let conf = agentdiff_on(
        &path,
        project.path(),
        &[
            "conformance",
            "--runtime",
            "old",
            "--only",
            "PROTO",
            "--format",
            "json",
        ],
    );
    assert_exit(&conf, 0);
}

#[test]
fn a_python_backend_answering_a_version_1_hello_with_version_2_fails_proto_002() {
    if python_missing() {
        return;
    }
    let plugins = PluginDir::new();
    plugins.python_variant("pushy", &[("protocol = max(shared)", "protocol = 2")]);
    let report = failing_conformance(&plugins, "pushy", "PROTO-002");
    let check = &report["checks"][0];
    assert_eq!(check["outcome"], "failed", "{check:#}");
    assert!(
        check["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("only protocol 1"),
        "{check:#}"
    );
}

/// A plugin that never answers its handshake is refused (69, nothing ran), and what it started
/// meanwhile does not outlive agentdiff: its children are ended with it.
#[test]
fn a_plugin_that_hangs_before_answering_leaves_no_process_behind() {
    let plugins = PluginDir::new();
    let pid_file = plugins.path().join("child.pid");
    let script = format!(
        "#!/bin/sh\nsleep 1000 &\necho $! > '{}'\nwait\n",
        pid_file.display()
    );
    agentdiff_test_support::write_executable(
        &plugins.path().join("agentdiff-backend-hang"),
        &script,
        0o755,
    );
    let root = tempfile::tempdir().unwrap();
    let path = path_with(&[plugins.path()]);
    let out = agentdiff_on(
        &path,
        root.path(),
        &["run", "--runtime", "hang", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    let child = fs::read_to_string(&pid_file).unwrap();
    let proc_dir = Path::new("/proc").join(child.trim());
    // Killed at once; its new parent reaps it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while proc_dir.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!proc_dir.exists(), "the plugin's child {child} still runs");
}
