//! The host toolkit: what every other agentdiff crate needs from the machine it runs on, and
//! nothing that knows about runs, policies or backends.
//!
//! Layering: this crate is the bottom of the workspace. It depends on no other agentdiff crate,
//! so a backend author and the engine share one implementation of each primitive (directory
//! handles that never follow symlinks, the state directory's location, redaction, the credential
//! locations) instead of near-copies. See docs/architecture.md.

#[cfg(unix)]
pub mod cache_file;
pub mod credentials;
#[cfg(unix)]
pub mod dir;
#[cfg(unix)]
pub mod git_dirs;
#[cfg(unix)]
pub mod hard_links;
pub mod hex;
pub mod hex_id;
pub mod process_identity;
#[cfg(unix)]
pub mod program_file;
#[cfg(unix)]
pub mod random;
pub mod redact;
pub mod state_dir;
#[cfg(unix)]
pub mod system;
