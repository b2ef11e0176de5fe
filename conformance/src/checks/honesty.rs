//! Honesty: a boundary labelled `enforced` must withstand its probe. A boundary labelled
//! `requested` gets its probe result reported as information and the check is skipped (nothing
//! was claimed beyond handing the control over).

use std::sync::Arc;

use agentdiff_backend_api::{Boundary, Level};
use serde_json::json;

use crate::probes::{run_probe, ProbeKind, Verdict};
use crate::{Ctx, Finding};

async fn withstand(ctx: Arc<Ctx>, boundary: Boundary) -> Finding {
    let backend = ctx.backend();
    let level = ctx.capabilities.level(boundary);
    let kind = ProbeKind::for_boundary(boundary);
    let r = run_probe(backend.as_ref(), kind, &ctx.options.probe_options()).await;
    ctx.note_probe(r.clone());
    let details = json!({"declared": level, "probe": r});
    if level < Level::Enforced {
        return Finding {
            outcome: crate::Outcome::skipped(format!(
                "{} labelled `{}`: probe says {} ({}), information only",
                boundary.as_str(),
                level.as_str(),
                r.verdict.as_str(),
                r.summary
            )),
            details,
        };
    }
    match r.verdict {
        Verdict::Verified => Finding::pass(details),
        Verdict::NotEnforced => Finding::fail(
            format!(
                "labelled enforced, but the {} probe shows it does not hold: {}",
                kind.as_str(),
                r.summary
            ),
            details,
        ),
        Verdict::NotApplicable | Verdict::Inconclusive => Finding::fail(
            format!(
                "labelled enforced, but the {} probe could not show it holds: {}",
                kind.as_str(),
                r.summary
            ),
            details,
        ),
    }
}

pub async fn filesystem_writes(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::FilesystemWrites).await
}
pub async fn host_repository(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::HostRepository).await
}
pub async fn network(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::Network).await
}
pub async fn processes(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::Processes).await
}
pub async fn resources(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::Resources).await
}
pub async fn privileges(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::Privileges).await
}
pub async fn environment(ctx: Arc<Ctx>) -> Finding {
    withstand(ctx, Boundary::Environment).await
}

/// `filtered` network: the egress probe, handed the proxy, must verify; a backend that does not
/// label the run `filtered` when handed the proxy has nothing to withstand (skipped).
pub async fn network_filtered(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let r = run_probe(
        backend.as_ref(),
        ProbeKind::EgressFiltered,
        &ctx.options.probe_options(),
    )
    .await;
    ctx.note_probe(r.clone());
    let details = json!({"probe": r});
    match r.verdict {
        Verdict::Verified => Finding::pass(details),
        Verdict::NotApplicable => Finding {
            outcome: crate::Outcome::skipped(r.summary.clone()),
            details,
        },
        Verdict::NotEnforced | Verdict::Inconclusive => Finding::fail(
            format!(
                "labelled filtered, but the egress probe {}: {}",
                r.verdict.as_str(),
                r.summary
            ),
            details,
        ),
    }
}
