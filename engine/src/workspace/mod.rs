//! Private workspaces for backends whose command must never see the host tree.
//!
//! Placeholder until the container backend lands: materialising is refused, so a private-workspace
//! backend fails closed instead of running on the host tree.

use std::path::PathBuf;

use crate::fs::Manifest;
use crate::store::{Capsule, Store};

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("private workspaces are not supported by this build")]
    Unsupported,
}

/// Materialise the before-state into a private directory and return its path.
pub fn materialize(
    _store: &Store,
    _capsule: &Capsule,
    _before: &Manifest,
) -> Result<PathBuf, WorkspaceError> {
    Err(WorkspaceError::Unsupported)
}
