//! `agentdiff session rollback ID (--safe-only | --all) [--include-unattributed] [--dry-run]
//! [--wait] [--format F]`: the run rollback (`agentdiff rollback`) on the session's capsule, with
//! the same conflict rules and exit codes; only an ended (sealed) session can be rolled back.
//!
//! A session's capsule holds every change of the tree between its start and its end, including
//! the ones no call of the session could have made (the user's own edits meanwhile, another
//! agent session in the same project, work done after a killed agent before `session end`
//! sealed it). Only the changes attributed to the session's calls are rolled back, unless
//! `--include-unattributed` asks for the rest too. Not defended: an unattributed change below a
//! directory an attributed call created goes with that directory.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_policy::Action;
use agentdiff_store::schema::ChangeAttribution;

use crate::common::exit::{self, with_code};

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("scope").required(true).args(["safe_only", "all"])))]
pub struct Args {
    /// The session (see `agentdiff session list`).
    #[arg(value_name = "ID")]
    id: String,
    /// Undo only the session's changes the policy classified `review` or `deny`.
    #[arg(long)]
    safe_only: bool,
    /// Undo every change in scope that a call of the session made (all decisions).
    #[arg(long)]
    all: bool,
    /// Also undo the changes no call of the session could have made (edits by others while the
    /// session ran, or before an interrupted session was closed).
    #[arg(long)]
    include_unattributed: bool,
    /// Check every path and show what would happen; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// Wait for another agentdiff running in this project instead of exiting 75.
    #[arg(long)]
    wait: bool,
    #[arg(long, value_enum, default_value_t = crate::cli::rollback::Format::Summary)]
    format: crate::cli::rollback::Format,
    /// Project root (default: discovered from the current directory, see docs/cli.md).
    #[arg(long)]
    root: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = super::store(&root)?;
    let (capsule, metadata) = super::open(&store, &args.id)?;
    if super::state(&capsule, &metadata) != super::State::Ended {
        return Err(with_code(
            exit::INVALID_CAPSULE,
            anyhow::anyhow!(
                "session {} has not ended (its capsule is not sealed); `agentdiff session end {}` \
                 seals it first",
                args.id,
                args.id
            ),
        ));
    }
    let paths = if args.include_unattributed {
        Vec::new()
    } else {
        let view = agentdiff_report::session::view(&capsule, metadata, &super::agent_runs)
            .map_err(|e| with_code(exit::INVALID_CAPSULE, e))?;
        let attributions = view.ended.map(|e| e.attributions).unwrap_or_default();
        let (paths, left) = attributed_in_scope(&attributions, args.all);
        if left > 0 {
            errln!(
                "agentdiff: {left} change(s) of session {} no call of it could have made are \
                 left as they are (`session show {}` lists them; --include-unattributed rolls \
                 them back too)",
                args.id,
                args.id
            );
        }
        if paths.is_empty() {
            outln!("nothing to roll back: no change in scope was made by a call of this session");
            return Ok(ExitCode::SUCCESS);
        }
        paths
    };
    crate::cli::rollback::run(crate::cli::rollback::Args::of(
        args.id,
        args.all,
        paths,
        args.dry_run,
        args.wait,
        args.format,
        Some(root),
    ))
}

/// The attributed changes in scope (`all`, else `review` and `deny` only), as exact paths, and how
/// many unattributed changes in scope are left out.
fn attributed_in_scope(attributions: &[ChangeAttribution], all: bool) -> (Vec<String>, usize) {
    let in_scope = |a: &&ChangeAttribution| all || a.decision != Action::Allow;
    let (attributed, unattributed): (Vec<&ChangeAttribution>, Vec<&ChangeAttribution>) =
        attributions
            .iter()
            .filter(in_scope)
            .partition(|a| !a.unattributed);
    let paths = attributed.into_iter().map(|a| a.path.clone()).collect();
    (paths, unattributed.len())
}
