//! `agentdiff inspect RUN`: show a stored run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;
use serde::Serialize;

use agentdiff_engine::transaction::RunResult;
use agentdiff_host::redact::escape_terminal;
use agentdiff_report::diff::DiffSource;
use agentdiff_report::{markdown, RunView};
use agentdiff_store::{Artifact, Capsule, Store, Verdict, VerifyReport};

use crate::common::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Summary,
    Json,
}

/// `inspect` also renders markdown (the other commands share [`Format`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InspectFormat {
    Summary,
    Json,
    /// A compact report for `$GITHUB_STEP_SUMMARY` and pull-request comments.
    Markdown,
    /// One self-contained HTML file (diffs, blast radius chart, processes, ports, timeline, seal
    /// status); redirect it to a file and open it in a browser.
    Html,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ArtifactName {
    Metadata,
    Policy,
    Before,
    After,
    Runtime,
    Result,
    Integrity,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run id (see `agentdiff runs`).
    run: String,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: InspectFormat,
    /// Print one artifact as JSON instead of the result (its JSON: a --format beside it would be
    /// ignored, so the two are refused together).
    #[arg(long, value_enum, conflicts_with = "format")]
    artifact: Option<ArtifactName>,
    /// Also print each change's diff (summary format; sensitive files show sizes and hashes
    /// only; the HTML report always has them).
    #[arg(long)]
    diff: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let capsule = store
        .open_run(&args.run)
        .map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    if args.diff && (args.format != InspectFormat::Summary || args.artifact.is_some()) {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!(
                "--diff goes with the summary format only (the HTML report always shows diffs); \
                 drop --format/--artifact or --diff"
            ),
        ));
    }
    // Every view states the verdict `agentdiff verify` reaches before any recorded content, and
    // a forged capsule exits 67 whatever the format: its content is not what agentdiff sealed.
    let seal = crate::common::context::seal_of(&store, &capsule)?;
    let code = if seal.verdict == Verdict::Forged {
        ExitCode::from(exit::INVALID_CAPSULE)
    } else {
        ExitCode::SUCCESS
    };
    if let Some(name) = args.artifact {
        print_artifact(&store, &capsule, name, &seal)?;
        return Ok(code);
    }
    let has_result =
        std::fs::symlink_metadata(capsule.dir().join(Artifact::Result.file_name())).is_ok();
    if !has_result {
        return match seal.verdict {
            Verdict::Forged => result_deleted(&capsule, args.format, &seal),
            _ => interrupted(&capsule, args.format),
        };
    }
    if args.format == InspectFormat::Json {
        let result: RunResult = agentdiff_report::checked_result(&capsule)
            .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
        let shown = InspectJson {
            verification: &seal,
            result: &result,
        };
        outln!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(code);
    }
    let mut view =
        RunView::load(&capsule).map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    view.seal = Some(seal);
    let diffs = || DiffSource::open(&capsule, store.objects(), store.root());
    match args.format {
        InspectFormat::Markdown => out!("{}", markdown::render(&view)),
        InspectFormat::Html => {
            let diffs = diffs().diffs(&view.result.changes);
            out!("{}", agentdiff_report::html::render(&view, &diffs, None));
        }
        InspectFormat::Summary | InspectFormat::Json => {
            out!("{}", agentdiff_report::terminal::run_summary(&view));
            out!("{}", agentdiff_report::terminal::inspect_sections(&view));
            if args.diff {
                let diffs = diffs().diffs(&view.result.changes);
                out!("{}", agentdiff_report::terminal::diff_section(&diffs));
            }
        }
    }
    Ok(code)
}

/// `inspect --format json`: the seal verdict first, then the recorded result's fields.
#[derive(Serialize)]
struct InspectJson<'a> {
    verification: &'a VerifyReport,
    #[serde(flatten)]
    result: &'a RunResult,
}

/// One artifact as JSON, after the seal verdict on stderr when the capsule does not verify
/// (the artifact itself keeps its own shape).
fn print_artifact(
    store: &Store,
    capsule: &Capsule,
    name: ArtifactName,
    seal: &VerifyReport,
) -> anyhow::Result<()> {
    if seal.verdict == Verdict::Forged {
        errln!(
            "agentdiff: seal FORGED: run {} does not match what agentdiff sealed, so this \
             artifact is not evidence it vouches for (agentdiff verify {0} names each problem)",
            escape_terminal(capsule.id().as_str())
        );
    }
    // Every artifact goes through its typed reader; manifests are shown whole (their entries
    // live in the object store).
    let invalid = |e| exit::with_code(exit::INVALID_CAPSULE, e);
    let value = match name {
        ArtifactName::Before => serde_json::to_value(
            capsule
                .manifest(Artifact::Before, store.objects())
                .map_err(invalid)?,
        ),
        ArtifactName::After => serde_json::to_value(
            capsule
                .manifest(Artifact::After, store.objects())
                .map_err(invalid)?,
        ),
        ArtifactName::Metadata => serde_json::to_value(capsule.metadata().map_err(invalid)?),
        ArtifactName::Policy => serde_json::to_value(capsule.policy_doc().map_err(invalid)?),
        ArtifactName::Runtime => serde_json::to_value(capsule.runtime().map_err(invalid)?),
        ArtifactName::Result => serde_json::to_value(capsule.result().map_err(invalid)?),
        ArtifactName::Integrity => serde_json::to_value(capsule.integrity().map_err(invalid)?),
    }
    .context("cannot serialise the artifact")?;
    outln!("{}", serde_json::to_string_pretty(&value)?);
    Ok(())
}

/// A run without result.json that was sealed (the seal or this user's ledger says so): the
/// result was deleted after the seal, which is tampering, never an interruption.
fn result_deleted(
    capsule: &Capsule,
    format: InspectFormat,
    seal: &VerifyReport,
) -> anyhow::Result<ExitCode> {
    let id = capsule.id().to_string();
    match format {
        InspectFormat::Summary => {
            out!("{}", agentdiff_report::terminal::verdict_lines(seal));
            outln!(
                "\nagentdiff: run {} — TAMPERED: it was sealed, and its result.json is gone",
                escape_terminal(&id)
            );
            outln!(
                "  nothing of it is shown; agentdiff verify {} names each problem",
                escape_terminal(&id)
            );
            outln!("  status: tampered");
        }
        InspectFormat::Json => {
            let shown = serde_json::json!({ "run_id": id, "verification": seal });
            outln!("{}", serde_json::to_string_pretty(&shown)?);
        }
        InspectFormat::Markdown | InspectFormat::Html => {
            return Err(exit::with_code(
                exit::INVALID_CAPSULE,
                anyhow::anyhow!(
                    "run {id} is forged: it was sealed, and its result.json is gone (agentdiff \
                     verify {id} names each problem)"
                ),
            ));
        }
    }
    Ok(ExitCode::from(exit::INVALID_CAPSULE))
}

/// A run that never recorded its result (agentdiff was killed mid-run): say so, with what is
/// known from metadata.json and what can still be done, instead of a file-not-found error.
fn interrupted(capsule: &Capsule, format: InspectFormat) -> anyhow::Result<ExitCode> {
    let id = capsule.id().to_string();
    let what = format!(
        "run {id} was interrupted before it recorded its result (no result.json; the capsule is \
         not sealed): its changes were never classified and rollback refuses it; \
         `agentdiff cleanup {id}` stops what it left behind"
    );
    if format != InspectFormat::Summary {
        return Err(exit::with_code(
            exit::INVALID_CAPSULE,
            anyhow::anyhow!(what),
        ));
    }
    outln!("\nagentdiff: run {} — INTERRUPTED", escape_terminal(&id));
    if let Ok(meta) = capsule.metadata() {
        outln!(
            "  started {} with the {} backend: {}",
            escape_terminal(&meta.created_at),
            escape_terminal(&meta.backend),
            escape_terminal(&meta.argv.join(" "))
        );
        if let Some(task) = &meta.task {
            outln!("  task: {}", escape_terminal(task));
        }
    }
    outln!("  {}", escape_terminal(&what));
    outln!("  status: interrupted");
    Ok(ExitCode::SUCCESS)
}
