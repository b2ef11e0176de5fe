//! agentdiff engine: everything that is not a runtime backend.
//!
//! The engine runs the evidence transaction over the contract of `agentdiff-backend-api` and never
//! names a concrete backend; backends depend on the contract (and the host and process toolkits),
//! never on this crate. See docs/architecture.md for the layers and the allowed edges.

pub mod promote;
pub mod recovery;
pub mod rollback;
pub mod root;
pub mod transaction;
pub mod workspace;
