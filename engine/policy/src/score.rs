//! Blast radius: an additive, capped score of how far a run reached, with every component listed.
//!
//! Each component is `count × weight`; the raw sum is kept, the score is capped at 100.
//! Levels: ≤20 low, ≤40 moderate, ≤70 high, else critical.

use serde::{Deserialize, Serialize};

use crate::Weights;

/// What the run did, counted per scoring component.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub review_created: u64,
    pub review_modified: u64,
    pub review_deleted: u64,
    /// Denied creations and modifications.
    pub denied_mutation: u64,
    pub denied_deletion: u64,
    pub sensitive_path: u64,
    pub dependency_change: u64,
    pub mode_change: u64,
    pub orphan_process: u64,
    pub opened_port: u64,
    pub budget_violation: u64,
    /// Non-allowed changes beyond the fifth.
    pub scope_drift: u64,
}

/// One scored component.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Component {
    pub name: String,
    pub count: u64,
    pub weight: u64,
    pub points: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Low,
    Moderate,
    High,
    Critical,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Low => "low",
            Level::Moderate => "moderate",
            Level::High => "high",
            Level::Critical => "critical",
        }
    }

    fn of(score: u64) -> Level {
        match score {
            0..=20 => Level::Low,
            21..=40 => Level::Moderate,
            41..=70 => Level::High,
            _ => Level::Critical,
        }
    }
}

/// The blast radius as stored in `result.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlastRadius {
    /// `raw_score` capped at 100.
    pub score: u64,
    pub raw_score: u64,
    pub level: Level,
    pub counts: Counts,
    /// Components with a non-zero count.
    pub components: Vec<Component>,
}

/// Non-allowed changes up to this many are free of scope-drift points.
pub const SCOPE_DRIFT_ALLOWANCE: u64 = 5;

pub fn compute(counts: &Counts, weights: &Weights) -> BlastRadius {
    let table = [
        (
            "review_created",
            counts.review_created,
            weights.review_created,
        ),
        (
            "review_modified",
            counts.review_modified,
            weights.review_modified,
        ),
        (
            "review_deleted",
            counts.review_deleted,
            weights.review_deleted,
        ),
        (
            "denied_mutation",
            counts.denied_mutation,
            weights.denied_mutation,
        ),
        (
            "denied_deletion",
            counts.denied_deletion,
            weights.denied_deletion,
        ),
        (
            "sensitive_path",
            counts.sensitive_path,
            weights.sensitive_path,
        ),
        (
            "dependency_change",
            counts.dependency_change,
            weights.dependency_change,
        ),
        ("mode_change", counts.mode_change, weights.mode_change),
        (
            "orphan_process",
            counts.orphan_process,
            weights.orphan_process,
        ),
        ("opened_port", counts.opened_port, weights.opened_port),
        (
            "budget_violation",
            counts.budget_violation,
            weights.budget_violation,
        ),
        ("scope_drift", counts.scope_drift, weights.scope_drift),
    ];
    let components: Vec<Component> = table
        .iter()
        .filter(|(_, count, _)| *count > 0)
        .map(|(name, count, weight)| Component {
            name: (*name).to_string(),
            count: *count,
            weight: *weight,
            points: count.saturating_mul(*weight),
        })
        .collect();
    let raw_score = components
        .iter()
        .fold(0u64, |acc, c| acc.saturating_add(c.points));
    let score = raw_score.min(100);
    BlastRadius {
        score,
        raw_score,
        level: Level::of(score),
        counts: counts.clone(),
        components,
    }
}

/// Whether a path names credentials or secrets: `.env`, `.env.*`, SSH keys and their config,
/// `credentials`, `*.key`, `*.pem`, `*.p12`, `*.pfx`, or any `.ssh`/`.aws`/`credentials`/`secrets`
/// segment.
pub fn is_sensitive_path(path: &str) -> bool {
    let segments: Vec<&str> = path.split('/').collect();
    let Some(name) = segments.last() else {
        return false;
    };
    if segments
        .iter()
        .any(|s| matches!(*s, ".ssh" | ".aws" | "credentials" | "secrets"))
    {
        return true;
    }
    if *name == ".env" || name.starts_with(".env.") {
        return true;
    }
    if matches!(
        *name,
        "id_rsa"
            | "id_ed25519"
            | "id_dsa"
            | "id_ecdsa"
            | "authorized_keys"
            | "known_hosts"
            | "credentials"
            | "credentials.json"
    ) {
        return true;
    }
    let lower = name.to_ascii_lowercase();
    [".key", ".pem", ".p12", ".pfx"]
        .iter()
        .any(|ext| lower.ends_with(ext))
}

/// Whether a path is a dependency manifest or lockfile.
pub fn is_dependency_path(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    matches!(
        name,
        "Cargo.toml"
            | "Cargo.lock"
            | "package.json"
            | "package-lock.json"
            | "npm-shrinkwrap.json"
            | "yarn.lock"
            | "pnpm-lock.yaml"
            | "bun.lockb"
            | "go.mod"
            | "go.sum"
            | "pyproject.toml"
            | "requirements.txt"
            | "poetry.lock"
            | "uv.lock"
            | "Pipfile"
            | "Pipfile.lock"
            | "Gemfile"
            | "Gemfile.lock"
            | "composer.json"
            | "composer.lock"
    ) || (name.starts_with("requirements") && name.ends_with(".txt"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn score_is_additive_capped_and_levelled() {
        let w = Weights::default();
        let mut c = Counts {
            review_created: 1,
            review_modified: 1,
            review_deleted: 1,
            ..Counts::default()
        };
        let b = compute(&c, &w);
        assert_eq!(b.raw_score, 8 + 4 + 12);
        assert_eq!(b.score, 24);
        assert_eq!(b.level, Level::Moderate);
        assert_eq!(b.components.len(), 3);
        c.denied_deletion = 3;
        let b = compute(&c, &w);
        assert_eq!(b.raw_score, 24 + 120);
        assert_eq!(b.score, 100);
        assert_eq!(b.level, Level::Critical);
    }

    #[test]
    fn level_boundaries() {
        assert_eq!(Level::of(0), Level::Low);
        assert_eq!(Level::of(20), Level::Low);
        assert_eq!(Level::of(21), Level::Moderate);
        assert_eq!(Level::of(40), Level::Moderate);
        assert_eq!(Level::of(41), Level::High);
        assert_eq!(Level::of(70), Level::High);
        assert_eq!(Level::of(71), Level::Critical);
    }

    #[test]
    fn sensitive_and_dependency_paths() {
        for p in [
            ".env",
            "app/.env.local",
            "home/.ssh/config",
            "id_rsa",
            "certs/server.PEM",
            "a/credentials/x",
            "deploy/secrets/token.txt",
            "store.p12",
        ] {
            assert!(is_sensitive_path(p), "{p}");
        }
        for p in ["src/env.rs", "environment.md", "keys.rs", "docs/key.md"] {
            assert!(!is_sensitive_path(p), "{p}");
        }
        for p in [
            "Cargo.toml",
            "web/package.json",
            "go.sum",
            "requirements-dev.txt",
        ] {
            assert!(is_dependency_path(p), "{p}");
        }
        assert!(!is_dependency_path("src/cargo.rs"));
    }
}
