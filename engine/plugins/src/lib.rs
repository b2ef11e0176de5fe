//! The backend registry: every built-in backend linked into the program (collected through
//! `inventory`), registered explicitly by an embedder, or found as an external executable
//! `agentdiff-backend-<id>` on PATH and driven over the versioned JSON protocol.
//!
//! Layering: above the contract (`agentdiff-backend-api`) and the process toolkit, below the
//! engine. Backends never depend on this crate; the CLI, doctor and the conformance command do.

pub mod external;
pub mod registry;

pub use registry::{PluginOutcome, Registry, RegistryError};
