//! What a command in a real podman container cannot write in its private workspace: the
//! repository metadata and the configuration later runs and sessions read, bound read-only over
//! the workspace as bwrap binds them over the project (`backend_container::protected`). The
//! rest of the workspace stays writable, and the run's evidence names the read-only entries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;

use agentdiff_conformance::skip_unless_required;

use super::container_egress_cli::{run_in_container, tagged};
use super::process_evidence_cli::{busybox_rootfs, podman_missing};

/// Each write's exit status, on stderr (the command's stdout is agentdiff's under `--format
/// json`).
const WRITES: &str = "for f in .claude/settings.local.json .git/hooks/pre-commit agentdiff.yaml \
                      config/secrets.yml src/main.rs; do \
                      ( echo written > \"$f\" ) 2>/dev/null; echo \"WRITE $f $?\" >&2; done";

#[test]
fn protected_entries_of_the_private_workspace_are_read_only_in_the_container() {
    if let Some(reason) = podman_missing() {
        skip_unless_required(&reason);
        return;
    }
    let rootfs = busybox_rootfs();
    let project = tempfile::tempdir().unwrap();
    let root = project.path();
    let init = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(init.success());
    for d in [".claude", ".git/hooks", "config", "src"] {
        fs::create_dir_all(root.join(d)).unwrap();
    }
    fs::write(root.join(".claude/settings.json"), "{}\n").unwrap();
    fs::write(root.join("config/secrets.yml"), "k: v\n").unwrap();
    fs::write(root.join("src/main.rs"), "fn main() {}\n").unwrap();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 2\nfilesystem:\n  deny:\n    - config/secrets.yml\n    - .git/**\n",
    )
    .unwrap();
    let (result, stderr) = run_in_container(root, rootfs.path(), &["sh", "-c", WRITES]);
    let status = |f: &str| {
        tagged(&stderr, "WRITE", f).unwrap_or_else(|| panic!("no line for {f}: {stderr}"))
    };
    for f in [
        ".claude/settings.local.json",
        ".git/hooks/pre-commit",
        "agentdiff.yaml",
        "config/secrets.yml",
    ] {
        assert_ne!(status(f), "0", "{f} was written: {stderr}");
    }
    assert_eq!(status("src/main.rs"), "0", "{stderr}");
    let id = result["run_id"].as_str().unwrap();
    let runtime: serde_json::Value = serde_json::from_str(
        &fs::read_to_string(root.join(".agentdiff/runs").join(id).join("runtime.json")).unwrap(),
    )
    .unwrap();
    let entries = runtime["runtime_config"]["read_only_workspace_entries"].to_string();
    for e in [".claude", ".git", "agentdiff.yaml", "config/secrets.yml"] {
        assert!(entries.contains(&format!("\"{e}\"")), "{entries}");
    }
    // Only the source edit is a change of the run.
    let changes = result["changes"].to_string();
    assert!(changes.contains("src/main.rs"), "{changes}");
    assert!(!changes.contains("settings.local.json"), "{changes}");
}
