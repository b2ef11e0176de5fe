//! Scan cost of an ignored tree that deny globs force the walk to search, as ratios against
//! `find` over the same tree in the same run.
//!
//! The tree holds a small project plus an ignored directory (`.agentdiffignore`: `vendor/`) of
//! 20,000 files in 200 directories, one of them a `.pem`. Three scans are timed: no deny globs
//! (the ignored directory is skipped), the built-in policy's `**/*.pem`/`**/*.key` (the directory
//! is searched: every name listed, only named paths recorded), and `vendor/keys/**` (only the
//! literal prefix is descended). `find ROOT` (list and type every entry) is the baseline.
//! Run with `cargo bench -p agentdiff-scan --bench scan_ignored`.

// A benchmark is a measuring tool, not library code: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use agentdiff_scan::{scan, ScanOptions};

const ROUNDS: u32 = 7;

fn best_of(mut f: impl FnMut()) -> Duration {
    (0..ROUNDS)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap()
}

fn build_tree(root: &Path) {
    std::fs::create_dir_all(root.join("src")).unwrap();
    for i in 0..50 {
        std::fs::write(root.join(format!("src/f{i}.rs")), b"fn main() {}\n").unwrap();
    }
    std::fs::write(root.join(".agentdiffignore"), b"vendor/\n").unwrap();
    for d in 0..200 {
        let dir = root.join(format!("vendor/pkg{d}/lib"));
        std::fs::create_dir_all(&dir).unwrap();
        for f in 0..100 {
            std::fs::write(dir.join(format!("m{f}.js")), b"x").unwrap();
        }
    }
    std::fs::create_dir_all(root.join("vendor/keys")).unwrap();
    std::fs::write(root.join("vendor/pkg7/lib/server.pem"), b"k").unwrap();
}

fn main() {
    let dir = tempfile::tempdir().expect("a scratch directory");
    let root = std::fs::canonicalize(dir.path()).unwrap();
    build_tree(&root);

    let find = best_of(|| {
        let out = Command::new("find").arg(&root).output().unwrap();
        assert!(out.status.success());
    });
    let run = |deny: &[&str]| {
        let mut opts = ScanOptions::new();
        opts.reinclude = deny.iter().map(|s| s.to_string()).collect();
        opts.threads = 1;
        let mut pem_seen = false;
        let t = best_of(|| {
            let m = scan(&root, &opts).unwrap();
            pem_seen = m.entries.contains_key("vendor/pkg7/lib/server.pem");
        });
        (t, pem_seen)
    };
    println!("find over the tree (baseline): {find:.1?}");
    println!("scan                               time      ratio to find  deny path recorded");
    for (label, deny) in [
        ("no deny globs", &[][..]),
        ("**/*.pem, **/*.key", &["**/*.pem", "**/*.key"][..]),
        ("vendor/keys/**", &["vendor/keys/**"][..]),
    ] {
        let (t, seen) = run(deny);
        println!(
            "{label:<30} {:>9.1?}  {:>13.2}  {seen}",
            t,
            t.as_secs_f64() / find.as_secs_f64()
        );
    }
}
