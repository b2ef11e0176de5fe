//! Agent sessions as the review surfaces show them: one model for `agentdiff session list`,
//! `agentdiff session show` and the dashboard's session list and page, so they cannot disagree
//! about a session (see `agentdiff_engine::transaction::session` for how one is recorded).
//!
//! A session is `open` while its capsule is unsealed and the agent process that started it
//! lives, `interrupted` when it is unsealed and that process is gone, `ended` once sealed.
//! Whether the agent process lives is judged from the recorded pid and start time
//! ([`agent_runs`]; the functions take it as `alive`, so a test can decide).
//!
//! Invariants: every string is recorded text (the agent's ids, tool names, paths), unescaped
//! here; each surface escapes it. The linked runs and denied calls of an ended session are the
//! ones its sealed `session_ended` record names; before the end they are read from the calls
//! logged so far. A capsule whose metadata does not name a session is not a session.
//!
//! Not defended: until a session is sealed its log is written by the agent's user, so an open or
//! interrupted session shows what that log says, unverified (`verify` checks ended ones).

use serde::Serialize;

use agentdiff_engine::transaction::session::{self as recorded, SessionError};
use agentdiff_store::schema::{
    ChangeAttribution, Metadata, RunResult, SessionEnd, SessionMeta, Status, ToolCallRecord,
};
use agentdiff_store::{Artifact, Capsule, Store, StoreError};

/// Why a session could not be shown.
#[derive(Debug, thiserror::Error)]
pub enum SessionViewError {
    #[error("`{id}` is a run, not a session: `agentdiff session list` lists the sessions")]
    NotASession { id: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Log(#[from] SessionError),
    #[error("the session's session_ended record cannot be read: {0}")]
    Ended(#[source] serde_json::Error),
    #[error(transparent)]
    Result(#[from] super::ReportError),
}

/// A session's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    Open,
    Interrupted,
    Ended,
}

impl SessionState {
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Open => "open",
            SessionState::Interrupted => "interrupted",
            SessionState::Ended => "ended",
        }
    }
}

/// Whether the agent process a session recorded still runs ([`agent_runs`], or a test's).
pub type Alive<'a> = &'a dyn Fn(&SessionMeta) -> bool;

/// Whether the agent process that started a session still runs: its recorded pid, with the
/// recorded start time (clock ticks since boot), not a zombie. Unknown (nothing recorded) is
/// `false`.
pub fn agent_runs(meta: &SessionMeta) -> bool {
    let (Some(pid), Some(started)) = (meta.agent_pid, meta.agent_started) else {
        return false;
    };
    agentdiff_host::process_identity::read_stat(pid)
        .is_ok_and(|s| s.start_time_ticks == started && !s.is_zombie())
}

/// The state of a session capsule with this metadata.
pub fn state(capsule: &Capsule, meta: &SessionMeta, alive: Alive<'_>) -> SessionState {
    if capsule.is_sealed() {
        SessionState::Ended
    } else if alive(meta) {
        SessionState::Open
    } else {
        SessionState::Interrupted
    }
}

/// One session as listed.
#[derive(Debug, Clone, Serialize)]
pub struct SessionRow {
    pub id: String,
    pub agent: String,
    pub agent_session_id: String,
    pub state: SessionState,
    pub created_at: String,
    /// `status` of the sealed result (ended sessions only).
    pub status: Option<Status>,
    pub changes: Option<usize>,
    /// Tool calls logged.
    pub calls: usize,
    pub linked_runs: usize,
    pub denied_calls: usize,
    /// Why the session's log, end record or result could not be read (the counts are then 0).
    pub problem: Option<String>,
}

/// One session as shown (`agentdiff session show --format json`).
#[derive(Debug, Clone, Serialize)]
pub struct SessionView {
    pub id: String,
    pub agent: String,
    pub agent_session_id: String,
    pub state: SessionState,
    pub created_at: String,
    pub calls: Vec<ToolCallRecord>,
    /// How it ended (ended sessions only).
    pub ended: Option<SessionEnd>,
    /// The sealed result, as for a run (ended sessions only).
    pub result: Option<RunResult>,
}

impl SessionView {
    /// The runs of the session's shell calls.
    pub fn linked_runs(&self) -> Vec<String> {
        match &self.ended {
            Some(end) => end.linked_runs.clone(),
            None => {
                let mut runs: Vec<String> =
                    self.calls.iter().filter_map(|c| c.run_id.clone()).collect();
                runs.dedup();
                runs
            }
        }
    }

    /// The calls the hook denied (their `tool_use_id`s, or tool names).
    pub fn denied_calls(&self) -> Vec<String> {
        match &self.ended {
            Some(end) => end.denied_calls.clone(),
            None => self
                .calls
                .iter()
                .filter(|c| c.outcome == "denied")
                .map(|c| c.tool_use_id.clone().unwrap_or_else(|| c.tool.clone()))
                .collect(),
        }
    }

    /// The session as one listed row.
    pub fn row(&self) -> SessionRow {
        SessionRow {
            id: self.id.clone(),
            agent: self.agent.clone(),
            agent_session_id: self.agent_session_id.clone(),
            state: self.state,
            created_at: self.created_at.clone(),
            status: self.result.as_ref().map(|r| r.status),
            changes: self.result.as_ref().map(|r| r.changes.len()),
            calls: self.calls.len(),
            linked_runs: self.linked_runs().len(),
            denied_calls: self.denied_calls().len(),
            problem: None,
        }
    }
}

/// Session `id` of `store` (`NotASession` for a run).
pub fn open(store: &Store, id: &str) -> Result<(Capsule, Metadata), SessionViewError> {
    let capsule = store.open_run(id)?;
    let metadata: Metadata = capsule.read_artifact(Artifact::Metadata)?;
    if metadata.session.is_none() {
        return Err(SessionViewError::NotASession { id: id.to_string() });
    }
    Ok((capsule, metadata))
}

/// The session recorded in `capsule`: its calls, and once ended its end record and result.
pub fn view(
    capsule: &Capsule,
    metadata: Metadata,
    alive: Alive<'_>,
) -> Result<SessionView, SessionViewError> {
    let id = capsule.id().to_string();
    let Some(meta) = metadata.session else {
        return Err(SessionViewError::NotASession { id });
    };
    let state = state(capsule, &meta, alive);
    let ended = ended_record(capsule)?;
    let result = if state == SessionState::Ended {
        Some(super::checked_result(capsule)?)
    } else {
        None
    };
    Ok(SessionView {
        id,
        agent: meta.agent,
        agent_session_id: meta.agent_session_id,
        state,
        created_at: metadata.created_at,
        calls: recorded::read_calls(capsule)?,
        ended,
        result,
    })
}

/// The `session_ended` record, when the session ended.
fn ended_record(capsule: &Capsule) -> Result<Option<SessionEnd>, SessionViewError> {
    let Some(event) = capsule
        .events()?
        .into_iter()
        .find(|e| e.event == "session_ended")
    else {
        return Ok(None);
    };
    serde_json::from_value(serde_json::Value::Object(event.fields))
        .map(Some)
        .map_err(SessionViewError::Ended)
}

/// Every session of `store`, oldest first. A capsule whose metadata cannot be read (or names no
/// session) is left out (`agentdiff runs` and `verify` report it as a run); a session whose log,
/// end record or result cannot be read is listed with the problem.
pub fn list(store: &Store, alive: Alive<'_>) -> Result<Vec<SessionRow>, StoreError> {
    let mut rows = Vec::new();
    for id in store.run_ids()? {
        let Ok((capsule, metadata)) = open(store, id.as_str()) else {
            continue;
        };
        let Some(meta) = metadata.session.clone() else {
            continue;
        };
        let created_at = metadata.created_at.clone();
        rows.push(match view(&capsule, metadata, alive) {
            Ok(v) => v.row(),
            Err(e) => SessionRow {
                id: id.to_string(),
                state: state(&capsule, &meta, alive),
                agent: meta.agent,
                agent_session_id: meta.agent_session_id,
                created_at,
                status: None,
                changes: None,
                calls: 0,
                linked_runs: 0,
                denied_calls: 0,
                problem: Some(e.to_string()),
            },
        });
    }
    Ok(rows)
}

/// One call as a line: tool, id, outcome, paths or run, detail.
pub fn call_line(c: &ToolCallRecord) -> String {
    let mut line = format!(
        "{} {} {}",
        c.tool,
        c.tool_use_id.as_deref().unwrap_or("-"),
        c.outcome
    );
    if !c.paths.is_empty() {
        line.push_str(&format!(" {}", c.paths.join(", ")));
    }
    if let Some(run) = &c.run_id {
        line.push_str(&format!(" run {run}"));
    }
    if let Some(detail) = &c.detail {
        line.push_str(&format!(" ({detail})"));
    }
    line
}

/// The calls that could have made a change, or `unattributed`.
pub fn attributed_to(a: &ChangeAttribution) -> String {
    if a.unattributed {
        "unattributed".to_string()
    } else {
        a.calls.join(", ")
    }
}

/// Who could have made a change, as a line: `review src/a.rs <- t1, t2`.
pub fn attribution_line(a: &ChangeAttribution) -> String {
    format!(
        "{} {} <- {}",
        super::words::action_word(a.decision),
        a.path,
        attributed_to(a)
    )
}

/// A list as words: `none` when empty.
pub fn list_words(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_string()
    } else {
        items.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(tool: &str, id: Option<&str>, outcome: &str, run: Option<&str>) -> ToolCallRecord {
        ToolCallRecord {
            tool: tool.into(),
            tool_use_id: id.map(Into::into),
            paths: Vec::new(),
            run_id: run.map(Into::into),
            outcome: outcome.into(),
            detail: None,
        }
    }

    #[test]
    fn an_open_session_counts_its_runs_and_denied_calls_from_the_calls_logged_so_far() {
        let mut v = SessionView {
            id: "s-1".into(),
            agent: "claude-code".into(),
            agent_session_id: "a".into(),
            state: SessionState::Open,
            created_at: "t".into(),
            calls: vec![
                call("Bash", Some("t1"), "ran", Some("r-1")),
                call("Write", None, "denied", None),
                call("Bash", Some("t2"), "failed", Some("r-2")),
            ],
            ended: None,
            result: None,
        };
        let row = v.row();
        assert_eq!((row.calls, row.linked_runs, row.denied_calls), (3, 2, 1));
        assert_eq!(v.denied_calls(), ["Write"]);
        // Once ended, the sealed record is what counts (it also finds runs whose call was never
        // reported).
        v.ended = Some(SessionEnd {
            ended_by: "closed".into(),
            reason: None,
            attributions: Vec::new(),
            linked_runs: vec!["r-1".into(), "r-2".into(), "r-3".into()],
            denied_calls: Vec::new(),
        });
        let row = v.row();
        assert_eq!((row.linked_runs, row.denied_calls), (3, 0));
    }
}
