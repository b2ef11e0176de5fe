//! agentdiff engine: everything that is not a runtime backend.
//!
//! The engine defines the [`backend::RuntimeBackend`] contract and never names a concrete backend;
//! backends link this crate and register themselves through [`backend::registry`].

pub mod backend;
pub mod environment;
pub mod fs;
pub mod policy;
pub mod process;
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
