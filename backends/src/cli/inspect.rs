//! `agentdiff inspect RUN`: show a stored run.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;

use agentdiff_engine::store::{Artifact, Store};
use agentdiff_engine::transaction::RunResult;

use crate::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Summary,
    Json,
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
    format: Format,
    /// Print one artifact as JSON instead of the result.
    #[arg(long, value_enum)]
    artifact: Option<ArtifactName>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = super::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let capsule = store
        .open_run(&args.run)
        .map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    if let Some(name) = args.artifact {
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
        return Ok(ExitCode::SUCCESS);
    }
    let result: RunResult = capsule
        .result()
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    match args.format {
        Format::Json => outln!("{}", serde_json::to_string_pretty(&result)?),
        Format::Summary => {
            out!("{}", crate::report::run_summary(&result, &root));
            if !capsule.is_sealed() {
                outln!("  warning: this capsule is not sealed (the run did not finish)");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
