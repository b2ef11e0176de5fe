//! Agent hook benchmark, against baselines measured in the same run:
//!
//! - the PreToolUse hook's decision time for file tools (`Write`, `Edit`, `Read` in a project
//!   with the starter policy), process start included, median over [`DECISIONS`] calls each,
//!   against starting agentdiff at all (`agentdiff --version`) (target: ≤ 5 ms p50);
//! - the wall time a sandboxed `Bash` call adds over the bare command, on the corpus
//!   (`../shared/corpus`, `make-corpus.sh DEST N`) at each N of `AGENTDIFF_BENCH_N` (default
//!   `1,8`): the hook's answer plus the rewritten command run as Claude Code runs it (`eval` in
//!   bash), minus `bash -c true` (the hook's answer also shown on its own); median of
//!   [`SHELL_CALLS`] calls after one warm-up call
//!   (targets: ≤ 50 ms at N=1; ≤ 2× `git status --porcelain` on that tree + 15 ms at N=8).
//!   Needs bubblewrap (the runtime `hook install --runtime bwrap` verifies); skipped without it.
//!
//! Run with `cargo bench -p agentdiff --bench agent_hook` (`AGENTDIFF_BENCH_BIN=PATH` measures
//! another agentdiff binary; `AGENTDIFF_BENCH_BASE_BIN=PATH` also measures a second binary's
//! sandboxed calls, call by call alternating with the first on the same tree, store and state
//! directory, and prints both: a before/after comparison under the same load).

// A benchmark is a measuring tool, not library code: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{corpus_dir, median};

const DECISIONS: usize = 41;
const SHELL_CALLS: usize = 11;

fn bin() -> PathBuf {
    std::env::var_os("AGENTDIFF_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_agentdiff")))
}

/// The binary compared with [`bin`] (`AGENTDIFF_BENCH_BASE_BIN`), if any.
fn base_bin() -> Option<PathBuf> {
    std::env::var_os("AGENTDIFF_BENCH_BASE_BIN").map(PathBuf::from)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Wall time of `cmd` with `input` on stdin; its stdout.
fn timed(cmd: &mut Command, input: &[u8]) -> (Duration, Vec<u8>) {
    let start = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    let wall = start.elapsed();
    assert!(out.status.success(), "{cmd:?} failed: {out:?}");
    (wall, out.stdout)
}

fn agentdiff(state: &Path, cwd: &Path) -> Command {
    agentdiff_at(&bin(), state, cwd)
}

fn agentdiff_at(program: &Path, state: &Path, cwd: &Path) -> Command {
    let mut c = Command::new(program);
    c.current_dir(cwd)
        .env_remove("AGENTDIFF_POLICY")
        .env_remove("AGENTDIFF_HOOK_DEADLINE")
        .env("AGENTDIFF_STATE_DIR", state);
    c
}

fn call(root: &Path, tool: &str, input: serde_json::Value) -> Vec<u8> {
    serde_json::json!({
        "session_id": "bench",
        "cwd": root,
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": input,
        "tool_use_id": "toolu_bench",
    })
    .to_string()
    .into_bytes()
}

fn file_tool_decisions(state: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/lib.rs"), "pub fn f() {}\n").unwrap();
    let init = agentdiff(state, &root)
        .args(["policy", "init", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(init.status.success());
    let start = median(
        (0..DECISIONS)
            .map(|_| timed(agentdiff(state, &root).arg("--version"), b"").0)
            .collect(),
    );
    println!("hook decision time, file tools (median of {DECISIONS}, process start included):");
    println!("  baseline: agentdiff --version  {:.2} ms", ms(start));
    let calls = [
        (
            "Write",
            serde_json::json!({"file_path": root.join("src/new.rs"), "content": "x"}),
        ),
        (
            "Edit",
            serde_json::json!({"file_path": root.join("src/lib.rs"), "old_string": "f", "new_string": "g"}),
        ),
        (
            "Read",
            serde_json::json!({"file_path": root.join("src/lib.rs")}),
        ),
    ];
    for (tool, input) in calls {
        let input = call(&root, tool, input);
        let p50 = median(
            (0..DECISIONS)
                .map(|_| {
                    timed(
                        agentdiff(state, &root)
                            .args(["hook", "pre-tool-use", "--root"])
                            .arg(&root),
                        &input,
                    )
                    .0
                })
                .collect(),
        );
        println!(
            "  {tool:<6} p50 {:.2} ms ({:.2}x the baseline, {:+.2} ms over it; target <= 5 ms: {})",
            ms(p50),
            p50.as_secs_f64() / start.as_secs_f64(),
            ms(p50) - ms(start),
            if p50 <= Duration::from_millis(5) {
                "met"
            } else {
                "NOT met"
            }
        );
    }
}

fn bwrap_works() -> bool {
    Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--unshare-net", "--", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One sandboxed call as Claude Code makes it: the hook's answer, then its command in bash.
/// (time to the hook's answer, time to the command's end)
fn sandboxed_call(program: &Path, state: &Path, tree: &Path, input: &[u8]) -> (Duration, Duration) {
    let start = Instant::now();
    let (hook, answer) = timed(
        agentdiff_at(program, state, tree)
            .args(["hook", "pre-tool-use", "--runtime", "bwrap", "--root"])
            .arg(tree),
        input,
    );
    let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap();
    let output = &answer["hookSpecificOutput"];
    assert_eq!(output["permissionDecision"], "allow", "{answer}");
    let command = output["updatedInput"]["command"].as_str().unwrap();
    let status = Command::new("bash")
        .args(["-c", "eval \"$1\"", "bash", command])
        .current_dir(tree)
        .env("AGENTDIFF_STATE_DIR", state)
        .env_remove("AGENTDIFF_POLICY")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    (hook, start.elapsed())
}

fn shell_overhead(state: &Path, corpus: &Path, n: usize) {
    let dest = tempfile::tempdir().unwrap();
    let tree = dest.path().join("tree");
    let made = Command::new("bash")
        .arg(corpus.join("make-corpus.sh"))
        .arg(&tree)
        .arg(n.to_string())
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let tree = tree.canonicalize().unwrap();
    let installed = agentdiff(state, &tree)
        .args(["hook", "install", "--runtime", "bwrap", "--root"])
        .arg(&tree)
        .output()
        .unwrap();
    assert!(installed.status.success(), "{installed:?}");
    let input = call(
        &tree,
        "Bash",
        serde_json::json!({"command": "true", "description": "bench"}),
    );
    let programs: Vec<PathBuf> = std::iter::once(bin()).chain(base_bin()).collect();
    for program in &programs {
        // Warm-up: the first run hashes the whole tree.
        sandboxed_call(program, state, &tree, &input);
    }
    let mut bare = Vec::new();
    let mut calls: Vec<Calls> = programs.iter().map(|_| Calls::default()).collect();
    let mut git = Vec::new();
    for round in 0..SHELL_CALLS {
        bare.push(timed(Command::new("bash").args(["-c", "true"]), b"").0);
        // Alternating which binary goes first, so neither always follows the other.
        for k in 0..programs.len() {
            let i = (k + round) % programs.len();
            let (hook, total) = sandboxed_call(&programs[i], state, &tree, &input);
            calls[i].hooks.push(hook);
            calls[i].totals.push(total);
        }
        git.push(
            timed(
                Command::new("git")
                    .args(["status", "--porcelain"])
                    .current_dir(&tree),
                b"",
            )
            .0,
        );
    }
    let (bare, git) = (median(bare), median(git));
    let target = if n <= 1 {
        Duration::from_millis(50)
    } else {
        git * 2 + Duration::from_millis(15)
    };
    println!(
        "sandboxed Bash call on the corpus N={n} (median of {SHELL_CALLS}, after one warm-up):"
    );
    println!("  bare `bash -c true`            {:.2} ms", ms(bare));
    println!("  git status --porcelain         {:.2} ms", ms(git));
    for (program, calls) in programs.iter().zip(calls) {
        let (sandboxed, hook) = (median(calls.totals), median(calls.hooks));
        let added = sandboxed.saturating_sub(bare);
        if programs.len() > 1 {
            println!("  {}:", program.display());
        }
        println!("  hook + sandboxed run           {:.2} ms", ms(sandboxed));
        println!("    of which the hook's answer   {:.2} ms", ms(hook));
        println!(
            "  added {:.2} ms ({:.2}x git status; target <= {:.2} ms: {})",
            ms(added),
            added.as_secs_f64() / git.as_secs_f64(),
            ms(target),
            if added <= target { "met" } else { "NOT met" }
        );
    }
}

/// One binary's sandboxed calls: the time to the hook's answer and to the command's end.
#[derive(Default)]
struct Calls {
    hooks: Vec<Duration>,
    totals: Vec<Duration>,
}

fn main() {
    let state = tempfile::tempdir().unwrap();
    let state = state.path().join("state");
    println!("agentdiff: {}", bin().display());
    if let Some(base) = base_bin() {
        println!("compared with: {} (sandboxed calls only)", base.display());
    }
    file_tool_decisions(&state);
    if !bwrap_works() {
        println!("sandboxed Bash call: skipped (bubblewrap is not usable here)");
        return;
    }
    let Some(corpus) = corpus_dir() else {
        println!("sandboxed Bash call: skipped (no corpus; set AGENTDIFF_CORPUS)");
        return;
    };
    let scales = std::env::var("AGENTDIFF_BENCH_N").unwrap_or_else(|_| "1,8".to_owned());
    for n in scales.split(',').filter_map(|s| s.trim().parse().ok()) {
        shell_overhead(&state, &corpus, n);
    }
}
