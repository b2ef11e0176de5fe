//! What one listening-socket snapshot costs through netlink sock_diag and through `/proc/net`,
//! as medians of wall time and of process CPU time (user + kernel).
//!
//! ```text
//! cargo run --release -p agentdiff-process --example port_snapshot [-- RUNS]
//! ```

use std::collections::BTreeSet;
use std::error::Error;
use std::time::{Duration, Instant};

use agentdiff_process::ports::{proc_net_snapshot, sock_diag_snapshot, Snapshot, SnapshotReader};

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills a zeroed struct we own.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointer to `ru`.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// Median wall time per snapshot, and mean CPU time per snapshot.
fn measure(runs: usize, mut f: impl FnMut()) -> (Duration, Duration) {
    f();
    let mut wall = Vec::with_capacity(runs);
    let cpu = cpu_time();
    for _ in 0..runs {
        let t = Instant::now();
        f();
        wall.push(t.elapsed());
    }
    (median(wall), (cpu_time() - cpu) / runs.max(1) as u32)
}

fn keys(s: &Snapshot) -> BTreeSet<(&'static str, String, u16, u64)> {
    s.listeners
        .iter()
        .map(|l| (l.protocol, l.address.clone(), l.port, l.inode))
        .collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let runs: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);

    let diag = sock_diag_snapshot()?;
    let proc = proc_net_snapshot();
    let (d, p) = (keys(&diag), keys(&proc));
    println!(
        "listeners: sock_diag {}, /proc/net {}, in only one of them {} (sockets may change in between)",
        d.len(),
        p.len(),
        d.symmetric_difference(&p).count()
    );

    let mut reader = SnapshotReader::default();
    let mut snap = Snapshot::default();
    let rows = [
        (
            "sock_diag, socket reused (observer)",
            measure(runs, || reader.read_into(&mut snap)),
        ),
        (
            "sock_diag, new socket each time",
            measure(runs, || {
                let _ = sock_diag_snapshot();
            }),
        ),
        (
            "/proc/net/{tcp,tcp6,udp,udp6}",
            measure(runs, || {
                let _ = proc_net_snapshot();
            }),
        ),
    ];
    println!("one snapshot, {runs} runs: median wall, mean CPU (user + kernel)");
    for (what, (wall, cpu)) in rows {
        println!(
            "  {what:<38} {:>10.1} µs {:>10.1} µs",
            wall.as_secs_f64() * 1e6,
            cpu.as_secs_f64() * 1e6
        );
    }
    Ok(())
}
