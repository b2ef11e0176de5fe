//! agentdiff engine: everything that is not a runtime backend.
//!
//! The engine runs the evidence transaction over the contract of `agentdiff-backend-api` and never
//! names a concrete backend; backends depend on the contract (and the host and process toolkits),
//! never on this crate. See docs/architecture.md for the layers and the allowed edges.

pub mod fs;
pub mod policy;
pub mod promote;
pub mod recovery;
pub mod report;
pub mod rollback;
pub mod root;
pub mod score;
pub mod store;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod transaction;
pub mod workspace;

/// Version of every JSON artifact schema this engine writes, except `runtime.json`.
pub const SCHEMA_VERSION: u32 = 1;

/// Version of the `runtime.json` schema. 2: backend-specific facts (the container id and image
/// digest) live only in the backend's own `wrapper` section, not as top-level fields.
pub const RUNTIME_SCHEMA_VERSION: u32 = 2;
