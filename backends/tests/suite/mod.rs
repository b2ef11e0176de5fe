//! Tests of the `agentdiff` binary. Every spawned `agentdiff` gets [`state_dir`] as
//! `AGENTDIFF_STATE_DIR`, so tests never read or create the real user's seal key and ledger.

mod bwrap_cli;
mod cleanup_cli;
mod evidence_cli;
mod hook_cli;
mod markdown_cli;
mod policy_cli;
mod process_evidence_cli;
mod rollback_cli;
mod run_cli;
mod safe_defaults_cli;
mod terminal_cli;

/// A seal key and ledger private to this test process.
pub fn state_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<(tempfile::TempDir, std::path::PathBuf)> =
        std::sync::OnceLock::new();
    // A directory agentdiff creates itself (0700) inside the temp dir.
    let (_, path) = DIR.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp state dir");
        let path = dir.path().join("state");
        (dir, path)
    });
    path
}
