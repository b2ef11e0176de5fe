//! What signing adds to a run: loading the signing key and signing the seal's digest, against
//! the seal's HMAC of its canonical body measured in the same run (the work every seal did before
//! signing existed). Target: signing adds at most 2 ms per run.
//!
//! Run with `cargo bench -p agentdiff-store --bench sign`.

// A benchmark: a failed setup step ends it with the reason.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use agentdiff_store::seal::{MacPurpose, SealKey, SigningKey, StateDir};

const ROUNDS: u32 = 2000;

/// A seal body of a run with `objects` referenced objects (what the signature covers).
fn body(objects: usize) -> Vec<u8> {
    let objects: Vec<String> = (0..objects).map(|i| format!("{:064x}", i * 7919)).collect();
    serde_json::to_vec(&serde_json::json!({
        "schema_version": 1,
        "seal_format": 2,
        "algorithm": "sha256",
        "run_id": "20261203T120000Z-0001",
        "sealed_at": "2026-12-03T12:00:01.000Z",
        "artifacts": {
            "after.json": "a".repeat(64), "before.json": "b".repeat(64),
            "events.jsonl": "c".repeat(64), "metadata.json": "d".repeat(64),
            "policy.json": "e".repeat(64), "result.json": "f".repeat(64),
            "runtime.json": "0".repeat(64),
        },
        "objects": objects,
    }))
    .unwrap_or_default()
}

fn per_round(f: &mut dyn FnMut()) -> Duration {
    for _ in 0..50 {
        f();
    }
    let start = Instant::now();
    for _ in 0..ROUNDS {
        f();
    }
    start.elapsed() / ROUNDS
}

fn main() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let root = dir.path().join("project");
    std::fs::create_dir(&root).unwrap_or_else(|e| panic!("{e}"));
    let state = StateDir::at(dir.path().join("state")).unwrap_or_else(|e| panic!("{e}"));
    // Create both keys once; each round then loads them as a run does.
    SealKey::load_or_create(&state).unwrap_or_else(|e| panic!("{e}"));
    SigningKey::load_or_create(&state, &root).unwrap_or_else(|e| panic!("{e}"));
    println!("signing cost per run ({ROUNDS} rounds each, after 50 warm-up rounds)");
    for objects in [10usize, 1_000, 20_000] {
        let body = body(objects);
        let mac = per_round(&mut || {
            let key = SealKey::load_or_create(&state).unwrap_or_else(|e| panic!("{e}"));
            std::hint::black_box(key.mac(MacPurpose::Seal, &body));
        });
        let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&body));
        let sign = per_round(&mut || {
            let key = SigningKey::load_or_create(&state, &root).unwrap_or_else(|e| panic!("{e}"));
            std::hint::black_box(key.sign_seal(&digest));
        });
        println!(
            "  body {:>9} bytes ({objects:>6} objects): load+sign {:>8.1} us, load+HMAC {:>8.1} \
             us (ratio {:.2}); target: sign <= 2000 us -> {}",
            body.len(),
            sign.as_secs_f64() * 1e6,
            mac.as_secs_f64() * 1e6,
            sign.as_secs_f64() / mac.as_secs_f64().max(1e-9),
            if sign <= Duration::from_millis(2) {
                "met"
            } else {
                "NOT met"
            }
        );
    }
}
