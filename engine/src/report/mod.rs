//! Reports of a stored run for people: what the run did, read through the capsule's typed
//! readers (never JSON by string key), rendered by one module per surface.
//!
//! Invariant: a report only shows what the capsule records; every recorded string reaching a
//! report passes through that surface's one escaping function.

pub mod markdown;

use std::path::PathBuf;

use crate::store::{Artifact, Capsule, RuntimeDoc, StoreError};
use crate::transaction::RunResult;

/// Errors of loading a run for a report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(
        "run {0} has no result.json (it was interrupted before recording its result): there is \
         nothing to report; `agentdiff inspect {0}` says what is known"
    )]
    NoResult(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// One run as the reports see it.
#[derive(Debug, Clone)]
pub struct RunView {
    pub result: RunResult,
    /// `runtime.json`, when the run recorded one.
    pub runtime: Option<RuntimeDoc>,
    /// `metadata.json`'s backend: the one chosen, even when nothing was launched.
    pub backend: Option<String>,
    /// Whether the capsule's seal is in place.
    pub sealed: bool,
    pub capsule_dir: PathBuf,
}

impl RunView {
    /// Read a run through the capsule's typed readers.
    pub fn load(capsule: &Capsule) -> Result<RunView, ReportError> {
        let present =
            |a: Artifact| std::fs::symlink_metadata(capsule.dir().join(a.file_name())).is_ok();
        if !present(Artifact::Result) {
            return Err(ReportError::NoResult(capsule.id().to_string()));
        }
        let result = capsule.result()?;
        let runtime = if present(Artifact::Runtime) {
            Some(capsule.runtime()?)
        } else {
            None
        };
        let backend = if present(Artifact::Metadata) {
            Some(capsule.metadata()?.backend)
        } else {
            None
        };
        Ok(RunView {
            result,
            runtime,
            backend,
            sealed: capsule.is_sealed(),
            capsule_dir: capsule.dir().to_path_buf(),
        })
    }
}
