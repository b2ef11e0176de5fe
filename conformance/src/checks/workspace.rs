//! Private workspaces leave the host tree unchanged.

use std::sync::Arc;

use serde_json::json;

use crate::probes::{run_probe, ProbeKind, Verdict};
use crate::{Ctx, Finding};

pub async fn host_tree_unchanged(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let r = run_probe(
        backend.as_ref(),
        ProbeKind::HostTree,
        &ctx.options.probe_options(),
    )
    .await;
    let details = json!({"probe": r});
    match r.verdict {
        Verdict::Verified => Finding::pass(details),
        _ => Finding::fail(r.summary.clone(), details),
    }
}
