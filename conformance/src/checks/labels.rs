//! Declared labels, availability and the purity of prepare().

use std::sync::Arc;

use agentdiff_backend_api::{Availability, BackendError, Level};
use serde_json::json;

use super::scratch_failure;
use crate::harness::{self, Invocation};
use crate::probes::programs::snapshot;
use crate::{Ctx, Finding, REQUIRE_REAL_BACKENDS_ENV};

/// `prepare()` refused with `Unavailable` on a backend that said it is unavailable: the check
/// cannot be made here, which is a skip (a failure when availability is required), never a
/// failure of the backend's contract.
fn refused_as_unavailable(ctx: &Ctx, e: &BackendError) -> Option<Finding> {
    if ctx.availability.is_ready() || !matches!(e, BackendError::Unavailable { .. }) {
        return None;
    }
    Some(if ctx.options.require_available {
        Finding::fail(
            format!("backend unavailable and {REQUIRE_REAL_BACKENDS_ENV}=1: {e}"),
            json!(null),
        )
    } else {
        Finding::skip(format!(
            "backend unavailable, prepare() cannot plan here: {e}"
        ))
    })
}

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
            if before != after {
                return Finding::fail(
                    format!("prepare() failed ({e}) and changed the root, workspace or capsule"),
                    json!(null),
                );
            }
            return refused_as_unavailable(&ctx, &e)
                .unwrap_or_else(|| Finding::fail(format!("prepare failed: {e}"), json!(null)));
        }
    };
    let mut differ = Vec::new();
    for (name, same) in [
        ("program", a.program() == b.program()),
        ("args", a.args() == b.args()),
        ("cwd", a.cwd() == b.cwd()),
        ("enforcement", a.enforcement() == b.enforcement()),
        ("wrapper_argv", a.wrapper_argv() == b.wrapper_argv()),
        ("env", a.env() == b.env()),
        ("runtime_config", a.runtime_config() == b.runtime_config()),
    ] {
        if !same {
            differ.push(name);
        }
    }
    let details = json!({
        "program": a.program().to_string_lossy(),
        "args": a.args().iter().map(|x| x.to_string_lossy().into_owned()).collect::<Vec<_>>(),
        "enforcement": a.enforcement(),
        "differs_between_two_calls": differ,
    });
    if before != after {
        return Finding::fail(
            "prepare() changed the root, workspace or capsule directory",
            details,
        );
    }
    Finding::pass(details)
}

pub async fn prepare_is_deterministic(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let spec = harness::spec_for(&scratch, &ctx.sh("exit 0"), "conformance-prepare");
    let (a, b) = match (backend.prepare(&spec), backend.prepare(&spec)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            return refused_as_unavailable(&ctx, &e)
                .unwrap_or_else(|| Finding::fail(format!("prepare failed: {e}"), json!(null)))
        }
    };
    // What will be executed and how it is labelled must not vary; the environment and the
    // recorded configuration may carry per-launch values (a salt, a nonce).
    let mut differ = Vec::new();
    for (name, same) in [
        ("program", a.program() == b.program()),
        ("args", a.args() == b.args()),
        ("cwd", a.cwd() == b.cwd()),
        ("enforcement", a.enforcement() == b.enforcement()),
        ("wrapper_argv", a.wrapper_argv() == b.wrapper_argv()),
    ] {
        if !same {
            differ.push(name);
        }
    }
    Finding::require(
        differ.is_empty(),
        format!(
            "two prepare() calls on the same request differ in: {}",
            differ.join(", ")
        ),
        json!({"differs": differ}),
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
            json!({"program": p.program().to_string_lossy()}),
        ),
    }
}
