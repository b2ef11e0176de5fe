//! Overhead of the local backend, measured against a baseline in the same run.
//!
//! 1. Median wall time of launching `true` through the backend (prepare + launch + wait, with
//!    the default tracking and with `/proc` polling) versus spawning `true` directly.
//! 2. CPU used by agentdiff's monitor while the command sleeps (`/proc/self/stat` utime + stime
//!    over the run), as a share of one core.
//!
//! `cargo run --release -p agentdiff-backend-local --example overhead [-- RUNS [SLEEP_SECONDS]]`

use std::time::{Duration, Instant};

use agentdiff_backend_api::{LaunchContext, LaunchSpec, RuntimeBackend, StdioMode};
use agentdiff_backend_local::LocalBackend;
use agentdiff_conformance::testing::launch_spec;

fn spec(dir: &std::path::Path, argv: &[&str], tracking: Option<&str>) -> LaunchSpec {
    let mut b = launch_spec(dir, argv.iter().copied())
        .run_id("bench")
        .capsule_dir(dir.join(".agentdiff"))
        .env(std::env::vars_os())
        .grace(Duration::from_secs(2));
    if let Some(t) = tracking {
        b = b.option("tracking", t);
    }
    b.build()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn cpu_ticks() -> u64 {
    let text = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = text.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15; `after` starts at field 3.
    let get = |n: usize| {
        f.get(n - 3)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
    };
    get(14) + get(15)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(100);
    let sleep_s: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let dir = tempfile::tempdir()?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let backend = LocalBackend::new();

    let launch = |tracking: Option<&str>, argv: &[&str]| -> Result<Duration, String> {
        let s = spec(dir.path(), argv, tracking);
        let start = Instant::now();
        let ev = rt.block_on(async {
            let p = backend.prepare(&s).map_err(|e| e.to_string())?;
            let r = backend
                .launch(p, LaunchContext::new(StdioMode::Inherit))
                .await
                .map_err(|e| e.to_string())?;
            r.wait().await.map_err(|e| e.to_string())
        })?;
        if ev.exit.code != Some(0) {
            return Err(format!("unexpected exit {:?}", ev.exit));
        }
        Ok(start.elapsed())
    };

    // Warm up caches (binary pages, dentries) for every variant.
    for _ in 0..5 {
        std::process::Command::new("true").status()?;
        launch(None, &["true"])?;
        launch(Some("proc_poll"), &["true"])?;
    }
    let mut direct = Vec::with_capacity(runs);
    let mut auto = Vec::with_capacity(runs);
    let mut poll = Vec::with_capacity(runs);
    // Interleave so drift affects all variants alike.
    for _ in 0..runs {
        let t = Instant::now();
        std::process::Command::new("true").status()?;
        direct.push(t.elapsed());
        auto.push(launch(None, &["true"])?);
        poll.push(launch(Some("proc_poll"), &["true"])?);
    }
    let (d, a, p) = (median(direct), median(auto), median(poll));
    let mechanism = agentdiff_process::tracker::preferred_mechanism();
    println!("launch `true`, median of {runs} runs:");
    println!(
        "  direct spawn                : {:>8.3} ms",
        d.as_secs_f64() * 1e3
    );
    println!(
        "  local backend ({mechanism:<13}): {:>8.3} ms  overhead {:>7.3} ms  ratio {:.2}",
        a.as_secs_f64() * 1e3,
        (a.saturating_sub(d)).as_secs_f64() * 1e3,
        a.as_secs_f64() / d.as_secs_f64()
    );
    println!(
        "  local backend (proc_poll)    : {:>8.3} ms  overhead {:>7.3} ms  ratio {:.2}",
        p.as_secs_f64() * 1e3,
        (p.saturating_sub(d)).as_secs_f64() * 1e3,
        p.as_secs_f64() / d.as_secs_f64()
    );

    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let secs = sleep_s.to_string();
    for tracking in [None, Some("proc_poll")] {
        let before = cpu_ticks();
        let wall = launch(tracking, &["sleep", &secs])?;
        let used = (cpu_ticks() - before) as f64 / hz;
        println!(
            "monitor CPU while `sleep {sleep_s}` runs ({}): {:.3} s CPU over {:.2} s = {:.2}% of one core",
            tracking.unwrap_or(&mechanism),
            used,
            wall.as_secs_f64(),
            100.0 * used / wall.as_secs_f64()
        );
    }
    Ok(())
}
