//! The policy module's error type. Every message names what is wrong and where (the file and the
//! full key path), so a CI log is enough to fix the policy.

use std::path::PathBuf;

/// Everything that can go wrong while loading a policy, normalising a path or reading a hook call.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The document is larger than [`crate::MAX_POLICY_BYTES`].
    #[error("policy {origin} is too large ({size} bytes; the limit is {max} bytes)")]
    TooLarge {
        origin: String,
        size: usize,
        max: usize,
    },
    /// The document has no content (or only comments).
    #[error("policy {origin} is empty; it needs at least `version: 1` (run `agentdiff policy init` for a starter)")]
    Empty { origin: String },
    /// The document is not well-formed YAML or JSON, or breaks a structural bound
    /// (duplicate key, alias expansion, nesting depth).
    #[error("policy {origin} cannot be read: {message}")]
    Syntax { origin: String, message: String },
    /// The document parsed but does not follow the schema. Each problem names its key path.
    #[error("invalid policy {origin}: {}", problems.join("; "))]
    Invalid {
        origin: String,
        problems: Vec<String>,
    },
    /// A path given to the policy engine is not a valid project-relative path.
    #[error("invalid path {input:?}: {reason}")]
    InvalidPath {
        input: String,
        reason: super::path::PathProblem,
    },
    /// The policy file could not be read.
    #[error("cannot read policy file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The policy file is not a regular file (a FIFO or device could hang or feed endless data).
    #[error("policy file {} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    /// The policy file is not UTF-8 text.
    #[error("policy file {} is not UTF-8 text", path.display())]
    NotUtf8 { path: PathBuf },
    /// A policy file exists under a name agentdiff does not read implicitly.
    #[error("found {} but agentdiff reads the policy from {}; rename the file or pass --policy {}", found.display(), expected.display(), found.display())]
    Misnamed { found: PathBuf, expected: PathBuf },
    /// The project root cannot be resolved.
    #[error("cannot resolve project root {}: {source}", path.display())]
    Root {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The project's policy file is a symlink that leads outside the project root.
    #[error("policy file {} leads outside the project root through a symlink; agentdiff does not follow it (pass --policy FILE to name a policy file elsewhere)", path.display())]
    OutsideRoot { path: PathBuf },
    /// A hook request is malformed. A malformed request is never allowed.
    #[error("malformed hook input: {0}")]
    HookInput(String),
}

impl PolicyError {
    /// The schema problems, for an [`PolicyError::Invalid`] error (empty otherwise).
    pub fn problems(&self) -> &[String] {
        match self {
            PolicyError::Invalid { problems, .. } => problems,
            _ => &[],
        }
    }
}
