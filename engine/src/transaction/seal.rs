//! The last step: write `result.json`, record the decision, and seal the capsule with the objects
//! its manifests reference (so pruning never removes a backup a sealed run still needs).

use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime};

use serde_json::json;

use super::decide::{self, RunFrame};
use super::{Refusal, RunOutcome, TransactionError};
use agentdiff_policy::Decision;
use agentdiff_store::schema::{RunResult, Status};
use agentdiff_store::seal::SealAuthority;
use agentdiff_store::{Artifact, Capsule, ObjectStore, RuntimeDoc, Store};

pub(super) fn now() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// Holds what every ending of a run needs: the capsule, the run's identity and its start.
pub(super) struct Sealer<'c> {
    pub capsule: &'c Capsule,
    /// The store's objects; what this run found intact is remembered for the next run.
    pub objects: &'c ObjectStore,
    /// The per-user key and ledger every seal is MAC'd with and recorded in.
    pub authority: &'c SealAuthority,
    pub run_id: String,
    pub command_decision: Decision,
    pub task: Option<String>,
    pub started: Instant,
    pub started_at: String,
    /// The `runtime.json` written, kept for the outcome.
    pub runtime: Mutex<Option<RuntimeDoc>>,
}

impl Sealer<'_> {
    /// The run's identity and timing, ending now.
    pub fn frame(&self) -> RunFrame {
        RunFrame {
            run_id: self.run_id.clone(),
            task: self.task.clone(),
            started_at: self.started_at.clone(),
            finished_at: now(),
            duration_ms: self.started.elapsed().as_millis() as u64,
        }
    }

    /// Writes `runtime.json` and keeps the document for the outcome.
    pub fn write_runtime(&self, doc: RuntimeDoc) -> Result<(), TransactionError> {
        self.capsule.write_artifact(Artifact::Runtime, &doc)?;
        *self.runtime.lock().unwrap_or_else(PoisonError::into_inner) = Some(doc);
        Ok(())
    }

    /// A run that never launched (blocked, backend unavailable, launch refused).
    pub fn seal_not_run(
        &self,
        status: Status,
        error: Option<String>,
        refusal: Option<Refusal>,
        referenced: &[String],
    ) -> Result<RunOutcome, TransactionError> {
        let result = decide::not_run(&self.command_decision, status, error, self.frame());
        self.seal(result, referenced, refusal)
    }

    pub fn seal(
        &self,
        result: RunResult,
        referenced: &[String],
        refusal: Option<Refusal>,
    ) -> Result<RunOutcome, TransactionError> {
        self.capsule.write_artifact(Artifact::Result, &result)?;
        self.capsule.event(
            "decided",
            json!({ "status": result.status, "safety_outcome": result.safety_outcome }),
        )?;
        let mut objects = referenced.to_vec();
        objects.sort();
        objects.dedup();
        self.capsule.seal_with(&objects, Some(self.authority))?;
        // The cache only saves time: a run whose cache cannot be written is still complete, and
        // the next run hashes its objects again.
        let _ = self.objects.save_verified_cache(self.authority.key());
        let runtime = self
            .runtime
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        Ok(RunOutcome {
            result,
            runtime,
            capsule_dir: self.capsule.dir().to_path_buf(),
            refusal,
        })
    }
}

/// Remove the run's private workspace, recording that it happened (or why it could not).
pub(super) fn discard_workspace(store: &Store, capsule: &Capsule) -> Result<(), TransactionError> {
    match crate::workspace::discard(store, capsule.id()) {
        Ok(_) => capsule.event("workspace_discarded", json!({}))?,
        Err(e) => capsule.event(
            "workspace_not_discarded",
            json!({ "error": e.to_string(), "remedy": "agentdiff cleanup RUN removes it" }),
        )?,
    }
    Ok(())
}
