//! What a local container run keeps read-only in its private workspace: what bwrap re-binds
//! read-only over the project — the engine's one list
//! (`agentdiff_backend_api::protected::read_only_paths`: `.git` and every git directory found in
//! the tree, the policy, the ignore rules, `.claude`) and the policy's literal deny patterns — for
//! the part of it that is in the copy.
//!
//! The workspace is a copy, so nothing the command writes there reaches the project unless it is
//! promoted; but a write to `.claude/settings.local.json` (`"disableAllHooks": true`) or a git
//! hook is decided only after the run, and one `promote` away from the project. Bound read-only,
//! the write fails in the container as it does under bwrap.
//!
//! Invariants: an entry is bound only when it exists in the workspace as itself, with no symlink
//! anywhere in its path (the engine resolves a bind's source on the host: a `.claude` that is a
//! symlink would show its target, a host path, in the container); entries below another bound
//! entry are left to it; a path the engine's `-v` syntax cannot carry (`:` or `,`) is not bound
//! and is named in [`ReadOnly::not_bound`].
//! Not defended: a remote engine's workspace (a volume the archive fills) gets no read-only
//! entries; what does not exist at the launch may be created by the command (decided after the
//! run, as under bwrap).

use std::path::Path;

use agentdiff_backend_api::protected::{literal_path, read_only_paths};
use agentdiff_backend_api::LaunchSpec;

/// The workspace entries bound read-only, relative to the workspace, parents first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReadOnly {
    pub entries: Vec<String>,
    /// Entries that exist but cannot be bound, and why.
    pub not_bound: Vec<String>,
}

/// The read-only entries of the run's workspace (`spec.workdir`, a private copy of `spec.root`):
/// the engine's one list ([`read_only_paths`]) and the literal deny patterns, as bwrap takes them,
/// for the part of them below the root (the store and paths outside the root are not in the copy).
pub fn read_only(spec: &LaunchSpec) -> ReadOnly {
    let below_root = read_only_paths(spec).into_iter().filter_map(|(p, _)| {
        let rel = p.strip_prefix(&spec.root).ok()?.to_str()?;
        (!rel.is_empty()).then(|| rel.to_string())
    });
    let denied = spec
        .deny_patterns
        .iter()
        .filter_map(|p| literal_path(p))
        .map(str::to_string);
    let mut wanted: Vec<String> = below_root.chain(denied).collect();
    wanted.sort();
    wanted.dedup();
    bindable(&spec.workdir, wanted)
}

/// Of `wanted` (relative paths, sorted), those that exist in `workspace` as themselves.
fn bindable(workspace: &Path, wanted: Vec<String>) -> ReadOnly {
    let Ok(base) = workspace.canonicalize() else {
        return ReadOnly::default();
    };
    let mut out = ReadOnly::default();
    for rel in wanted {
        // Sorted: a parent comes before what lies below it.
        if out
            .entries
            .iter()
            .any(|p| Path::new(&rel).starts_with(Path::new(p)))
        {
            continue;
        }
        let path = base.join(&rel);
        // Exists as itself: no symlink in any component (canonical form unchanged).
        if path.canonicalize().ok().as_deref() != Some(path.as_path()) {
            continue;
        }
        if rel.contains([':', ',']) || rel.chars().any(char::is_control) {
            out.not_bound.push(format!(
                "{rel}: a container bind cannot name this path; decided after the run"
            ));
            continue;
        }
        out.entries.push(rel);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_entries_are_bound_parents_first_and_symlinks_never() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        for d in [
            ".git/hooks",
            ".claude",
            "config",
            "vendor/lib/.git",
            "odd:name",
        ] {
            std::fs::create_dir_all(ws.join(d)).unwrap();
        }
        std::fs::write(ws.join("agentdiff.yaml"), "version: 2\n").unwrap();
        std::fs::write(ws.join("config/secrets.yml"), "k: v\n").unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("linked")).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join(".agentdiffignore")).unwrap();
        let wanted = [
            ".agentdiffignore",
            ".claude",
            ".git",
            ".git/hooks",
            "agentdiff.yaml",
            "config/secrets.yml",
            "linked/x",
            "missing.txt",
            "odd:name",
            "vendor/lib/.git",
        ]
        .map(String::from)
        .to_vec();
        let ro = bindable(&ws, wanted);
        assert_eq!(
            ro.entries,
            vec![
                ".claude",
                ".git",
                "agentdiff.yaml",
                "config/secrets.yml",
                "vendor/lib/.git"
            ]
        );
        assert_eq!(ro.not_bound.len(), 1, "{:?}", ro.not_bound);
        assert!(ro.not_bound[0].starts_with("odd:name"));
    }

    #[test]
    fn a_missing_workspace_binds_nothing() {
        let t = tempfile::tempdir().unwrap();
        let ro = bindable(&t.path().join("absent"), vec![".git".into()]);
        assert_eq!(ro, ReadOnly::default());
    }
}
