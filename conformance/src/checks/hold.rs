//! A backend that declares `holds_start` is launched before the transaction's before-capture:
//! it must start nothing of the command until `release()`, or the command's first changes would
//! be captured as the before-state and never recorded.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{scratch_failure, stage_failure};
use crate::harness;
use crate::{Ctx, Finding};

/// How long a held command is watched: far longer than a wrapper needs to start a command
/// (bwrap: milliseconds). Not caught: a backend that would start the command only later.
const HELD_FOR: Duration = Duration::from_millis(1000);

pub async fn nothing_runs_before_release(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    if !backend.holds_start() {
        return Finding::skip("the backend does not hold the start (holds_start is false)");
    }
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let (released, aborted) = ("held-released", "held-aborted");
    let held = |file: &str| ctx.sh(&format!("echo ran > {file}")).held();

    let mut started = match harness::start(backend.as_ref(), &scratch, &held(released)).await {
        Ok(s) => s,
        Err(stage) => return stage_failure(stage),
    };
    tokio::time::sleep(HELD_FOR).await;
    let ran_while_held = scratch.work_file(released).exists();
    let release = started.running.release().map_err(|e| e.to_string());
    let ran = match started.finish().await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let ran_after_release = scratch.work_file(released).exists();

    let abandoned = match harness::start(backend.as_ref(), &scratch, &held(aborted)).await {
        Ok(s) => s,
        Err(stage) => return stage_failure(stage),
    };
    tokio::time::sleep(HELD_FOR / 2).await;
    abandoned.running.abort().await;
    // Whatever the backend left would have run by now.
    tokio::time::sleep(HELD_FOR / 2).await;
    let ran_after_abort = scratch.work_file(aborted).exists();

    let details = json!({
        "held_for_ms": HELD_FOR.as_millis() as u64,
        "ran_while_held": ran_while_held,
        "release": release,
        "ran_after_release": ran_after_release,
        "exit_after_release": ran.exit_details(),
        "ran_after_abort": ran_after_abort,
    });
    if ran_while_held {
        return Finding::fail("the command ran before release()", details);
    }
    if ran_after_abort {
        return Finding::fail("an aborted held launch ran the command", details);
    }
    Finding::require(
        release.is_ok() && ran_after_release && ran.evidence.exit.code == Some(0),
        "the released command did not run to exit 0",
        details,
    )
}
