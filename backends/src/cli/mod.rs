//! Command-line interface: one file per subcommand.

mod cleanup;
mod conformance;
mod doctor;
mod exec_shim;
mod hook;
mod inspect;
mod policy;
mod promote;
mod rollback;
mod run;
mod runs;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Wrap one command in an evidence transaction: capture the tree before, run the command through
/// a runtime backend, capture after, classify every change with a deterministic policy, store a
/// sealed run capsule, and roll back collateral changes safely.
#[derive(Debug, Parser)]
#[command(name = "agentdiff", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one command in an evidence transaction.
    Run(Box<run::Args>),
    /// Check a run capsule's integrity seal and backup objects.
    Verify(verify::Args),
    /// Show a stored run.
    Inspect(inspect::Args),
    /// List stored runs.
    Runs(runs::Args),
    /// Undo a run's changes where nothing was edited since.
    Rollback(rollback::Args),
    /// Apply a private-workspace run's changes to the host tree.
    Promote(promote::Args),
    /// Stop processes a run left behind, after verifying their identities.
    Cleanup(cleanup::Args),
    /// Report what each runtime backend really enforces here.
    Doctor(doctor::Args),
    /// Create, validate and explain policies.
    #[command(subcommand)]
    Policy(policy::Command),
    /// Agent hooks (Claude Code PreToolUse).
    #[command(subcommand)]
    Hook(hook::Command),
    /// Run the backend conformance suite against a registered backend.
    Conformance(conformance::Args),
    /// Internal: started by the srt backend inside the sandbox to mark that the command started.
    #[command(name = "__srt-exec-shim", hide = true)]
    ExecShim(exec_shim::Args),
}

impl Cli {
    pub fn dispatch(self) -> anyhow::Result<ExitCode> {
        self.orphan_notice();
        match self.command {
            Command::Run(a) => run::run(*a),
            Command::Verify(a) => verify::run(a),
            Command::Inspect(a) => inspect::run(a),
            Command::Runs(a) => runs::run(a),
            Command::Rollback(a) => rollback::run(a),
            Command::Promote(a) => promote::run(a),
            Command::Cleanup(a) => cleanup::run(a),
            Command::Doctor(a) => doctor::run(a),
            Command::Policy(c) => policy::run(c),
            Command::Hook(c) => hook::run(c),
            Command::Conformance(a) => conformance::run(a),
            Command::ExecShim(a) => exec_shim::run(a),
        }
    }
}

impl Cli {
    /// One line on stderr when the last run in this root lost its monitor and left processes
    /// running. Not for `cleanup` (it is the remedy) or internal and hook commands (their output
    /// is read by programs).
    fn orphan_notice(&self) {
        if matches!(
            self.command,
            Command::Cleanup(_) | Command::ExecShim(_) | Command::Hook(_)
        ) {
            return;
        }
        let Ok(root) = std::env::current_dir() else {
            return;
        };
        if let Some(run) = agentdiff_engine::process::orphans::orphaned_last_run(&root) {
            eprintln!("{}", agentdiff_engine::process::orphans::notice(&run));
        }
    }
}

/// A tokio runtime for subcommands that drive backends. Single-threaded: the transaction's heavy
/// work (hashing) uses its own threads, and a small runtime keeps start-up cheap.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")
}
