//! What a sandboxing backend keeps read-only below the project root besides the evidence store
//! and the repository metadata: the configuration that decides later runs and sessions. A
//! command that could write it would change how its own successors are judged (weaken
//! `agentdiff.yaml`, or write `.claude/settings.local.json` with `"disableAllHooks": true`)
//! and have that decided only after the run.
//!
//! Each backend protects the entries that exist at the launch (bwrap binds them read-only, srt's
//! derived settings deny writing them); what does not exist yet gets no placeholder, so a
//! command may create it and it is decided after the run (the built-in policy denies the policy
//! and ignore files).

use std::path::PathBuf;

use crate::LaunchSpec;

/// Root-relative paths and why each is protected.
pub const PROTECTED_CONFIGURATION: [(&str, &str); 5] = [
    ("agentdiff.yaml", "agentdiff policy"),
    // Misnamed policies: the loader refuses a run while one is there.
    ("agentdiff.yml", "agentdiff policy"),
    ("agentdiff.json", "agentdiff policy"),
    (".agentdiffignore", "agentdiff ignore rules"),
    (".claude", "Claude Code project settings (hooks)"),
];

/// Everything a sandboxing backend keeps read-only for a run, and why: the repository metadata
/// (`ROOT/.git` and every git directory the transaction found, [`LaunchSpec::git_dirs`]), the
/// evidence store and the run capsule, and the [`PROTECTED_CONFIGURATION`]. One list, so that a
/// path added here reaches every backend. Entries may not exist; what a backend does with those
/// (no placeholder, an empty one) is its own. The policy's deny patterns come on top
/// ([`literal_path`]).
pub fn read_only_paths(spec: &LaunchSpec) -> Vec<(PathBuf, &'static str)> {
    let root = &spec.root;
    let mut out = vec![
        (root.join(".git"), "repository metadata"),
        (root.join(".agentdiff"), "evidence store"),
        (spec.capsule_dir.clone(), "run capsule"),
    ];
    out.extend(
        PROTECTED_CONFIGURATION
            .iter()
            .map(|(rel, why)| (root.join(rel), *why)),
    );
    out.extend(
        spec.git_dirs
            .iter()
            .map(|g| (g.clone(), "repository metadata (git directory)")),
    );
    out
}

/// The literal root-relative path a policy pattern names, when a sandbox can bind it: no glob
/// characters, except a trailing `/**` (the directory itself). `None` for globs, absolute paths
/// and paths that climb out with `..`; those are decided after the run only.
pub fn literal_path(pattern: &str) -> Option<&str> {
    let base = pattern.strip_suffix("/**").unwrap_or(pattern);
    let base = base.trim_start_matches("./").trim_end_matches('/');
    let is_glob = base.contains(['*', '?', '[', ']', '{', '}', '!']);
    let escapes = base.split('/').any(|seg| seg == "..");
    if base.is_empty() || is_glob || escapes || base.starts_with('/') {
        None
    } else {
        Some(base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_paths_and_trailing_double_star_are_expressible() {
        assert_eq!(literal_path(".env"), Some(".env"));
        assert_eq!(literal_path(".git/**"), Some(".git"));
        assert_eq!(literal_path("./secrets/"), Some("secrets"));
        assert_eq!(literal_path("**/*.pem"), None);
        assert_eq!(literal_path(".env.*"), None);
        assert_eq!(literal_path("a/[bc]"), None);
        assert_eq!(literal_path("../outside"), None);
        assert_eq!(literal_path("/abs"), None);
        assert_eq!(literal_path("**"), None);
    }
}
