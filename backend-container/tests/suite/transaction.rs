//! The whole transaction with the real podman backend: private workspace materialised from the
//! before-state, host tree untouched, then promote (conflict-checked) and deny handling.

use std::path::Path;
use std::time::Duration;

use agentdiff_backend_api::BackendOptions;
use agentdiff_backend_container::ContainerBackend;
use agentdiff_engine::promote::{self, PromoteError, Scope, Selection};
use agentdiff_store::Store;

use super::helpers::*;

async fn run_in_container(root: &Path, rootfs: &Path, script: &str) -> String {
    let mut options = BackendOptions::new();
    options.push("engine", "podman");
    options.push("rootfs", rootfs.to_str().unwrap());
    let backend = ContainerBackend::new();
    transaction_run(root, &backend, options, script, Duration::from_secs(60)).await
}

#[tokio::test]
async fn container_run_leaves_the_host_unchanged_and_promote_applies_reviewed_changes() {
    if skip_or_fail("container_run_and_promote", podman_missing()) {
        return;
    }
    let rootfs = busybox_rootfs();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("a.txt"), b"a before\n").unwrap();
    std::fs::write(root.join("b.txt"), b"b before\n").unwrap();
    std::fs::write(root.join("src/lib.rs"), b"// lib\n").unwrap();
    std::os::unix::fs::symlink("src/lib.rs", root.join("lib-link")).unwrap();
    let root = root.canonicalize().unwrap();
    let host_before = snapshot(&root);

    let run_id = run_in_container(
        &root,
        rootfs.path(),
        "test \"$(cat a.txt)\" = 'a before' || exit 9; readlink lib-link > seen-link; \
         echo 'a after' > a.txt; echo 'b after' > b.txt; mkdir -p new/deep; echo made > new/deep/c.txt; \
         echo SECRET=1 > .env; rm src/lib.rs; echo x > suid; chmod 4755 suid",
    )
    .await;
    // The run saw the captured state, and the host tree is byte-for-byte unchanged.
    assert_eq!(snapshot(&root), host_before);
    let store = Store::open_existing(&root).unwrap();
    let capsule = store.open_run(&run_id).unwrap();
    assert!(capsule.is_sealed());
    let result: serde_json::Value = capsule
        .read_artifact(agentdiff_store::Artifact::Result)
        .unwrap();
    assert_eq!(result["exit_code"], 0, "{result:#}");
    let changes = result["changes"].as_array().unwrap();
    let decision = |p: &str| {
        changes
            .iter()
            .find(|c| c["path"] == p)
            .map(|c| c["decision"].as_str().unwrap().to_string())
    };
    assert_eq!(decision(".env").as_deref(), Some("deny"));
    assert!(decision("a.txt").is_some());
    assert!(decision("seen-link").is_some());
    assert!(changes.iter().all(|c| c["reversible"] == false));
    let runtime: serde_json::Value = capsule
        .read_artifact(agentdiff_store::Artifact::Runtime)
        .unwrap();
    assert_eq!(runtime["capabilities"]["workspace"], "private");
    assert!(runtime["observation_root"]
        .as_str()
        .unwrap()
        .contains(".agentdiff/workspaces/"));

    // Promote refuses a root other than the recorded one.
    let elsewhere = tempfile::tempdir().unwrap();
    let sel = Selection {
        scope: Scope::All,
        paths: Vec::new(),
        force: false,
    };
    assert!(matches!(
        promote::plan(&capsule, store.objects(), elsewhere.path(), &sel),
        Err(PromoteError::RootMismatch { .. })
    ));
    assert!(matches!(
        promote::plan(
            &capsule,
            store.objects(),
            &root,
            &Selection {
                scope: Scope::All,
                paths: vec!["no/such/path".into()],
                force: false
            }
        ),
        Err(PromoteError::UnknownPath { .. })
    ));

    // Someone edits b.txt on the host after the run.
    std::fs::write(root.join("b.txt"), b"b edited on the host\n").unwrap();

    // Dry run: nothing written, a preview is shown.
    let all = Selection {
        scope: Scope::All,
        paths: Vec::new(),
        force: false,
    };
    let plan = promote::plan(&capsule, store.objects(), &root, &all).unwrap();
    let preview = promote::execute(&capsule, &plan, true).unwrap();
    assert_eq!(preview.status.to_string(), "dry_run");
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"a before\n");
    let a = preview.items.iter().find(|i| i.path == "a.txt").unwrap();
    assert!(a.diff.as_deref().unwrap().contains("+a after"));

    let report = promote::execute(&capsule, &plan, false).unwrap();
    let outcome = |p: &str| {
        report
            .items
            .iter()
            .find(|i| i.path == p)
            .map(|i| i.outcome.as_str())
            .unwrap_or_else(|| panic!("{p} not in the report: {report:#?}"))
    };
    assert_eq!(outcome("a.txt"), "applied");
    assert_eq!(outcome("b.txt"), "conflict");
    assert_eq!(outcome("new/deep/c.txt"), "created");
    assert_eq!(outcome("src/lib.rs"), "removed");
    assert_eq!(outcome(".env"), "skipped");
    assert_eq!(
        outcome("suid"),
        "skipped",
        "setuid bits set in the container never reach the host"
    );
    assert!(!root.join("suid").exists());
    assert!(report.has_conflicts());
    assert_eq!(std::fs::read(root.join("a.txt")).unwrap(), b"a after\n");
    assert_eq!(
        std::fs::read(root.join("b.txt")).unwrap(),
        b"b edited on the host\n",
        "the host edit is preserved"
    );
    assert_eq!(
        std::fs::read(root.join("new/deep/c.txt")).unwrap(),
        b"made\n"
    );
    assert!(!root.join("src/lib.rs").exists());
    assert!(
        !root.join(".env").exists(),
        "deny changes are never promoted by default"
    );

    // A deny change needs --path and --force.
    let named = Selection {
        scope: Scope::All,
        paths: vec![".env".into()],
        force: false,
    };
    let plan = promote::plan(&capsule, store.objects(), &root, &named).unwrap();
    let r = promote::execute(&capsule, &plan, false).unwrap();
    assert_eq!(r.items[0].outcome.as_str(), "skipped");
    assert!(!root.join(".env").exists());
    assert!(matches!(
        promote::plan(
            &capsule,
            store.objects(),
            &root,
            &Selection {
                scope: Scope::All,
                paths: Vec::new(),
                force: true
            }
        ),
        Err(PromoteError::ForceWithoutPath)
    ));
    let forced = Selection {
        scope: Scope::All,
        paths: vec![".env".into()],
        force: true,
    };
    let plan = promote::plan(&capsule, store.objects(), &root, &forced).unwrap();
    let r = promote::execute(&capsule, &plan, false).unwrap();
    assert_eq!(r.items[0].outcome.as_str(), "created");
    assert_eq!(std::fs::read(root.join(".env")).unwrap(), b"SECRET=1\n");
    assert!(capsule.dir().join("promote-result.json").exists());

    // Tampered evidence is refused before anything is written.
    let result_path = capsule.dir().join("result.json");
    let mut perms = std::fs::metadata(&result_path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(&result_path, perms).unwrap();
    let mut text = std::fs::read_to_string(&result_path).unwrap();
    text = text.replacen("\"review\"", "\"allow\"", 1);
    std::fs::write(&result_path, text).unwrap();
    assert!(matches!(
        promote::plan(&capsule, store.objects(), &root, &sel),
        Err(PromoteError::Verification { .. })
    ));
}
