//! The list of stored runs, for `agentdiff runs` and the dashboard's index: one builder, so the
//! two cannot disagree about a run.
//!
//! Invariants: the seal column is what `agentdiff verify` concludes with the same key and ledger
//! (never inferred from integrity.json being present); a result.json that exists but cannot be
//! read (or names another run) is `unreadable_result`, never `interrupted`, and its problem is
//! kept next to the seal's; every field is recorded text, escaped by the surface.
//!
//! Not defended: the listing verifies every run on each call (as `verify --all` does; an object
//! the runs share is hashed once per listing), so a very large store lists slowly.

use serde::Serialize;

use agentdiff_store::schema::Status;
use agentdiff_store::seal::VerifyContext;
use agentdiff_store::{Artifact, Capsule, ObjectsChecked, RunId, Store, StoreError, Verdict};

/// Where a run stands, from its result.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// The run recorded its result with this status.
    Finished(Status),
    /// No result.json: agentdiff was interrupted before recording it (or the run is in progress).
    Interrupted,
    /// result.json exists but cannot be read, or names another run.
    UnreadableResult,
    /// No result.json, but the run was sealed (its seal lists the result, or this user's ledger
    /// records the seal): the result was deleted after the seal.
    ResultDeleted,
}

impl RunState {
    /// The word a listing shows: the result's status, `interrupted` or `unreadable result`.
    pub fn word(self) -> &'static str {
        match self {
            RunState::Finished(s) => s.as_str(),
            RunState::Interrupted => "interrupted",
            RunState::UnreadableResult => "unreadable result",
            RunState::ResultDeleted => "result deleted",
        }
    }

    /// The JSON `status` value (`unreadable_result` rather than the words).
    fn json(self) -> &'static str {
        match self {
            RunState::UnreadableResult => "unreadable_result",
            RunState::ResultDeleted => "result_deleted",
            other => other.word(),
        }
    }
}

/// The seal, as `agentdiff verify` judged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SealState {
    /// Sealed and every artifact and object matches (see `verdict` for authenticity).
    Verified,
    /// Sealed, but something does not match (or the seal cannot be read).
    Broken,
    /// No seal.
    Unsealed,
}

/// Change counts from result.json.
#[derive(Debug, Clone, Serialize)]
pub struct Counts {
    pub total: usize,
    pub expected: u64,
    pub review: u64,
    pub protected: u64,
}

/// One listed run.
#[derive(Debug, Clone, Serialize)]
pub struct RunRow {
    pub id: String,
    pub started_at: Option<String>,
    pub backend: Option<String>,
    #[serde(serialize_with = "state_json", rename = "status")]
    pub state: RunState,
    pub seal: SealState,
    /// `agentdiff verify`'s verdict (`None` when verification itself failed).
    pub verdict: Option<Verdict>,
    /// Every problem found (an unreadable result, the first seal problem), `; `-separated.
    pub problem: Option<String>,
    pub changes: Option<Counts>,
    pub task: Option<String>,
    /// Connection attempts the run's egress proxy refused (`None`: no proxy, or no
    /// runtime.json).
    pub egress_denied: Option<u64>,
}

fn state_json<S: serde::Serializer>(state: &RunState, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(state.json())
}

impl RunRow {
    /// The seal in words: the verdict, or `BROKEN` when it could not be reached.
    pub fn seal_word(&self) -> &'static str {
        match (self.seal, self.verdict) {
            (SealState::Unsealed, _) => super::words::verdict_word(Verdict::Unsealed),
            (_, Some(v)) => super::words::verdict_word(v),
            (_, None) => super::words::verdict_word(Verdict::Forged),
        }
    }
}

/// Every run of `store`, sorted by id, each verified with `ctx`.
pub fn list(store: &Store, ctx: &VerifyContext) -> Result<Vec<RunRow>, StoreError> {
    let checked = ObjectsChecked::default();
    Ok(store
        .run_ids()?
        .into_iter()
        .map(|id| row(store, ctx, &checked, id))
        .collect())
}

fn row(store: &Store, ctx: &VerifyContext, checked: &ObjectsChecked, id: RunId) -> RunRow {
    let mut row = RunRow {
        id: id.to_string(),
        started_at: None,
        backend: None,
        state: RunState::Interrupted,
        seal: SealState::Unsealed,
        verdict: None,
        problem: None,
        changes: None,
        task: None,
        egress_denied: None,
    };
    let capsule = match store.open_run(id.as_str()) {
        Ok(c) => c,
        Err(e) => {
            row.seal = SealState::Broken;
            row.problem = Some(e.to_string());
            return row;
        }
    };
    let mut problems = Vec::new();
    read_artifacts(&capsule, &mut row, &mut problems);
    match capsule.verify_in_pass(store.objects(), ctx, checked) {
        Ok(report) => {
            row.verdict = Some(report.verdict);
            // Unsealed only when the verdict says so: a capsule whose seal was deleted after
            // the ledger recorded it is forged, hence broken.
            let broken = !report.ok && report.verdict != Verdict::Unsealed;
            row.seal = if report.ok {
                SealState::Verified
            } else if broken {
                SealState::Broken
            } else {
                SealState::Unsealed
            };
            // Deleted, not interrupted: the seal lists the missing result, or the seal itself
            // was deleted after this user's ledger recorded it.
            let result_sealed = !report.sealed
                || report
                    .problems
                    .iter()
                    .any(|p| p.subject == Artifact::Result.file_name());
            if broken && result_sealed && row.state == RunState::Interrupted {
                row.state = RunState::ResultDeleted;
            }
            if broken {
                let first = report.problems.first().map_or_else(
                    || report.authentication.detail.clone(),
                    |p| format!("{}: {}", p.subject, p.problem),
                );
                problems.push(first);
            }
        }
        Err(e) => {
            row.seal = SealState::Broken;
            problems.push(e.to_string());
        }
    }
    if !problems.is_empty() {
        row.problem = Some(problems.join("; "));
    }
    row
}

fn present(capsule: &Capsule, artifact: Artifact) -> bool {
    std::fs::symlink_metadata(capsule.dir().join(artifact.file_name())).is_ok()
}

/// metadata.json's start, backend and task, runtime.json's refused connections, then
/// result.json's status, backend and counts.
fn read_artifacts(capsule: &Capsule, row: &mut RunRow, problems: &mut Vec<String>) {
    if present(capsule, Artifact::Metadata) {
        match capsule.metadata() {
            Ok(meta) => {
                row.started_at = Some(meta.created_at);
                row.backend = Some(meta.backend);
                row.task = meta.task;
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if present(capsule, Artifact::Runtime) {
        match capsule.runtime() {
            Ok(doc) => row.egress_denied = super::rows::refused_connections(Some(&doc)),
            Err(e) => problems.push(e.to_string()),
        }
    }
    if !present(capsule, Artifact::Result) {
        return;
    }
    match super::checked_result(capsule) {
        Ok(result) => {
            row.state = RunState::Finished(result.status);
            if let Some(rt) = &result.runtime {
                row.backend = Some(rt.backend.clone());
            }
            row.changes = Some(Counts {
                total: result.changes.len(),
                expected: result.summary.expected,
                review: result.summary.unexpected,
                protected: result.summary.protected,
            });
        }
        Err(e) => {
            row.state = RunState::UnreadableResult;
            problems.push(e.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only_row(store: &Store) -> RunRow {
        let rows = list(store, &VerifyContext::default()).unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        rows.into_iter().next().unwrap()
    }

    #[test]
    fn an_unparsable_result_is_unreadable_not_interrupted_and_keeps_both_problems() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let run = store.create_run(Some("u-1")).unwrap();
        run.seal(&[]).unwrap();
        std::fs::write(run.dir().join("result.json"), "{not json").unwrap();
        let row = only_row(&store);
        assert_eq!(row.state, RunState::UnreadableResult);
        assert_eq!(row.state.word(), "unreadable result");
        assert_eq!(row.seal, SealState::Broken);
        let problem = row.problem.unwrap();
        assert!(problem.contains("result.json"), "{problem}");
        assert!(problem.contains("; "), "both problems kept: {problem}");
    }

    #[test]
    fn a_seal_that_does_not_match_is_broken_whatever_files_exist() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let run = store.create_run(Some("b-1")).unwrap();
        run.event("capsule_created", serde_json::json!({})).unwrap();
        run.seal(&[]).unwrap();
        assert!(run.is_sealed());
        std::fs::write(run.dir().join("events.jsonl"), "{}\n").unwrap();
        let row = only_row(&store);
        assert_eq!(row.seal, SealState::Broken);
        assert_eq!(row.seal_word(), "FORGED");
        // Every seal requires result.json: a sealed capsule without one lost it after the seal.
        assert_eq!(row.state, RunState::ResultDeleted);
    }
}
