//! Tests of the `agentdiff` binary. Every `agentdiff` a test spawns is built by [`cmd`], which
//! gives it [`state_dir`] as `AGENTDIFF_STATE_DIR` (tests never read or create the real user's
//! seal key and ledger) and clears `AGENTDIFF_POLICY` (the developer's own policy never leaks in).
//! A test that needs another state directory overrides the variable on the returned command.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod attest_cli;
mod browser_cli;
mod bwrap_cli;
mod bwrap_controls_cli;
mod bwrap_egress_cli;
mod bwrap_git_dirs_cli;
mod bwrap_hardening_cli;
mod bwrap_home_cli;
mod claude_cli;
mod cleanup_cli;
mod container_egress_cli;
mod container_identity_cli;
mod container_workspace_cli;
mod egress_review_cli;
mod evidence_cli;
mod external_cli;
mod hook_cli;
mod hook_install_cli;
mod hook_install_files_cli;
mod hook_shell_cli;
pub mod html_cli;
mod markdown_cli;
mod output_files_cli;
mod planted_programs_cli;
mod policy_cli;
mod process_evidence_cli;
mod prune_cli;
mod remote_engine_cli;
mod report_honesty_cli;
mod rollback_cli;
mod run_cli;
mod runs_cli;
mod safe_defaults_cli;
pub mod serve_cli;
pub mod session_cli;
mod stat_cache_cli;
mod terminal_cli;

/// A seal key and ledger private to this test process.
pub fn state_dir() -> &'static Path {
    static DIR: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    // A directory agentdiff creates itself (0700) inside the temp dir.
    let (_, path) = DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp state dir");
        let path = dir.path().join("state");
        (dir, path)
    });
    path
}

/// The `agentdiff` binary under test.
pub fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_agentdiff"))
}

/// `agentdiff ARGS` in `cwd`, with the tests' state directory and no `AGENTDIFF_POLICY`.
pub fn cmd(cwd: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.args(args);
    isolate(&mut c, cwd);
    c
}

/// `agentdiff ARGS` in `cwd` inside a private mount namespace (`unshare -m`, root) after the
/// shell commands `setup` have run there, with [`cmd`]'s environment: for read-only or full
/// filesystems. Whether the namespace or `setup` failed shows as `mount:`/`unshare:` on stderr.
pub fn in_mount_namespace(cwd: &Path, setup: &str, args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    // `cd` after `setup`: a mount over the working directory is seen only through a new lookup.
    c.args([
        "-m",
        "sh",
        "-c",
        &format!("{setup} && cd \"$1\" && shift && exec \"$@\""),
    ])
    .arg("sh")
    .arg(cwd)
    .arg(bin())
    .args(args);
    isolate(&mut c, cwd);
    c
}

fn isolate(c: &mut Command, cwd: &Path) {
    c.current_dir(cwd)
        .env_remove("AGENTDIFF_POLICY")
        .env("AGENTDIFF_STATE_DIR", state_dir());
}

/// A project and a state directory for a run as an unprivileged user: when the tests run as root
/// (who passes every ptrace check), both belong to `nobody` and [`Unprivileged::command`] runs
/// agentdiff as `nobody`.
pub struct Unprivileged {
    base: tempfile::TempDir,
    pub proj: std::path::PathBuf,
    state: std::path::PathBuf,
    as_nobody: bool,
}

impl Unprivileged {
    pub fn new() -> Self {
        use std::os::unix::fs::PermissionsExt;
        let base = tempfile::tempdir().unwrap();
        std::fs::set_permissions(base.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let (proj, state) = (base.path().join("proj"), base.path().join("state"));
        std::fs::create_dir(&proj).unwrap();
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
        let as_nobody = nix::unistd::geteuid().is_root();
        if as_nobody {
            let chown = Command::new("chown")
                .args(["-R", "65534:65534"])
                .arg(&proj)
                .arg(&state)
                .status()
                .unwrap();
            assert!(chown.success());
        }
        Self {
            base,
            proj,
            state,
            as_nobody,
        }
    }

    /// `agentdiff ARGS` in the project, with this state directory and home.
    pub fn command(&self, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = Command::new(bin());
        c.args(args)
            .current_dir(&self.proj)
            .env_remove("AGENTDIFF_POLICY")
            .env("AGENTDIFF_STATE_DIR", &self.state)
            .env("HOME", self.base.path());
        if self.as_nobody {
            c.uid(65534).gid(65534);
        }
        c
    }
}

/// Runs [`cmd`] to completion.
pub fn agentdiff(cwd: &Path, args: &[&str]) -> Output {
    cmd(cwd, args).output().expect("agentdiff runs")
}

/// Runs [`cmd`] with `input` on its standard input.
pub fn agentdiff_with_stdin(cwd: &Path, args: &[&str], input: &str) -> Output {
    let mut child = cmd(cwd, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("agentdiff starts");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    pipe.write_all(input.as_bytes())
        .expect("stdin accepts the input");
    drop(pipe);
    child.wait_with_output().expect("agentdiff finishes")
}

/// `agentdiff run --format json [extra…] -- argv…` in `cwd` → (exit code, result, output).
pub fn run_json(cwd: &Path, extra: &[&str], argv: &[&str]) -> (i32, Value, Output) {
    let mut args = vec!["run", "--format", "json"];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(argv);
    let out = agentdiff(cwd, &args);
    let json = json_of(&out);
    (out.status.code().unwrap_or(-1), json, out)
}

/// The one JSON document on `out`'s standard output (panics with both streams otherwise).
pub fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}); stdout={} stderr={}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// Output bytes as text (lossy: tests print what they got).
/// The paths of a result's recorded changes, in its order.
pub fn changed_paths(result: &Value) -> Vec<String> {
    result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_string())
        .collect()
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Asserts the exit code, showing both streams when it differs.
#[track_caller]
pub fn assert_exit(out: &Output, code: i32) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout={} stderr={}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
