//! Files agentdiff writes after a run (`run --attest`, `run --summary-file`, `attest --out`) and
//! bad flag values: a symlink, FIFO or device at the path is refused before anything runs and
//! never written through or blocked on; a duration out of range, a `NAME=VALUE` given as a
//! variable name and flags that would be ignored are usage errors, never a panic.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::{agentdiff, assert_exit, cmd, run_json, text};

const USAGE: i32 = 64;

/// Runs `c` to completion, or kills it after 30 s and fails: a blocked open must not hang the
/// suite.
fn within_deadline(mut c: Command) -> Output {
    let mut child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(30) {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!("agentdiff blocked: {}", text(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn runs_in(root: &Path) -> usize {
    std::fs::read_dir(root.join(".agentdiff/runs")).map_or(0, |d| d.count())
}

fn mkfifo(path: &Path) {
    let status = Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success());
}

/// The command replaces the attestation file with a symlink to a file outside the project; the
/// attestation goes to the file agentdiff opened before the run, and the outside file is intact.
#[test]
fn run_attest_never_writes_through_a_symlink_the_command_plants() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir(&root).unwrap();
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "IMPORTANT USER DATA\n").unwrap();
    let script = format!("rm -f att.json && ln -s {} att.json", victim.display());
    let (code, result, out) = run_json(&root, &["--attest", "att.json"], &["sh", "-c", &script]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "IMPORTANT USER DATA\n"
    );
    assert!(std::fs::symlink_metadata(root.join("att.json"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(result["run_id"].is_string());

    // A symlink already at the path (say, planted by an earlier run) is refused, not followed,
    // before anything runs.
    let before = runs_in(&root);
    let out = agentdiff(
        &root,
        &[
            "run",
            "--attest",
            "att.json",
            "--",
            "sh",
            "-c",
            "echo x > x.txt",
        ],
    );
    assert_exit(&out, USAGE);
    assert!(
        text(&out.stderr).contains("symbolic link"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("nothing was run"),
        "{}",
        text(&out.stderr)
    );
    assert!(!root.join("x.txt").exists());
    assert_eq!(runs_in(&root), before);
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "IMPORTANT USER DATA\n"
    );
}

/// A FIFO, a device or a directory as `--attest` or `--summary-file` is refused at once (64,
/// nothing run), not opened for a reader that never comes.
#[test]
fn run_refuses_output_files_that_are_not_regular_files_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir(&root).unwrap();
    let fifo = dir.path().join("out.fifo");
    mkfifo(&fifo);
    let fifo = fifo.to_str().unwrap().to_string();
    let outside = dir.path().to_str().unwrap().to_string();
    for flag in ["--attest", "--summary-file"] {
        for target in [fifo.as_str(), "/dev/null", outside.as_str()] {
            let c = cmd(
                &root,
                &["run", flag, target, "--", "sh", "-c", "echo x > x.txt"],
            );
            let out = within_deadline(c);
            assert_exit(&out, USAGE);
            let err = text(&out.stderr);
            assert!(err.contains("not a regular file"), "{flag} {target}: {err}");
            assert!(err.contains("nothing was run"), "{flag} {target}: {err}");
            assert!(!root.join("x.txt").exists());
        }
    }
    assert_eq!(runs_in(&root), 0);
    // A missing directory is refused the same way.
    let out = agentdiff(
        &root,
        &["run", "--attest", "/nonexistent-dir/att.json", "--", "true"],
    );
    assert_exit(&out, USAGE);
}

/// `attest --out`: a path that cannot be opened, a FIFO or a symlink is a usage error (64) that
/// writes nothing; an existing longer file is replaced whole.
#[test]
fn attest_out_refuses_bad_paths_and_replaces_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("p");
    std::fs::create_dir(&root).unwrap();
    let (code, result, out) = run_json(&root, &[], &["sh", "-c", "echo y > y.txt"]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    let run = result["run_id"].as_str().unwrap();

    let out = agentdiff(&root, &["attest", run, "--out", "/nonexistent-dir/x"]);
    assert_exit(&out, USAGE);
    assert!(
        text(&out.stderr).contains("cannot open /nonexistent-dir/x for the attestation"),
        "{}",
        text(&out.stderr)
    );
    let fifo = dir.path().join("att.fifo");
    mkfifo(&fifo);
    let out = within_deadline(cmd(
        &root,
        &["attest", run, "--out", fifo.to_str().unwrap()],
    ));
    assert_exit(&out, USAGE);
    let victim = dir.path().join("victim.txt");
    std::fs::write(&victim, "keep").unwrap();
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    let out = agentdiff(&root, &["attest", run, "--out", link.to_str().unwrap()]);
    assert_exit(&out, USAGE);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");

    let file = dir.path().join("att.json");
    std::fs::write(&file, "x".repeat(1 << 20)).unwrap();
    let out = agentdiff(&root, &["attest", run, "--out", file.to_str().unwrap()]);
    assert_exit(&out, 0);
    let written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert!(written["payload"].is_string());
}

/// Attesting a forged run names the problem, as `verify` does, not the seal's key detail alone.
#[test]
fn attest_of_a_forged_run_says_it_is_forged() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (code, result, out) = run_json(root, &[], &["sh", "-c", "echo y > y.txt"]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    let run = result["run_id"].as_str().unwrap();
    let path = root.join(".agentdiff/runs").join(run).join("result.json");
    let edited = std::fs::read_to_string(&path)
        .unwrap()
        .replacen('{', "{ ", 1);
    std::fs::write(&path, edited).unwrap();
    let out = agentdiff(root, &["attest", run]);
    assert_exit(&out, 67);
    let err = text(&out.stderr);
    assert!(err.contains("FORGED"), "{err}");
    assert!(err.contains("result.json"), "{err}");
    assert!(!err.contains("(Forged)"), "{err}");
    assert!(out.stdout.is_empty());
}

/// Every duration flag refuses a value beyond what it can hold as a usage error, never a panic
/// (exit 101); the hook still blocks (2).
#[test]
fn huge_durations_are_usage_errors_on_every_flag() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let cases: &[&[&str]] = &[
        &["run", "--timeout", "1e30", "--", "true"],
        &["run", "--timeout", "18446744073709551615", "--", "true"],
        &["run", "--timeout", "99999999999h", "--", "true"],
        &["run", "--grace-period", "1e20", "--", "true"],
        &["run", "--probe-max-age", "1e30", "--", "true"],
        &["runs", "prune", "--older-than", "1e30", "--dry-run"],
        &["serve", "--header-timeout", "1e300"],
        &["hook", "install", "--deadline", "1e30"],
    ];
    for args in cases {
        let out = within_deadline(cmd(root, args));
        assert_exit(&out, USAGE);
        let err = text(&out.stderr);
        assert!(err.contains("out of range"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    assert!(!root.join(".agentdiff/runs").exists());

    let out = within_deadline(cmd(root, &["hook", "pre-tool-use", "--deadline", "1e30"]));
    assert_exit(&out, 2);
    assert!(
        !text(&out.stderr).contains("panicked"),
        "{}",
        text(&out.stderr)
    );
    let mut c = cmd(root, &["hook", "pre-tool-use"]);
    c.env("AGENTDIFF_HOOK_DEADLINE", "1e30");
    let out = within_deadline(c);
    assert_exit(&out, 2);
    let err = text(&out.stderr);
    assert!(
        err.contains("out of range") && !err.contains("panicked"),
        "{err}"
    );
}

/// `--pass-env` takes a variable name; `A=B` is refused before anything runs.
#[test]
fn pass_env_refuses_what_is_not_a_variable_name() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for bad in ["A=B", "", "1X", "A B"] {
        let out = agentdiff(
            root,
            &[
                "run",
                "--scrub-env",
                "--pass-env",
                bad,
                "--",
                "sh",
                "-c",
                "echo x > x.txt",
            ],
        );
        assert_exit(&out, USAGE);
        assert!(
            text(&out.stderr).contains("not a variable name"),
            "{bad}: {}",
            text(&out.stderr)
        );
    }
    assert!(!root.join("x.txt").exists());
    let (code, _, out) = run_json(root, &["--scrub-env", "--pass-env", "A_1"], &["true"]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
}

/// `inspect --artifact` prints the artifact's JSON: a `--format` beside it is refused rather than
/// silently ignored.
#[test]
fn inspect_refuses_a_format_with_an_artifact() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (code, result, out) = run_json(root, &[], &["true"]);
    assert_eq!(code, 0, "{}", text(&out.stderr));
    let run = result["run_id"].as_str().unwrap();
    for format in ["html", "markdown", "json", "summary"] {
        let out = agentdiff(
            root,
            &["inspect", run, "--artifact", "before", "--format", format],
        );
        assert_exit(&out, USAGE);
        assert!(
            text(&out.stderr).contains("--format"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = agentdiff(root, &["inspect", run, "--artifact", "before"]);
    assert_exit(&out, 0);
}

/// A warning about an entry that is not captured (a name that is not UTF-8) is recorded as the
/// scan names it and escaped once where it is shown.
#[test]
fn warnings_are_escaped_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (_, result, out) = run_json(
        root,
        &[],
        &["sh", "-c", "printf u > \"$(printf 'bad\\377name')\""],
    );
    let warnings = result["observation_warnings"].to_string();
    assert!(
        warnings.contains(r#""bad\\xffname: non_utf8_name created — not captured""#),
        "{warnings} {}",
        text(&out.stderr)
    );
    let run = result["run_id"].as_str().unwrap();
    let summary = text(&agentdiff(root, &["inspect", run]).stdout);
    let line = summary
        .lines()
        .find(|l| l.contains("name: non_utf8_name"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(
        line.contains(r"bad\\xffname: non_utf8_name created"),
        "{line}"
    );
    assert!(!line.contains(r"\\\"), "{line}");
}
