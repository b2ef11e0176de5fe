//! Recorded runs for tests (a dev-dependency only; no product crate links it): a run written into
//! a capsule
//! the way the transaction writes it, through the same types and the same decision step, so the
//! readers (rollback, promote, cleanup, inspect) are tested against what a real run stores.
//!
//! What it does not do: launch anything through a backend. The command is a `sh -c` script run
//! between the two scans (in the root, or in a copy of it for a private-workspace run); its
//! runtime evidence is the default of a backend named `test`.

use std::path::Path;
use std::process::Command;

use agentdiff_backend_api::{RunEvidence, WorkspaceMode};
use agentdiff_engine::transaction::decide::{self, Evidence, RunFrame};
use agentdiff_engine::transaction::{Metadata, RunResult};
use agentdiff_policy::{Action, LoadedPolicy, Policy, PolicyError, PolicySource};
use agentdiff_scan::{
    diff, scan, BackupRequest, BackupState, Change, IgnoreSource, Manifest, ScanError, ScanOptions,
};
use agentdiff_store::{Artifact, Capsule, PolicyDoc, RuntimeDoc, Store, StoreError};

/// Why a fixture could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FixtureError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Scan(#[from] ScanError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("the policy cannot be recorded: {0}")]
    PolicyDoc(#[source] serde_json::Error),
    #[error("the script could not run: {0}")]
    Script(#[source] std::io::Error),
    #[error("the script failed ({status}): {script}")]
    ScriptFailed {
        script: String,
        status: std::process::ExitStatus,
    },
}

/// When the fixture's runs say they started and ended.
pub const STARTED_AT: &str = "2026-01-01T00:00:00.000Z";
const FINISHED_AT: &str = "2026-01-01T00:00:01.000Z";

/// How a test run is recorded; [`Recording::new`] gives the defaults.
pub struct Recording<'a> {
    /// The run id.
    pub id: &'a str,
    /// The command: a `sh -c` script run in the root between the two scans.
    pub script: &'a str,
    /// `rollback.enabled` of the recorded policy; backups are stored only when it is on.
    pub rollback_enabled: bool,
    pub max_backup_bytes: u64,
    /// Each change's decision.
    pub decide: &'a dyn Fn(&Change) -> Action,
    /// Seal the capsule (with the store's default authority) after writing it.
    pub seal: bool,
    /// A private-workspace run: the root is copied here first, the script runs in the copy, and
    /// the after-state is the copy's, its files stored as backups (what promote applies).
    pub workspace: Option<&'a Path>,
}

impl<'a> Recording<'a> {
    /// Run id `run1`, rollback on, backups up to 10 MiB, every change `review`, sealed.
    pub fn new(script: &'a str) -> Recording<'a> {
        Recording {
            id: "run1",
            script,
            rollback_enabled: true,
            max_backup_bytes: 10 * 1024 * 1024,
            decide: &|_| Action::Review,
            seal: true,
            workspace: None,
        }
    }

    /// Records the run below `root`: before-scan with backups into the object store, the
    /// script, after-scan, the documents ([`write_run_docs`]), the manifests, the seal.
    pub fn record(&self, root: &Path) -> Result<Capsule, FixtureError> {
        if let Some(ws) = self.workspace {
            run_script(root, &format!("cp -a . '{}'", ws.display()))?;
        }
        let store = Store::open(root)?;
        let capsule = store.create_run(Some(self.id))?;
        let mut opts = ScanOptions::new();
        if self.rollback_enabled {
            opts.backup = Some(BackupRequest {
                sink: store.objects(),
                max_file_bytes: self.max_backup_bytes,
            });
        }
        let before = scan(root, &opts)?;
        let mut after_opts = ScanOptions::new();
        after_opts.ignore = IgnoreSource::Lines(before.ignore_lines.clone());
        let after = match self.workspace {
            None => {
                run_script(root, self.script)?;
                after_opts.reuse = Some(&before);
                scan(root, &after_opts)?
            }
            Some(ws) => {
                run_script(ws, self.script)?;
                after_opts.backup = Some(BackupRequest {
                    sink: store.objects(),
                    max_file_bytes: self.max_backup_bytes,
                });
                scan(ws, &after_opts)?
            }
        };
        let policy = Policy::from_yaml_or_json(
            &format!(
                "version: 1\nrollback:\n  enabled: {}\n",
                self.rollback_enabled
            ),
            "test.yaml",
        )?;
        let loaded = LoadedPolicy {
            policy,
            source: PolicySource::BuiltIn,
        };
        let mut run = RunEvidence {
            backend: "test".into(),
            ..RunEvidence::default()
        };
        if self.workspace.is_some() {
            run.capabilities.workspace = WorkspaceMode::Private;
        }
        write_run_docs(&capsule, &loaded, &before, &after, &run, self.decide)?;
        let before_entries = capsule.write_manifest(Artifact::Before, &before, store.objects())?;
        let after_entries = capsule.write_manifest(Artifact::After, &after, store.objects())?;
        if self.seal {
            let mut objects = stored_objects(&before);
            objects.extend(stored_objects(&after));
            objects.sort();
            objects.dedup();
            objects.extend([before_entries, after_entries]);
            store.objects().sync()?;
            capsule.seal(&objects)?;
        }
        Ok(capsule)
    }
}

fn run_script(root: &Path, script: &str) -> Result<(), FixtureError> {
    let status = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(root)
        .status()
        .map_err(FixtureError::Script)?;
    if status.success() {
        Ok(())
    } else {
        Err(FixtureError::ScriptFailed {
            script: script.to_string(),
            status,
        })
    }
}

/// The backup objects a manifest's entries name.
pub fn stored_objects(m: &Manifest) -> Vec<String> {
    m.entries
        .values()
        .filter(|e| e.backup == BackupState::Stored)
        .filter_map(|e| e.sha256.clone())
        .collect()
}

/// The `metadata.json` of a test run of `sh` under `backend`.
pub fn metadata(run_id: &str, root: &str, backend: &str) -> Metadata {
    Metadata {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: run_id.to_string(),
        created_at: STARTED_AT.into(),
        agentdiff_version: "test".into(),
        root: root.to_string(),
        argv: vec!["sh".into()],
        task: None,
        backend: backend.to_string(),
        timeout_seconds: None,
        platform: "test".into(),
        uid: None,
        session: None,
    }
}

/// Writes metadata, policy, runtime and result of a finished run as the transaction does (the
/// same types, the same decision step), then gives each change the decision `decide` returns.
/// `run` is the backend's evidence (its workspace mode says whether the run was private).
pub fn write_run_docs(
    capsule: &Capsule,
    loaded: &LoadedPolicy,
    before: &Manifest,
    after: &Manifest,
    run: &RunEvidence,
    decide: &dyn Fn(&Change) -> Action,
) -> Result<RunResult, FixtureError> {
    let policy = &loaded.policy;
    let command = policy.decide_command(std::ffi::OsStr::new("sh"));
    let frame = RunFrame {
        run_id: capsule.id().to_string(),
        task: None,
        started_at: STARTED_AT.into(),
        finished_at: FINISHED_AT.into(),
        duration_ms: 1000,
    };
    let comparison = agentdiff_scan::compare(before, after);
    let evidence = Evidence {
        policy,
        command_decision: &command,
        before,
        after,
        comparison: &comparison,
        run,
        private_workspace: run.capabilities.workspace == WorkspaceMode::Private,
        verified_controls: &[],
        capsule_tampered: &[],
        network: None,
        git_dirs: &[],
    };
    let mut result = decide::decide(&evidence, frame);
    for (record, change) in result.changes.iter_mut().zip(&diff(before, after)) {
        record.decision = decide(change);
    }
    capsule.write_artifact(
        Artifact::Metadata,
        &metadata(capsule.id().as_str(), &before.root, "test"),
    )?;
    let policy_doc = PolicyDoc::of(loaded).map_err(FixtureError::PolicyDoc)?;
    capsule.write_artifact(Artifact::Policy, &policy_doc)?;
    capsule.write_artifact(Artifact::Runtime, &RuntimeDoc::launched(run, &[], None))?;
    capsule.write_artifact(Artifact::Result, &result)?;
    Ok(result)
}
