//! Command-line interface: one file per subcommand.

mod attest;
mod cleanup;
mod conformance;
mod doctor;
pub(crate) mod hook;
mod inspect;
mod key;
mod policy;
mod promote;
mod rollback;
mod run;
mod run_revert;
mod runs;
mod runs_prune;
mod serve;
mod session;
mod verify;

use std::process::ExitCode;

use agentdiff_plugins::Registry;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};

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
    /// Write a signed in-toto attestation (DSSE envelope) of a sealed run.
    Attest(attest::Args),
    /// This user's signing key (`key show`).
    #[command(subcommand)]
    Key(key::Command),
    /// Show a stored run.
    Inspect(inspect::Args),
    /// List stored runs (`runs prune` removes old ones).
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
    /// Agent sessions recorded by the session hooks: list, show, rollback, end.
    #[command(subcommand)]
    Session(session::Command),
    /// Agent hooks (Claude Code PreToolUse).
    #[command(subcommand)]
    Hook(hook::Command),
    /// Run the backend conformance suite against a registered backend.
    Conformance(conformance::Args),
    /// Serve a read-only, token-guarded dashboard of every run and agent session on
    /// 127.0.0.1/[::1].
    Serve(serve::Args),
}

impl Cli {
    /// Parse the process arguments, with `agentdiff run` extended by the flag aliases the
    /// registered backends declare.
    pub fn try_parse_with(registry: &Registry) -> Result<Self, clap::Error> {
        let mut command =
            Self::command().mut_subcommand("run", |c| run::add_backend_flags(c, registry));
        let matches = command.try_get_matches_from_mut(std::env::args_os())?;
        let mut cli = Self::from_arg_matches(&matches).map_err(|e| e.format(&mut command))?;
        cli.attach_backend_flags(&matches, registry);
        Ok(cli)
    }

    fn attach_backend_flags(&mut self, matches: &ArgMatches, registry: &Registry) {
        if let (Command::Run(args), Some(m)) =
            (&mut self.command, matches.subcommand_matches("run"))
        {
            args.backend_flags = run::backend_flags(m, registry);
        }
    }

    pub fn dispatch(self) -> anyhow::Result<ExitCode> {
        let notice = !matches!(self.command, Command::Cleanup(_) | Command::Hook(_));
        crate::common::context::set_orphan_notice(notice);
        match self.command {
            Command::Run(a) => run::run(*a),
            Command::Verify(a) => verify::run(a),
            Command::Attest(a) => attest::run(a),
            Command::Key(c) => key::run(c),
            Command::Inspect(a) => inspect::run(a),
            Command::Runs(a) => runs::run(a),
            Command::Rollback(a) => rollback::run(a),
            Command::Promote(a) => promote::run(a),
            Command::Cleanup(a) => cleanup::run(a),
            Command::Doctor(a) => doctor::run(a),
            Command::Policy(c) => policy::run(c),
            Command::Hook(c) => hook::run(c),
            Command::Session(c) => session::run(c),
            Command::Conformance(a) => conformance::run(a),
            Command::Serve(a) => serve::run(a),
        }
    }
}
