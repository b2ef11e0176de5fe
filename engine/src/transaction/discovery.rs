//! What the transaction learns about the tree before the launch, on a thread of its own while the
//! run is set up: the git directories ([`agentdiff_host::git_dirs::discover`]), and the files below
//! the paths a sandbox keeps read-only that have another hard link
//! ([`agentdiff_host::hard_links`]).
//!
//! Why the second: a read-only bind protects a name, not the file. When `.claude/settings.json`
//! is also `src/alias` (an earlier, unsandboxed command ran `ln`), a sandboxed command writes the
//! hook settings through `src/alias` although `.claude` is read-only in its sandbox. A sandbox
//! cannot make such a link during its run (`link(2)` across mounts fails with `EXDEV`), so a run
//! on a backend that sandboxes the host tree is refused before its command starts while one
//! exists ([`Discovered::launch_refusal`]).
//!
//! Checked: the protected configuration (`agentdiff_backend_api::protected`), every git directory
//! and `.git` file found, and the policy's literal deny paths that are files (`.env`). Not
//! checked: a git directory's `objects/` (a local clone hard-links its objects to the repository
//! it came from), a literal deny path that is a directory (`secrets/**` → `secrets`: it may be
//! large; a write to its files through another name is still scanned and decided after the run,
//! as that path), the evidence store (its own tamper check covers it), and, past
//! [`agentdiff_host::hard_links::MAX_ENTRIES`] entries, the rest.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use agentdiff_backend_api::protected::{literal_path, PROTECTED_CONFIGURATION};
use agentdiff_backend_api::{Capabilities, WorkspaceMode};
use agentdiff_host::git_dirs::{self, GitDirs};
use agentdiff_host::hard_links::{self, Found};

use super::Refusal;

/// Named in a refusal; the rest are counted.
const NAMED: usize = 5;

/// The discovery's results.
pub(crate) struct Discovered {
    pub git_dirs: GitDirs,
    pub linked: Found,
}

impl Discovered {
    fn find(root: &Path, deny_patterns: &[String]) -> Discovered {
        let git_dirs = git_dirs::discover(root);
        let dirs = git_dirs.paths();
        let mut paths: Vec<PathBuf> = PROTECTED_CONFIGURATION
            .iter()
            .map(|(rel, _)| root.join(rel))
            .collect();
        paths.extend(dirs.iter().cloned());
        // A literal deny path only where it is a file: a denied directory can be as large as
        // `vendor/`, and its files are scanned and decided after the run anyway.
        paths.extend(
            deny_patterns
                .iter()
                .filter_map(|p| literal_path(p))
                .map(|rel| root.join(rel))
                .filter(|p| std::fs::symlink_metadata(p).is_ok_and(|m| m.is_file())),
        );
        let mut linked = hard_links::find(&paths, &hard_links::object_stores(&dirs));
        // A path below two listed ones (a deny literal inside `.claude`) is named once.
        linked.linked.sort();
        linked.linked.dedup();
        Discovered { git_dirs, linked }
    }

    /// Why a backend with `capabilities` must not start the command here, if it must not: it
    /// sandboxes the host tree (not a private copy), which keeps protected paths read-only by
    /// name only, and a protected file has another name a write could go through.
    pub(crate) fn refusal_for(
        &self,
        capabilities: &Capabilities,
        root: &Path,
    ) -> Option<(String, Refusal)> {
        let host_tree = capabilities.workspace != WorkspaceMode::Private;
        (capabilities.sandboxed && host_tree)
            .then(|| self.launch_refusal(root))
            .flatten()
            .map(|message| (message, Refusal::BackendUnavailable))
    }

    fn launch_refusal(&self, root: &Path) -> Option<String> {
        let linked = &self.linked.linked;
        let (first, _) = linked.first()?;
        let name = |p: &Path| {
            p.strip_prefix(root)
                .map_or_else(|_| p.display().to_string(), |r| r.display().to_string())
        };
        let named: Vec<String> = linked
            .iter()
            .take(NAMED)
            .map(|(p, n)| format!("`{}` ({n} links)", name(p)))
            .collect();
        let more = match linked.len().saturating_sub(NAMED) {
            0 => String::new(),
            n => format!(" and {n} more"),
        };
        // Quoted for a POSIX shell, so the remedy can be pasted whatever the name holds.
        let example = format!("'{}'", name(first).replace('\'', "'\\''"));
        let tmp = format!("'{}.tmp'", name(first).replace('\'', "'\\''"));
        Some(format!(
            "the command was not started: a file the sandbox keeps read-only also has another \
             name (a hard link), and a write through that name would still change it: {}{more}. \
             Give each a name of its own (`cp -p {example} {tmp} && mv {tmp} {example}`) or \
             remove its other names, then run again",
            named.join(", ")
        ))
    }
}

/// [`Discovered`], found on a thread of its own while the run is set up.
pub(crate) struct Discovery {
    thread: Option<JoinHandle<Discovered>>,
    root: PathBuf,
    deny_patterns: Vec<String>,
}

impl Discovery {
    pub(crate) fn start(root: &Path, deny_patterns: Vec<String>) -> Self {
        let (r, d) = (root.to_path_buf(), deny_patterns.clone());
        Discovery {
            thread: std::thread::Builder::new()
                .name("agentdiff-git-dirs".into())
                .spawn(move || Discovered::find(&r, &d))
                .ok(),
            root: root.to_path_buf(),
            deny_patterns,
        }
    }

    /// The discovery's result; found here and now when the thread could not start or failed, so
    /// the launch never goes without it.
    pub(crate) fn finish(self) -> Discovered {
        self.thread
            .and_then(|h| h.join().ok())
            .unwrap_or_else(|| Discovered::find(&self.root, &self.deny_patterns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linked_hook_settings_file_refuses_the_launch_and_says_how_to_fix_it() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join(".claude")).unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::write(root.join(".claude/settings.json"), "{}").unwrap();
        let found = Discovered::find(&root, &[]);
        assert!(found.launch_refusal(&root).is_none());
        std::fs::hard_link(root.join(".claude/settings.json"), root.join("src/alias")).unwrap();
        let found = Discovered::find(&root, &[]);
        let refusal = found.launch_refusal(&root).unwrap();
        assert!(
            refusal.contains("`.claude/settings.json` (2 links)")
                && refusal.contains(
                    "cp -p '.claude/settings.json' '.claude/settings.json.tmp' && mv \
                     '.claude/settings.json.tmp' '.claude/settings.json'"
                ),
            "{refusal}"
        );
        // A name with a quote is quoted for the shell, and a file below two listed paths (a
        // deny literal inside `.claude`) is named once.
        std::fs::write(root.join(".claude/it's.json"), "{}").unwrap();
        std::fs::hard_link(root.join(".claude/it's.json"), root.join("src/q")).unwrap();
        let deny = vec![".claude/it's.json".to_owned()];
        let found = Discovered::find(&root, &deny);
        assert_eq!(found.linked.linked.len(), 2, "{:?}", found.linked);
        let refusal = found.launch_refusal(&root).unwrap();
        assert!(
            refusal.contains("cp -p '.claude/it'\\''s.json' '.claude/it'\\''s.json.tmp'"),
            "{refusal}"
        );
    }

    #[test]
    fn literal_deny_files_and_git_hooks_are_checked_but_git_objects_and_deny_dirs_are_not() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        for d in [
            ".git/objects/ab",
            ".git/refs",
            ".git/hooks",
            "secrets",
            "src",
        ] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(root.join(".git/objects/ab/cd"), "blob").unwrap();
        std::fs::hard_link(root.join(".git/objects/ab/cd"), root.join("src/obj")).unwrap();
        std::fs::write(root.join("secrets/key"), "k").unwrap();
        std::fs::hard_link(root.join("secrets/key"), root.join("src/key")).unwrap();
        std::fs::write(root.join(".env"), "A=1").unwrap();
        let deny = vec![
            "secrets/**".to_owned(),
            ".env".to_owned(),
            "**/*.pem".to_owned(),
        ];
        assert!(Discovered::find(&root, &deny)
            .launch_refusal(&root)
            .is_none());
        std::fs::hard_link(root.join(".env"), root.join("src/env")).unwrap();
        std::fs::write(root.join(".git/hooks/pre-commit"), "#!/bin/sh\n").unwrap();
        std::fs::hard_link(root.join(".git/hooks/pre-commit"), root.join("src/hook")).unwrap();
        let found = Discovered::find(&root, &deny);
        let linked: Vec<PathBuf> = found.linked.linked.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(
            linked,
            vec![root.join(".env"), root.join(".git/hooks/pre-commit")]
        );
    }
}
