//! Scans a tree and prints what it cost, for benchmark harnesses to compare against a baseline
//! measured in the same run.
//!
//! ```text
//! cargo run --release -p agentdiff-scan --example scan_bench -- PATH [--threads N] [--walkers N] [--max-hash-bytes N]
//! ```
//!
//! Prints one JSON object per pass: a full scan, then a rescan reusing the first manifest's hashes
//! (the after-scan of a run where nothing changed), then the same rescan without the sweep of
//! excluded paths for programs, and the sweep's share of the rescan as a ratio.

use std::error::Error;
use std::path::PathBuf;
use std::time::Instant;

use agentdiff_scan::{scan, Manifest, ScanOptions};

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let mut root: Option<PathBuf> = None;
    let mut opts = ScanOptions::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--threads" => opts.threads = args.next().ok_or("--threads needs a value")?.parse()?,
            "--walkers" => opts.walkers = args.next().ok_or("--walkers needs a value")?.parse()?,
            "--max-hash-bytes" => {
                opts.max_hash_bytes = args
                    .next()
                    .ok_or("--max-hash-bytes needs a value")?
                    .parse()?
            }
            "-h" | "--help" => {
                println!("usage: scan_bench PATH [--threads N] [--walkers N] [--max-hash-bytes N]");
                return Ok(());
            }
            _ if root.is_none() => root = Some(PathBuf::from(arg)),
            other => return Err(format!("unexpected argument {other:?}; see --help").into()),
        }
    }
    let root = root.ok_or("missing PATH; see --help")?;

    let (full, _) = timed("full", &root, &opts)?;
    let mut reuse = opts.clone();
    reuse.reuse = Some(&full);
    // Best of five each, in alternating order: the sweep is a few milliseconds on small trees,
    // below one pass's noise.
    let mut bare = reuse.clone();
    bare.sweep_excluded = false;
    let (mut with, mut without) = (f64::MAX, f64::MAX);
    for i in 0..5 {
        let order = if i % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for sweep in order {
            if sweep {
                with = with.min(timed("reuse", &root, &reuse)?.1);
            } else {
                without = without.min(timed("reuse_no_sweep", &root, &bare)?.1);
            }
        }
    }
    println!(
        "{}",
        serde_json::json!({
            "pass": "sweep_cost",
            "reuse_s": with,
            "reuse_no_sweep_s": without,
            "ratio": if without > 0.0 { with / without } else { 0.0 },
        })
    );
    Ok(())
}

fn timed(
    pass: &str,
    root: &std::path::Path,
    opts: &ScanOptions,
) -> Result<(Manifest, f64), Box<dyn Error>> {
    let start = Instant::now();
    let m = scan(root, opts)?;
    let secs = start.elapsed().as_secs_f64();
    let s = &m.stats;
    let line = serde_json::json!({
        "pass": pass,
        "root": m.root,
        "files": s.files,
        "directories": s.directories,
        "symlinks": s.symlinks,
        "unsupported": m.unsupported.len(),
        "excluded": m.excluded.len(),
        "swept_names": m.excluded_programs.as_ref().map(|p| p.entries_seen),
        "programs": m.excluded_programs.as_ref().map(|p| p.programs.len()),
        "bytes_hashed": s.bytes_hashed,
        "hashes_reused": s.hashes_reused,
        "elapsed_s": secs,
        "mib_per_s": if secs > 0.0 { s.bytes_hashed as f64 / (1024.0 * 1024.0) / secs } else { 0.0 },
        "files_per_s": if secs > 0.0 { s.files as f64 / secs } else { 0.0 },
    });
    println!("{line}");
    Ok((m, secs))
}
