//! Where agentdiff keeps its per-user state (the seal key, the ledger, caches): one rule, so the
//! directory a sandbox hides from the command is the one the store writes its key to.
//!
//! In order: `$AGENTDIFF_STATE_DIR`, `$XDG_STATE_HOME/agentdiff`, `$HOME/.local/state/agentdiff`
//! (empty values count as unset). The location must be absolute. This module only locates the
//! directory; creating it and checking that it is private is the store's job.

use std::path::PathBuf;

/// Environment variable naming the state directory explicitly; tests and operators who keep
/// evidence keys elsewhere use it.
pub const STATE_DIR_ENV: &str = "AGENTDIFF_STATE_DIR";

/// Why no state directory can be named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateDirError {
    #[error("the state directory {} is not an absolute path", path.display())]
    NotAbsolute { path: PathBuf },
    #[error("neither {STATE_DIR_ENV}, XDG_STATE_HOME nor HOME is set")]
    Unset,
}

/// The state directory named by the environment (see the module docs).
pub fn locate() -> Result<PathBuf, StateDirError> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    let path = if let Some(dir) = non_empty(STATE_DIR_ENV) {
        PathBuf::from(dir)
    } else if let Some(xdg) = non_empty("XDG_STATE_HOME") {
        PathBuf::from(xdg).join("agentdiff")
    } else if let Some(home) = non_empty("HOME") {
        PathBuf::from(home).join(".local/state/agentdiff")
    } else {
        return Err(StateDirError::Unset);
    };
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(StateDirError::NotAbsolute { path })
    }
}
