//! Whether a plugin found on `PATH` may be run at all, decided before it is ever executed.
//!
//! A sandboxed command can write inside its project tree, and default-excluded directories
//! (`.venv`, `node_modules`, …) are not even listed in a run's changes. A program it plants there
//! (`.venv/bin/agentdiff-backend-x`) would run later, unsandboxed, when that directory is on
//! `PATH` and agentdiff looks for plugins. So a plugin is refused when the file as found on
//! `PATH` or the file it resolves to:
//! - lies inside a project root: the current one, or any directory holding `.agentdiff/` or
//!   `agentdiff.yaml`;
//! - lies below a directory with a default-excluded name (`agentdiff_host::system::DEFAULT_EXCLUDED_DIRS`);
//! - or could be changed by anyone but its user and root: the file or a directory above it owned
//!   by someone else or writable by group or others (`agentdiff_host::system::untrusted_component`,
//!   the rule bwrap's own executable is held to).
//!
//! Not defended: a plugin installed by the user in a trusted place (`~/.local/bin`) is trusted;
//! a command run without a sandbox can write there too. A project root that has neither marker
//! and is not the current one is not recognised.

use std::path::{Path, PathBuf};

use agentdiff_host::system::{euid, untrusted_component, DEFAULT_EXCLUDED_DIRS};

/// Files whose presence marks a directory as a project root.
const ROOT_MARKERS: &[&str] = &[".agentdiff", "agentdiff.yaml"];

/// Why a plugin executable is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    #[error("{} is inside the project root {}; a command run there could have written it", path.display(), root.display())]
    InProject { path: PathBuf, root: PathBuf },
    #[error("{} is below `{dir}`, a directory agentdiff does not list in a run's changes", path.display())]
    Excluded { path: PathBuf, dir: String },
    #[error("{} can be changed by others: {why}", path.display())]
    Writable { path: PathBuf, why: String },
    #[error("{} cannot be resolved: {why}", path.display())]
    Unresolved { path: PathBuf, why: String },
}

/// Check `found` (an absolute path as found on `PATH`) against the rules in the module docs.
/// `roots` are project roots known to the caller (the current one), canonical.
pub fn check(found: &Path, roots: &[PathBuf]) -> Result<(), Untrusted> {
    let canonical = std::fs::canonicalize(found).map_err(|e| Untrusted::Unresolved {
        path: found.to_path_buf(),
        why: e.to_string(),
    })?;
    // The directory the link sits in (canonical), and the file it reaches.
    let found_dir = found
        .parent()
        .and_then(|d| std::fs::canonicalize(d).ok())
        .unwrap_or_else(|| found.to_path_buf());
    for (path, dir) in [
        (found, found_dir.as_path()),
        (&canonical, canonical.as_path()),
    ] {
        placed_safely(path, dir, roots)?;
    }
    if let Some(why) = untrusted_component(&canonical, &[euid(), 0]) {
        return Err(Untrusted::Writable {
            path: canonical,
            why,
        });
    }
    Ok(())
}

/// `path` (reported) whose location is `at` (canonical): not below an excluded directory name,
/// not inside a known or marked project root.
fn placed_safely(path: &Path, at: &Path, roots: &[PathBuf]) -> Result<(), Untrusted> {
    for ancestor in at.ancestors() {
        if let Some(name) = ancestor.file_name().and_then(|n| n.to_str()) {
            if DEFAULT_EXCLUDED_DIRS.contains(&name) {
                return Err(Untrusted::Excluded {
                    path: path.to_path_buf(),
                    dir: name.to_string(),
                });
            }
        }
        let marked = ROOT_MARKERS
            .iter()
            .any(|m| std::fs::symlink_metadata(ancestor.join(m)).is_ok());
        if marked || roots.iter().any(|r| r == ancestor) {
            return Err(Untrusted::InProject {
                path: path.to_path_buf(),
                root: ancestor.to_path_buf(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn plugin_in(dir: &Path) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join("agentdiff-backend-x");
        agentdiff_test_support::write_executable(&p, "#!/bin/sh\n", 0o755);
        p
    }

    #[test]
    fn a_plugin_in_a_plain_private_directory_is_trusted() {
        let home = tempfile::tempdir().unwrap();
        let p = plugin_in(&home.path().join("bin"));
        assert_eq!(check(&p, &[]), Ok(()));
    }

    #[test]
    fn planted_plugins_are_refused_with_the_reason() {
        let tmp = tempfile::tempdir().unwrap();
        let venv = plugin_in(&tmp.path().join("a/.venv/bin"));
        assert!(
            matches!(check(&venv, &[]), Err(Untrusted::Excluded { dir, .. }) if dir == ".venv")
        );

        let project = tmp.path().join("p");
        let inside = plugin_in(&project.join("tools"));
        std::fs::create_dir(project.join(".agentdiff")).unwrap();
        assert!(matches!(
            check(&inside, &[]),
            Err(Untrusted::InProject { .. })
        ));

        let root = tmp.path().join("r");
        let in_root = plugin_in(&root.join("bin"));
        assert_eq!(check(&in_root, &[]), Ok(()));
        let canonical_root = std::fs::canonicalize(&root).unwrap();
        assert!(matches!(
            check(&in_root, &[canonical_root]),
            Err(Untrusted::InProject { .. })
        ));

        // A link in a clean directory to a file in an excluded one is judged by its target too.
        let clean = tmp.path().join("clean");
        std::fs::create_dir(&clean).unwrap();
        let link = clean.join("agentdiff-backend-x");
        std::os::unix::fs::symlink(&venv, &link).unwrap();
        assert!(matches!(check(&link, &[]), Err(Untrusted::Excluded { .. })));

        let shared = tmp.path().join("shared");
        let writable = plugin_in(&shared);
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
        let why = check(&writable, &[]).unwrap_err().to_string();
        assert!(why.contains("writable by group or others"), "{why}");
    }
}
