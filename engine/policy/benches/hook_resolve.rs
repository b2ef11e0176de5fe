//! Hook path resolution cost against path length, as ratios measured in the same run.
//!
//! Paths of n = 192, 384, 768 and 1536 components (the last near PATH_MAX) (`d/..` pairs through a real directory, and
//! a symlink chain of 40 links whose targets are 4,000-byte `d/..` paths) are resolved with
//! `policy::hook::resolve`; the time per component should stay flat (ratio to n = 192 near 1),
//! since resolution is linear. Run with `cargo bench -p agentdiff-policy --bench hook_resolve`.

// A benchmark is a measuring tool, not library code: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::time::{Duration, Instant};

use agentdiff_policy::hook::resolve;

fn time(root: &Path, path: &str, rounds: u32) -> Duration {
    let started = Instant::now();
    for _ in 0..rounds {
        resolve(root, Path::new(path)).expect("the path resolves");
    }
    started.elapsed() / rounds
}

fn main() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::create_dir(root.join("d")).unwrap();
    let mut base_per_component = None;
    println!("components  time/path   time/component  ratio to n=192");
    for n in [192usize, 384, 768, 1536] {
        let path = format!("{}x", "d/../".repeat(n / 2));
        let t = time(&root, &path, 50);
        let per = t.as_secs_f64() / n as f64;
        let base = *base_per_component.get_or_insert(per);
        println!(
            "{n:>10}  {:>9.1?}  {:>12.2} µs  {:>6.2}",
            t,
            per * 1e6,
            per / base
        );
    }
    // The worst case the bounds allow: 40 symlinks, each a 4,000-byte target that climbs
    // in and out of `d` before naming the next link.
    for i in 0..40 {
        let next = if i == 39 {
            "x".to_owned()
        } else {
            format!("l{}", i + 1)
        };
        let target = format!("{}{next}", "d/../".repeat(790));
        std::os::unix::fs::symlink(target, root.join(format!("l{i}"))).unwrap();
    }
    let t = time(&root, "l0", 5);
    let components = 40 * (790 * 2 + 1);
    println!(
        "40 links x 4,000 bytes ({components} components): {:.1?} ({:.2} µs/component)",
        t,
        t.as_secs_f64() / components as f64 * 1e6
    );
}
