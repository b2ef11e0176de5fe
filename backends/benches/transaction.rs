//! Transaction benchmark: `agentdiff run -- true` on the corpus (`../shared/corpus`, scaled with
//! `make-corpus.sh`) against baselines measured in the same run:
//!
//! - cold (first run) vs `sha256sum` over every file + `cp -a` of the tree (target ≤ 3×);
//! - warm (second run, tree unchanged) vs `sha256sum` over every file (target ≤ 1.5×);
//! - bytes the warm run adds to `.agentdiff/` vs the tree's bytes (target ≤ 2%);
//! - peak memory (max RSS) of agentdiff (target ≤ 64 MB at N=8);
//! - `git status` for reference;
//! - in an empty directory: `agentdiff run -- true` against `true` (target: ≤ 15 ms added, median)
//!   and agentdiff's CPU while the command sleeps 10 s (target: ≤ 2% of one core);
//! - in an empty directory: `agentdiff run --runtime bwrap -- true` against
//!   `bwrap --ro-bind / / true` (target: ≤ 15 ms added, median; skipped without bwrap);
//! - with srt on PATH: `agentdiff run --runtime srt -- true` against bare `srt -- true`, measured
//!   pair by pair (target: ratio of medians ≤ 1.10).
//!
//! Run with `cargo bench -p agentdiff --bench transaction` (set `AGENTDIFF_BENCH_N=1,8` to choose
//! scales, `AGENTDIFF_CORPUS=DIR` to point at the corpus folder, and `AGENTDIFF_BENCH_LAUNCH_ONLY=1`
//! to stop after the empty-directory measurements).

// A benchmark is a measuring tool, not library code: a failed step should stop it loudly.
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::zombie_processes
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn corpus_dir() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("AGENTDIFF_CORPUS") {
        return Some(PathBuf::from(dir));
    }
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let candidates = [
        manifest.join("../../shared/corpus"),
        manifest.join("../shared/corpus"),
    ];
    candidates
        .into_iter()
        .find(|c| c.join("make-corpus.sh").is_file())
}

/// What one command cost.
struct Cost {
    wall: Duration,
    cpu: Duration,
    max_rss_kib: u64,
    code: i32,
    /// What the command wrote on stderr (small: read after it exits), shown when it failed.
    stderr: String,
}

/// Run a command, returning wall time and the child's max RSS in KiB. Dirty data left by the
/// previous step (unpacking the corpus, a copy) is flushed first, so that agentdiff's seal —
/// which flushes the filesystem — does not pay for writes that are not its own.
fn timed(cmd: &mut Command) -> (Duration, u64, i32) {
    let _ = Command::new("sync").status();
    let c = measure(cmd);
    (c.wall, c.max_rss_kib, c.code)
}

fn measure(cmd: &mut Command) -> Cost {
    let start = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: pid is our child; status and usage point to valid memory.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4 failed");
    let elapsed = start.elapsed();
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    Cost {
        stderr,
        wall: elapsed,
        cpu: tv(usage.ru_utime) + tv(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
        code,
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Launch overhead and monitor CPU in an empty directory (issue targets for the local backend).
fn launch_overhead(bin: &Path) {
    let dir = tempfile::tempdir().expect("tempdir");
    let runs = 51;
    let direct = median(
        (0..runs)
            .map(|_| measure(&mut Command::new("true")).wall)
            .collect(),
    );
    let wrapped = median(
        (0..runs)
            .map(|_| {
                let c = measure(
                    Command::new(bin)
                        .args(["run", "--fail-on", "never", "--", "true"])
                        .current_dir(dir.path()),
                );
                assert_eq!(c.code, 0, "agentdiff run -- true failed: {}", c.stderr);
                c.wall
            })
            .collect(),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "empty directory: `true` {:.2} ms, `agentdiff run -- true` {:.2} ms (median of {runs}): \
         +{:.2} ms   [target <= 15 ms]",
        ms(direct),
        ms(wrapped),
        ms(wrapped.saturating_sub(direct))
    );
    let sleeping = measure(
        Command::new(bin)
            .args(["run", "--fail-on", "never", "--", "sleep", "10"])
            .current_dir(dir.path()),
    );
    println!(
        "  agentdiff CPU while the command sleeps 10 s: {:.3} s over {:.1} s = {:.2}% of one core   [target <= 2%]",
        sleeping.cpu.as_secs_f64(),
        sleeping.wall.as_secs_f64(),
        sleeping.cpu.as_secs_f64() * 100.0 / sleeping.wall.as_secs_f64()
    );
}

/// `agentdiff run --runtime srt -- true` against bare `srt -- true`, alternating one of each so
/// both see the same machine load; the ratio is of the medians.
fn srt_overhead(bin: &Path) {
    if Command::new("srt")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_or(true, |s| !s.success())
    {
        println!("srt: SKIPPED (not a pass): `srt --version` does not run here");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let pairs = 21;
    // One warm-up of each (page cache, srt's version cached by agentdiff).
    let _ = measure(
        Command::new("srt")
            .args(["--", "true"])
            .current_dir(dir.path()),
    );
    let _ = measure(
        Command::new(bin)
            .args([
                "run",
                "--runtime",
                "srt",
                "--fail-on",
                "never",
                "--",
                "true",
            ])
            .current_dir(dir.path()),
    );
    let (mut bare, mut wrapped) = (Vec::new(), Vec::new());
    for _ in 0..pairs {
        let b = measure(
            Command::new("srt")
                .args(["--", "true"])
                .current_dir(dir.path()),
        );
        assert_eq!(b.code, 0, "srt -- true failed: {}", b.stderr);
        let w = measure(
            Command::new(bin)
                .args([
                    "run",
                    "--runtime",
                    "srt",
                    "--fail-on",
                    "never",
                    "--",
                    "true",
                ])
                .current_dir(dir.path()),
        );
        assert_eq!(
            w.code, 0,
            "agentdiff run --runtime srt -- true failed: {}",
            w.stderr
        );
        bare.push(b.wall);
        wrapped.push(w.wall);
    }
    let (b, w) = (median(bare), median(wrapped));
    println!(
        "srt: bare `srt -- true` {:.1} ms, `agentdiff run --runtime srt -- true` {:.1} ms \
         (medians of {pairs} alternating pairs): ratio {:.3}x   [target <= 1.10x]",
        b.as_secs_f64() * 1000.0,
        w.as_secs_f64() * 1000.0,
        w.as_secs_f64() / b.as_secs_f64()
    );
}

fn sh(script: &str, dir: &Path) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script).current_dir(dir);
    c
}

fn dir_bytes(dir: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-sb"])
        .arg(dir)
        .output()
        .expect("du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn best_of(n: usize, mut f: impl FnMut() -> Duration) -> Duration {
    (0..n).map(|_| f()).min().unwrap_or_default()
}

/// The bwrap backend's overhead over a bare bwrap start, in an empty directory. The four
/// commands are measured in rounds of one each (bare bwrap, bwrap with the backend's controls,
/// `true` under the local backend, `true` under the bwrap backend), so all see the same machine
/// load; medians are compared. The difference splits into what the sandbox itself costs, the
/// transaction every backend pays (local backend over `true`), and the bwrap backend's own part.
fn bwrap_overhead(bin: &Path) {
    let bare = || {
        let mut c = Command::new("bwrap");
        c.args(["--ro-bind", "/", "/", "true"]);
        c
    };
    if !bare().output().is_ok_and(|o| o.status.success()) {
        println!("bwrap: SKIPPED (not a pass): bwrap cannot run here; no bwrap overhead measured");
        return;
    }
    // The same controls the backend applies, without agentdiff: what the sandbox itself costs.
    let full = || {
        let mut c = Command::new("bwrap");
        c.args([
            "--ro-bind",
            "/",
            "/",
            "--dev",
            "/dev",
            "--proc",
            "/proc",
            "--tmpfs",
            "/tmp",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "true",
        ]);
        c
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let agentdiff = |runtime: &str| {
        let c = measure(
            Command::new(bin)
                .args([
                    "run",
                    "--runtime",
                    runtime,
                    "--fail-on",
                    "never",
                    "--",
                    "true",
                ])
                .current_dir(dir.path()),
        );
        assert_eq!(
            c.code, 0,
            "agentdiff run --runtime {runtime} -- true failed: {}",
            c.stderr
        );
        c.wall
    };
    // Warm-up: page cache, the run store's first directories.
    let _ = (agentdiff("local"), agentdiff("bwrap"));
    let rounds = 41;
    let (mut direct, mut sandbox, mut local, mut wrapped) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        direct.push(measure(&mut bare()).wall);
        sandbox.push(measure(&mut full()).wall);
        local.push(agentdiff("local"));
        wrapped.push(agentdiff("bwrap"));
    }
    let (direct, sandbox, local, wrapped) = (
        median(direct),
        median(sandbox),
        median(local),
        median(wrapped),
    );
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let delta = |a: Duration, b: Duration| ms(a) - ms(b);
    println!(
        "empty directory: `bwrap --ro-bind / / true` {:.2} ms, `agentdiff run --runtime bwrap -- \
         true` {:.2} ms (medians of {rounds} interleaved rounds): {:+.2} ms, ratio {:.2}x   \
         [target <= +15 ms]",
        ms(direct),
        ms(wrapped),
        delta(wrapped, direct),
        wrapped.as_secs_f64() / direct.as_secs_f64()
    );
    println!(
        "  of which: the sandbox's controls (bwrap with dev, proc, tmpfs /tmp, namespaces, \
         cap-drop; {:.2} ms) {:+.2} ms; the transaction every backend pays (`agentdiff run \
         --runtime local -- true` {:.2} ms, minus bare bwrap) {:+.2} ms; the bwrap backend's own \
         part (the rest) {:+.2} ms",
        ms(sandbox),
        delta(sandbox, direct),
        ms(local),
        delta(local, direct),
        delta(wrapped, sandbox) - delta(local, direct)
    );
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments.
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_agentdiff"));
    // Every agentdiff started below seals with a key private to this bench, never the user's.
    let state = tempfile::tempdir().expect("tempdir");
    // agentdiff refuses a key directory that group or others can open.
    std::fs::set_permissions(
        state.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod state dir");
    std::env::set_var("AGENTDIFF_STATE_DIR", state.path());
    launch_overhead(&bin);
    bwrap_overhead(&bin);
    srt_overhead(&bin);
    if std::env::var_os("AGENTDIFF_BENCH_LAUNCH_ONLY").is_some() {
        return;
    }
    let Some(corpus) = corpus_dir() else {
        println!(
            "SKIPPED: corpus not found (set AGENTDIFF_CORPUS to the folder with make-corpus.sh)"
        );
        return;
    };
    let scales: Vec<usize> = std::env::var("AGENTDIFF_BENCH_N")
        .unwrap_or_else(|_| "1,8".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    for n in scales {
        let work = tempfile::tempdir().expect("tempdir");
        let tree = work.path().join("tree");
        let status = Command::new("bash")
            .arg(corpus.join("make-corpus.sh"))
            .arg(&tree)
            .arg(n.to_string())
            .stdout(Stdio::null())
            .status()
            .expect("make-corpus");
        assert!(status.success(), "make-corpus.sh failed");
        let tree_bytes = dir_bytes(&tree);
        // Warm the page cache so every measurement reads from memory.
        let _ = timed(&mut sh(
            "find . -type f -print0 | xargs -0 cat > /dev/null",
            &tree,
        ));

        // The built-in policy denies `.git/**`, so agentdiff scans `.git` too: the baselines cover
        // every file of the tree.
        let sha = best_of(3, || {
            timed(&mut sh(
                "find . -type f -print0 | xargs -0 sha256sum > /dev/null",
                &tree,
            ))
            .0
        });
        let copy_dest = work.path().join("copy");
        let cp = best_of(3, || {
            let _ = std::fs::remove_dir_all(&copy_dest);
            timed(Command::new("cp").arg("-a").arg(&tree).arg(&copy_dest)).0
        });
        let _ = std::fs::remove_dir_all(&copy_dest);
        let git = best_of(3, || timed(&mut sh("git status --porcelain", &tree)).0);

        let run = |tree: &Path| {
            let mut c = Command::new(&bin);
            c.args(["run", "--fail-on", "never", "--", "true"])
                .current_dir(tree);
            timed(&mut c)
        };
        let (cold, cold_rss, cold_code) = run(&tree);
        assert_eq!(cold_code, 0, "cold run failed");
        let store_before = dir_bytes(&tree.join(".agentdiff"));
        let (warm, warm_rss, warm_code) = run(&tree);
        assert_eq!(warm_code, 0, "warm run failed");
        let store_after = dir_bytes(&tree.join(".agentdiff"));
        let added = store_after.saturating_sub(store_before);

        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!("corpus N={n}: {:.1} MB", tree_bytes as f64 / 1e6);
        println!(
            "  baselines: sha256sum {:.0} ms, cp -a {:.0} ms, git status {:.0} ms",
            ms(sha),
            ms(cp),
            ms(git)
        );
        println!(
            "  cold run {:.0} ms = {:.2}x (sha256sum + cp -a)   [target <= 3x]",
            ms(cold),
            cold.as_secs_f64() / (sha + cp).as_secs_f64()
        );
        println!(
            "  warm run {:.0} ms = {:.2}x sha256sum   [target <= 1.5x]; {:.2}x git status",
            ms(warm),
            warm.as_secs_f64() / sha.as_secs_f64(),
            warm.as_secs_f64() / git.as_secs_f64()
        );
        println!(
            "  warm run added {} bytes to .agentdiff = {:.3}% of the tree   [target <= 2%]",
            added,
            added as f64 * 100.0 / tree_bytes.max(1) as f64
        );
        println!(
            "  peak RSS: cold {:.1} MB, warm {:.1} MB   [target <= 64 MB at N=8]",
            cold_rss as f64 / 1024.0,
            warm_rss as f64 / 1024.0
        );
    }
}
