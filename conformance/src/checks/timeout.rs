//! Deadlines end the whole tree.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{scratch_failure, stage_failure};
use crate::harness::{self, Invocation};
use crate::host;
use crate::probes::programs::heartbeat_alive;
use crate::{Ctx, Finding};

pub async fn ends_tree(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let token = host::random_token();
    let name = format!("agentdiff-probe-tree-{token}");
    // A background child writing a heartbeat, and a root that would sleep for a minute.
    let inner =
        "i=0; while [ $i -lt 150 ]; do i=$((i+1)); echo $i > tree-heartbeat; sleep 0.2; done";
    // Long enough for a wrapper that starts a runtime of its own before the command (srt starts
    // Node.js: over 1.5 s on a loaded host) to start the command before the deadline.
    let timeout = Duration::from_secs(5);
    let mut inv = Invocation::new([
        "sh".to_string(),
        "-c".into(),
        "sh -c \"$1\" \"agentdiff-probe-tree-$2\" & exec sleep 60".into(),
        "sh".into(),
        inner.into(),
        token.clone(),
    ])
    .options(&ctx.options.backend_options)
    .timeout(Some(timeout));
    inv.grace = Duration::from_millis(500);
    let ran = match harness::run(backend.as_ref(), &scratch, &inv).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let hb = scratch.work_file("tree-heartbeat");
    let started = hb.exists();
    let alive = started && heartbeat_alive(&hb, Duration::from_millis(1200)).await;
    let left = host::find_by_cmdline(&name);
    for id in &left {
        let _ = host::signal_identity(id, 9);
    }
    let e = &ran.evidence.exit;
    let details = json!({
        "exit": e,
        "elapsed_ms": ran.elapsed.as_millis() as u64,
        "background_child_started": started,
        "background_child_alive_after_wait": alive,
        "leftover_processes_found_by_suite": left.len(),
    });
    let bound = timeout + inv.grace + Duration::from_secs(20);
    if !e.timed_out {
        return Finding::fail(
            "the deadline expired but evidence does not say timed_out",
            details,
        );
    }
    if ran.elapsed > bound {
        return Finding::fail(
            format!("wait() returned only after {} ms", ran.elapsed.as_millis()),
            details,
        );
    }
    if !started {
        return Finding::fail(
            "the background child never ran, so ending the tree was not shown",
            details,
        );
    }
    if alive || !left.is_empty() {
        return Finding::fail("a process of the tree survived the deadline", details);
    }
    Finding::pass(details)
}
