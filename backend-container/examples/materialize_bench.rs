//! Benchmark (not a test): the cost of the container backend against plain baselines measured in
//! the same run.
//!
//! 1. Materialising the private workspace from the object store (`workspace::materialize_into`)
//!    versus `cp -a` of the same directories, on the benchmark corpus (N copies of the cargo tree).
//! 2. Container start: the backend's launch (checks, `podman run`, evidence) versus a bare
//!    `podman run` of the same rootfs — once with no flags, once with the same controls.
//!
//! Usage: `cargo run --release -p agentdiff-backend-container --example materialize_bench -- [N] [REPS]`
//! (N defaults to 8, REPS to 5). Set AGENTDIFF_BENCH_CORPUS=DIR to reuse an unpacked corpus
//! (`../shared/corpus/make-corpus.sh DIR N`); otherwise one is unpacked into a temp directory.
//! Part 2 is skipped, with the reason printed, when podman or /bin/busybox is missing.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentdiff_backend_api::{LaunchContext, RuntimeBackend, StdioMode};
use agentdiff_backend_container::ContainerBackend;
use agentdiff_engine::workspace::materialize_into;
use agentdiff_scan::{scan, BackupRequest, ScanOptions, DEFAULT_MAX_HASH_BYTES};
use agentdiff_store::Store;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sync() {
    let _ = Command::new("sync").status();
}

fn corpus(n: usize, scratch: &Path) -> Res<PathBuf> {
    if let Some(dir) = std::env::var_os("AGENTDIFF_BENCH_CORPUS") {
        return Ok(PathBuf::from(dir));
    }
    // `../shared/corpus` beside the repository (one level further up from a git worktree).
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = [
        "../shared/corpus/make-corpus.sh",
        "../../shared/corpus/make-corpus.sh",
    ]
    .iter()
    .map(|p| repo.join(p))
    .find(|p| p.exists())
    .ok_or("make-corpus.sh not found in ../shared/corpus; set AGENTDIFF_BENCH_CORPUS")?;
    let dest = scratch.join("corpus");
    let st = Command::new("bash")
        .arg(&script)
        .arg(&dest)
        .arg(n.to_string())
        .status()?;
    if !st.success() {
        return Err(format!("{} failed", script.display()).into());
    }
    Ok(dest)
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: usize = args.first().map(|s| s.parse()).transpose()?.unwrap_or(8);
    let reps: usize = args
        .get(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(5)
        .max(1);
    let scratch = tempfile::Builder::new()
        .prefix("agentdiff-bench-")
        .tempdir_in(
            std::env::var_os("AGENTDIFF_BENCH_SCRATCH")
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir),
        )?;
    let root = corpus(n, scratch.path())?;

    // Capture once (not timed): the before-manifest and its objects, as a run would.
    let store = Store::open(&root)?;
    let mut opts = ScanOptions::new();
    opts.backup = Some(BackupRequest {
        sink: store.objects(),
        max_file_bytes: DEFAULT_MAX_HASH_BYTES,
    });
    let t = Instant::now();
    let before = scan(&root, &opts)?;
    println!(
        "corpus {}: {} files, {} dirs, {} symlinks (capture with backups: {:.0} ms, not part of the comparison)",
        root.display(),
        before.stats.files,
        before.stats.directories,
        before.stats.symlinks,
        ms(t.elapsed())
    );
    // cp -a gets the same top-level entries the scan captured (no .git, no .agentdiff).
    let mut top: Vec<PathBuf> = before
        .entries
        .keys()
        .filter(|k| !k.contains('/'))
        .map(|k| root.join(k))
        .collect();
    top.sort();

    let mut ours = Vec::new();
    let mut cp = Vec::new();
    for i in 0..reps {
        let dest = scratch.path().join(format!("ws-{i}"));
        sync();
        let t = Instant::now();
        let stats = materialize_into(store.objects(), &before, &dest, 0)?;
        ours.push(t.elapsed());
        if i == 0 {
            println!(
                "materialize: {} files, {} bytes, {} threads",
                stats.files, stats.bytes, stats.threads
            );
        }
        let cp_dest = scratch.path().join(format!("cp-{i}"));
        std::fs::create_dir(&cp_dest)?;
        sync();
        let t = Instant::now();
        let st = Command::new("cp")
            .arg("-a")
            .args(&top)
            .arg(&cp_dest)
            .status()?;
        cp.push(t.elapsed());
        if !st.success() {
            return Err("cp -a failed".into());
        }
        std::fs::remove_dir_all(&dest)?;
        std::fs::remove_dir_all(&cp_dest)?;
    }
    let (m, c) = (median(ours.clone()), median(cp.clone()));
    println!(
        "materialize median {:.0} ms vs cp -a median {:.0} ms over {reps} runs: ratio {:.2} (budget 1.50)",
        ms(m),
        ms(c),
        m.as_secs_f64() / c.as_secs_f64()
    );
    println!(
        "  materialize runs (ms): {:?}\n  cp -a runs (ms):       {:?}",
        ours.iter().map(|d| ms(*d).round()).collect::<Vec<_>>(),
        cp.iter().map(|d| ms(*d).round()).collect::<Vec<_>>()
    );
    drop(store);

    start_overhead(scratch.path(), reps.max(5))?;
    Ok(())
}

fn start_overhead(scratch: &Path, reps: usize) -> Res<()> {
    if which::which("podman").is_err() || !Path::new("/bin/busybox").exists() {
        println!("container start: SKIPPED (podman or /bin/busybox missing)");
        return Ok(());
    }
    let rootfs = scratch.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin"))?;
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))?;
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/true"))?;
    std::os::unix::fs::symlink("busybox", rootfs.join("bin/sh"))?;
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&rootfs, std::fs::Permissions::from_mode(0o755))?;
    }
    let project = scratch.join("project");
    let ws = project.join(".agentdiff/workspaces/bench");
    std::fs::create_dir_all(&ws)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let backend = ContainerBackend::new();
    let mut bare = Vec::new();
    let mut bare_flags = Vec::new();
    let mut ours = Vec::new();
    for i in 0..reps + 1 {
        let run_id = format!("bench-{i}");
        let spec = agentdiff_conformance::testing::launch_spec(&ws, ["/bin/true"])
            .run_id(run_id.clone())
            .root(&project)
            .capsule_dir(scratch)
            .env(Vec::<(OsString, OsString)>::new())
            .timeout(Duration::from_secs(60))
            .poll_interval(Duration::from_millis(50))
            .option("engine", "podman")
            .option("rootfs", rootfs.to_string_lossy().into_owned())
            .build();
        let prepared = backend.prepare(&spec)?;
        let flags: Vec<OsString> = prepared.args().to_vec();

        let t = Instant::now();
        let st = Command::new("podman")
            .args(["run", "--rm", "--rootfs"])
            .arg(&rootfs)
            .arg("/bin/true")
            .status()?;
        let d_bare = t.elapsed();
        if !st.success() {
            return Err("bare podman run failed".into());
        }
        // The same controls, straight from the engine.
        let mut same = flags.clone();
        same[3] = format!("agentdiff-bare-{i}").into();
        let t = Instant::now();
        let st = Command::new("podman").args(&same).status()?;
        let d_flags = t.elapsed();
        if !st.success() {
            return Err("podman run with the same flags failed".into());
        }
        let t = Instant::now();
        let ev = rt.block_on(async {
            let running = backend
                .launch(prepared, LaunchContext::new(StdioMode::Inherit))
                .await?;
            running.wait().await
        })?;
        let d_ours = t.elapsed();
        if ev.exit.code != Some(0) {
            return Err(format!("backend run failed: {:?}", ev.exit).into());
        }
        // The first round warms caches and is not counted.
        if i > 0 {
            bare.push(d_bare);
            bare_flags.push(d_flags);
            ours.push(d_ours);
        }
    }
    let (b, f, o) = (median(bare), median(bare_flags), median(ours));
    println!(
        "container start (/bin/true, {reps} runs, medians): bare podman run {:.0} ms; podman run with the same controls {:.0} ms; agentdiff backend {:.0} ms",
        ms(b),
        ms(f),
        ms(o)
    );
    println!(
        "  overhead vs bare run: {:+.0}% ; overhead vs the same controls: {:+.0}% (budget +20%)",
        (o.as_secs_f64() / b.as_secs_f64() - 1.0) * 100.0,
        (o.as_secs_f64() / f.as_secs_f64() - 1.0) * 100.0
    );
    Ok(())
}
