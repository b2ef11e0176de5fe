//! Declared labels, availability and the purity of prepare().

use std::sync::Arc;

use agentdiff_engine::backend::{Availability, Level};
use serde_json::json;

use super::scratch_failure;
use crate::harness::{self, Invocation};
use crate::probes::programs::snapshot;
use crate::{Ctx, Finding};

pub async fn availability(ctx: Arc<Ctx>) -> Finding {
    let details = json!({"availability": ctx.availability});
    match &ctx.availability {
        Availability::Ready { .. } => Finding::pass(details),
        Availability::Unavailable { reason, remedy } => {
            if reason.trim().is_empty() || remedy.trim().is_empty() {
                Finding::fail("Unavailable without a reason and a remedy", details)
            } else if ctx.options.require_available {
                Finding::fail(
                    format!(
                        "unavailable ({reason}; {remedy}) and {}=1",
                        crate::REQUIRE_REAL_BACKENDS_ENV
                    ),
                    details,
                )
            } else {
                Finding::pass(details)
            }
        }
    }
}

pub async fn declared_consistency(ctx: Arc<Ctx>) -> Finding {
    let c = &ctx.capabilities;
    let mut problems = Vec::new();
    if c.sandboxed && c.filesystem_writes < Level::Requested && c.host_repository < Level::Requested
    {
        problems.push(
            "sandboxed: true without filesystem_writes or host_repository at least requested",
        );
    }
    if c.network_enforcement && c.network < Level::Requested {
        problems.push("network_enforcement: true without network at least requested");
    }
    if c.network >= Level::Requested && !c.network_enforcement && c.network == Level::Enforced {
        problems.push("network enforced but network_enforcement: false");
    }
    Finding::require(
        problems.is_empty(),
        problems.join("; "),
        json!({"declared": c}),
    )
}

pub async fn prepare_is_pure(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let inv = ctx.sh("echo hello > prepared-ran");
    let spec = harness::spec_for(&scratch, &inv, "conformance-prepare");
    let dirs = [&scratch.root, &scratch.workdir, &scratch.capsule];
    let before: Vec<_> = dirs.iter().map(|d| snapshot(d)).collect();
    let first = backend.prepare(&spec);
    let second = backend.prepare(&spec);
    let after: Vec<_> = dirs.iter().map(|d| snapshot(d)).collect();
    let (a, b) = match (first, second) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return Finding::fail(format!("prepare failed: {e}"), json!(null))
        }
    };
    let same = a.program == b.program
        && a.args == b.args
        && a.env == b.env
        && a.cwd == b.cwd
        && a.enforcement == b.enforcement
        && a.wrapper_argv == b.wrapper_argv
        && a.runtime_config == b.runtime_config;
    let details = json!({"program": a.program.to_string_lossy(), "args": a.args.iter().map(|x| x.to_string_lossy().into_owned()).collect::<Vec<_>>(), "enforcement": a.enforcement});
    if before != after {
        return Finding::fail(
            "prepare() changed the root, workspace or capsule directory",
            details,
        );
    }
    Finding::require(
        same,
        "two prepare() calls on the same request differ",
        details,
    )
}

pub async fn prepare_refuses_empty(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let inv = Invocation::new(Vec::<String>::new()).options(&ctx.options.backend_options);
    let spec = harness::spec_for(&scratch, &inv, "conformance-empty");
    match backend.prepare(&spec) {
        Err(e) => Finding::pass(json!({"error": e.to_string()})),
        Ok(p) => Finding::fail(
            "prepare() accepted an empty command",
            json!({"program": p.program.to_string_lossy()}),
        ),
    }
}
