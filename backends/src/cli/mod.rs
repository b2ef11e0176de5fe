//! Command-line interface: one file per subcommand.

mod cleanup;
mod conformance;
mod doctor;
pub(crate) mod hook;
mod inspect;
mod policy;
mod promote;
mod rollback;
mod run;
mod runs;
mod runs_prune;
mod serve;
mod verify;

pub(crate) use verify::context as verify_context;

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
    /// Agent hooks (Claude Code PreToolUse).
    #[command(subcommand)]
    Hook(hook::Command),
    /// Run the backend conformance suite against a registered backend.
    Conformance(conformance::Args),
    /// Serve a read-only, token-guarded dashboard of every run on 127.0.0.1/[::1].
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
        ORPHAN_NOTICE.store(notice, std::sync::atomic::Ordering::Relaxed);
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
            Command::Serve(a) => serve::run(a),
        }
    }
}

/// Whether [`project_root`] points to `agentdiff cleanup` when the root's last run lost its
/// monitor. Off for `cleanup` (it is the remedy) and for the hook (its output is read by
/// programs).
static ORPHAN_NOTICE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// One line on stderr when the last run in `root` lost its monitor and left processes running.
fn orphan_notice(root: &std::path::Path) {
    if !ORPHAN_NOTICE.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Some(run) = agentdiff_engine::recovery::orphans::orphaned_last_run(root) {
        errln!("{}", agentdiff_engine::recovery::orphans::notice(&run));
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

/// The project root every subcommand works on: `--root` if given, else the discovery of
/// `agentdiff_engine::root` (nearest `.agentdiff/` or `agentdiff.yaml`, else the nearest VCS
/// root, else the current directory; `$HOME` and `/` only when named). The chosen root is printed
/// on stderr whenever it is not the current directory, so a run never silently covers another
/// tree than the user expects.
pub fn project_root(
    explicit: Option<&std::path::Path>,
) -> anyhow::Result<agentdiff_engine::root::Root> {
    use anyhow::Context;
    let cwd = std::env::current_dir()
        .context("cannot determine the current directory; pass --root")
        .map_err(|e| crate::exit::with_code(crate::exit::USAGE, e))?;
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let root = agentdiff_engine::root::discover(explicit, &cwd, home.as_deref())
        .map_err(|e| crate::exit::with_code(crate::exit::USAGE, e))?;
    let same_as_cwd = std::fs::canonicalize(&cwd).is_ok_and(|c| c == root.path);
    if root.reason != agentdiff_engine::root::Reason::Explicit && !same_as_cwd {
        errln!(
            "agentdiff: project root: {} ({})",
            agentdiff_host::redact::escape_terminal(&root.path.display().to_string()),
            root.describe()
        );
    }
    orphan_notice(&root.path);
    Ok(root)
}

/// The backend `id`, built in or a plugin on `PATH`. An id nobody serves, or one two plugins
/// claim, is a usage error (64); a plugin that is there but cannot be described (it exits, hangs,
/// or answers out of protocol) is an unavailable backend (69).
pub fn resolve_backend(
    registry: &mut agentdiff_plugins::Registry,
    id: &str,
) -> anyhow::Result<&'static agentdiff_backend_api::BackendDescriptor> {
    use agentdiff_plugins::RegistryError;
    registry.resolve(id).map_err(|e| {
        let code = match e {
            RegistryError::External(_) => crate::exit::BACKEND_UNAVAILABLE,
            _ => crate::exit::USAGE,
        };
        crate::exit::with_code(code, e)
    })
}

/// Takes the project lock (`.agentdiff/lock`) for a command that writes the tree or the store:
/// another `run`, `rollback` or `promote` in the same root is refused (exit 75) or, with
/// `--wait`, waited for with a message.
pub fn lock_store(
    store: &agentdiff_store::Store,
    wait: bool,
) -> anyhow::Result<agentdiff_store::StoreLock> {
    use agentdiff_store::{LockError, Wait};
    let mode = if wait { Wait::Yes } else { Wait::No };
    store
        .lock(mode, |holder| {
            errln!(
                "agentdiff: waiting for the other agentdiff{} in this project to finish",
                holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
            )
        })
        .map_err(|e| match e {
            LockError::Busy { .. } => crate::exit::with_code(crate::exit::BUSY, e),
            LockError::Io { .. } => crate::exit::with_code(crate::exit::INTERNAL, e),
        })
}
