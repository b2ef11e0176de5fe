//! The exec log's evidence types (`execs` in runtime.json): what a run's processes executed.
//! The observers that fill them live in the process crate (`agentdiff_process::exec_log`).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// One program a process of the run executed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecEvent {
    pub pid: u32,
    /// The process's start time (clock ticks since boot) when it could be read.
    pub start_time_ticks: Option<u64>,
    /// Full path of the executable (`/proc/PID/exe`), or `unreadable` when the process was gone
    /// (or inaccessible) by the time the event was handled.
    pub executable: String,
    /// The argument vector, redacted and bounded.
    pub argv: Vec<String>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub args_omitted: u64,
    /// Milliseconds after launch.
    pub at_ms: u64,
}

impl ExecEvidence {
    /// The program each process identity (pid, start time) executed last, by file name: what it
    /// was running when the log ended. Events whose program was unreadable are skipped.
    pub fn last_programs(&self) -> HashMap<(u32, u64), String> {
        let mut out = HashMap::new();
        for e in &self.events {
            let Some(start) = e.start_time_ticks else {
                continue;
            };
            if e.executable == "unreadable" {
                continue;
            }
            let name = std::path::Path::new(&e.executable)
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default();
            // A deleted executable reads as "name (deleted)"; keep the name.
            let name = name.trim_end_matches(" (deleted)");
            if !name.is_empty() {
                out.insert((e.pid, start), name.to_string());
            }
        }
        out
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How a run's execs were observed (`execs.mechanism` in runtime.json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecMechanism {
    /// The kernel's process-events connector: every exec, as it happens.
    CnProc,
    /// Polling /proc: an exec replaced within one poll interval can be missed.
    ProcPoll,
    /// Not observed (a backend that does not observe execs).
    None,
}

/// The exec log of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecEvidence {
    /// How execs were observed.
    pub mechanism: ExecMechanism,
    /// What this mechanism can miss.
    pub note: String,
    pub events: Vec<ExecEvent>,
    /// Events beyond the kept maximum.
    #[serde(default)]
    pub dropped: u64,
    /// Kernel events lost to a receive-buffer overflow (`cn_proc` only): the log is incomplete.
    #[serde(default)]
    pub lost: u64,
}

impl Default for ExecEvidence {
    /// What a backend that does not observe execs reports (and what older capsules read as).
    fn default() -> Self {
        ExecEvidence {
            mechanism: ExecMechanism::None,
            note: "execs were not observed".into(),
            events: Vec::new(),
            dropped: 0,
            lost: 0,
        }
    }
}
