//! Benchmark (not a test) of remote mode against a running engine API service, with baselines
//! measured in the same run:
//!
//! 1. Shipping: the workspace into a created container and back (`remote::ship_in` then
//!    `remote::ship_out`, through the engine's archive API and the checked unpack) for the N=1 and
//!    N=8 corpus, versus `tar -c | tar -x` of the same tree on this machine.
//! 2. Many at once: 8 concurrent remote runs (each its own project, workspace and container)
//!    versus the same 8 runs one after another.
//!
//! Usage: `cargo run --release -p agentdiff-backend-container --example remote_bench -- URL IMAGE [REPS]`
//! with a podman API service at URL holding IMAGE (a busybox image), for instance one that shares
//! no filesystem with this machine:
//! `unshare -m --propagation private sh -c 'mount -t tmpfs tmpfs /tmp; … podman --root /tmp/e/root
//! --runroot /tmp/e/run system service --time=0 tcp://127.0.0.1:PORT'` (the test
//! `real_remote.rs` shows the whole script). Set AGENTDIFF_BENCH_CORPUS1 / AGENTDIFF_BENCH_CORPUS8
//! to reuse unpacked corpora (`../shared/corpus/make-corpus.sh DIR N`); otherwise they are
//! unpacked into a temp directory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agentdiff_backend_api::{LaunchContext, RuntimeBackend, StdioMode};
use agentdiff_backend_container::engine::{Engine, EngineKind};
use agentdiff_backend_container::options::UserSpec;
use agentdiff_backend_container::{archive, remote, ContainerBackend};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn corpus(n: usize, scratch: &Path) -> Res<PathBuf> {
    if let Some(dir) = std::env::var_os(format!("AGENTDIFF_BENCH_CORPUS{n}")) {
        return Ok(PathBuf::from(dir));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let script = [
        "../shared/corpus/make-corpus.sh",
        "../../shared/corpus/make-corpus.sh",
    ]
    .iter()
    .map(|p| repo.join(p))
    .find(|p| p.exists())
    .ok_or("make-corpus.sh not found in ../shared/corpus; set AGENTDIFF_BENCH_CORPUS{N}")?;
    let dest = scratch.join(format!("corpus{n}"));
    let st = Command::new("bash")
        .arg(&script)
        .arg(&dest)
        .arg(n.to_string())
        .stdout(std::process::Stdio::null())
        .status()?;
    if !st.success() {
        return Err("make-corpus.sh failed".into());
    }
    Ok(dest)
}

fn tar_pipe(src: &Path, dest: &Path) -> Res<Duration> {
    std::fs::create_dir_all(dest)?;
    let t = Instant::now();
    let st = Command::new("sh")
        .arg("-c")
        .arg("tar -C \"$1\" -cf - . | tar -C \"$2\" -xf -")
        .arg("sh")
        .arg(src)
        .arg(dest)
        .status()?;
    let d = t.elapsed();
    if !st.success() {
        return Err("tar | tar failed".into());
    }
    Ok(d)
}

async fn ship_round(engine: &Engine, image: &str, workdir: &Path) -> Res<(Duration, u64)> {
    let id = engine
        .call_ok(&[
            "create",
            "--mount",
            "type=volume,destination=/workspace",
            "--",
            image,
            "true",
        ])
        .await?;
    let owner = UserSpec { uid: 0, gid: 0 };
    let t = Instant::now();
    let shipped = remote::ship_in(engine, id.trim(), workdir, owner).await;
    let back = match shipped {
        Ok(_) => remote::ship_out(engine, id.trim(), workdir, archive::Limits::default())
            .await
            .map(|o| o.facts.stream_bytes),
        Err(e) => Err(e),
    };
    let d = t.elapsed();
    remote::remove_verified(engine, id.trim()).await?;
    Ok((d, back?))
}

fn shipping(
    rt: &tokio::runtime::Runtime,
    url: &str,
    image: &str,
    reps: usize,
    scratch: &Path,
) -> Res<()> {
    let engine = Engine {
        kind: EngineKind::Podman,
        program: which("podman")?,
        env: vec![("CONTAINER_HOST".into(), url.into())],
    };
    for n in [1usize, 8] {
        let src = corpus(n, scratch)?;
        // The workspace is replaced by what comes back, so ship a copy.
        let work = scratch.join(format!("ws{n}"));
        tar_pipe(&src, &work)?;
        let mut ours = Vec::new();
        let mut base = Vec::new();
        let mut bytes = 0;
        for i in 0..reps {
            let (d, b) = rt.block_on(ship_round(&engine, image, &work))?;
            ours.push(d);
            bytes = b;
            let dest = scratch.join(format!("base{n}-{i}"));
            base.push(tar_pipe(&src, &dest)?);
            std::fs::remove_dir_all(&dest)?;
        }
        let (o, b) = (median(ours), median(base));
        println!(
            "ship in + out, corpus N={n} ({:.0} MB tar, {reps} runs, medians): {:.0} ms vs tar -c | tar -x {:.0} ms: {:.2}x",
            bytes as f64 / 1e6,
            ms(o),
            ms(b),
            o.as_secs_f64() / b.as_secs_f64()
        );
        std::fs::remove_dir_all(&work)?;
    }
    Ok(())
}

fn which(name: &str) -> Res<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{name} not found on PATH").into())
}

async fn one_run(url: &str, image: &str, scratch: &Path, tag: &str) -> Res<()> {
    let project = scratch.join(format!("p-{tag}"));
    let ws = project.join(".agentdiff/workspaces").join(tag);
    std::fs::create_dir_all(ws.join("src"))?;
    for f in 0..20 {
        std::fs::write(ws.join("src").join(format!("f{f}.txt")), format!("{f}\n"))?;
    }
    let spec =
        agentdiff_conformance::testing::launch_spec(&ws, ["sh", "-c", "cat src/* > all.txt"])
            .run_id(tag.to_string())
            .root(&project)
            .capsule_dir(scratch)
            .env(Vec::<(OsString, OsString)>::new())
            .timeout(Duration::from_secs(120))
            .poll_interval(Duration::from_millis(50))
            .option("engine", "podman")
            .option("image", image.to_string())
            .option("engine-host", url.to_string())
            .build();
    let backend = ContainerBackend::new();
    let prepared = backend.prepare(&spec)?;
    let running = backend
        .launch(prepared, LaunchContext::new(StdioMode::Inherit))
        .await?;
    let ev = running.wait().await?;
    if ev.exit.code != Some(0) || ev.failure.is_some() || !ws.join("all.txt").exists() {
        return Err(format!("remote run {tag} failed: {:?} {:?}", ev.exit, ev.failure).into());
    }
    std::fs::remove_dir_all(&project)?;
    Ok(())
}

fn many(rt: &tokio::runtime::Runtime, url: &str, image: &str, scratch: &Path) -> Res<()> {
    // Warm-up, not counted.
    rt.block_on(one_run(url, image, scratch, "warm"))?;
    let t = Instant::now();
    for i in 0..8 {
        rt.block_on(one_run(url, image, scratch, &format!("seq-{i}")))?;
    }
    let sequential = t.elapsed();
    let t = Instant::now();
    rt.block_on(async {
        let runs: Vec<_> = (0..8)
            .map(|i| {
                let (url, image, scratch) =
                    (url.to_string(), image.to_string(), scratch.to_path_buf());
                tokio::spawn(async move {
                    one_run(&url, &image, &scratch, &format!("par-{i}"))
                        .await
                        .map_err(|e| e.to_string())
                })
            })
            .collect();
        for r in runs {
            r.await.map_err(|e| e.to_string())??;
        }
        Ok::<(), String>(())
    })?;
    let concurrent = t.elapsed();
    println!(
        "8 remote runs: concurrently {:.0} ms vs one after another {:.0} ms: {:.2}x",
        ms(concurrent),
        ms(sequential),
        concurrent.as_secs_f64() / sequential.as_secs_f64()
    );
    Ok(())
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(url), Some(image)) = (args.first(), args.get(1)) else {
        return Err("usage: remote_bench URL IMAGE [REPS]".into());
    };
    let reps: usize = args.get(2).map(|r| r.parse()).transpose()?.unwrap_or(3);
    let scratch = tempfile::Builder::new()
        .prefix("agentdiff-remote-bench-")
        .tempdir_in("/var/tmp")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    shipping(&rt, url, image, reps, scratch.path())?;
    many(&rt, url, image, scratch.path())?;
    Ok(())
}
