//! What the benchmarks share: where the corpus is, and medians.

use std::path::PathBuf;
use std::time::Duration;

/// The corpus folder (`AGENTDIFF_CORPUS`, else `shared/corpus` beside the checkout).
pub fn corpus_dir() -> Option<PathBuf> {
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

pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}
