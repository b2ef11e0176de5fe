//! Exit status propagation.

use std::sync::Arc;

use super::{scratch_failure, stage_failure};
use crate::harness;
use crate::{Ctx, Finding};

async fn expect_code(ctx: Arc<Ctx>, code: i32) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let ran = match harness::run(backend.as_ref(), &scratch, &ctx.sh(&format!("exit {code}"))).await
    {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let e = &ran.evidence.exit;
    let ok = e.code == Some(code)
        && e.signal.is_none()
        && !e.timed_out
        && ran.evidence.failure.is_none();
    Finding::require(
        ok,
        format!("expected exit code {code}, evidence says code {:?} signal {:?} timed_out {} failure {:?}", e.code, e.signal, e.timed_out, ran.evidence.failure),
        ran.exit_details(),
    )
}

pub async fn zero(ctx: Arc<Ctx>) -> Finding {
    expect_code(ctx, 0).await
}

pub async fn one(ctx: Arc<Ctx>) -> Finding {
    expect_code(ctx, 1).await
}

pub async fn forty_two(ctx: Arc<Ctx>) -> Finding {
    expect_code(ctx, 42).await
}

pub async fn signal(ctx: Arc<Ctx>) -> Finding {
    const SIGKILL: i32 = 9;
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let ran = match harness::run(backend.as_ref(), &scratch, &ctx.sh("kill -KILL $$")).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let e = &ran.evidence.exit;
    // A wrapper or container engine may report a child's signal death as 128+signal.
    let ok = (e.signal == Some(SIGKILL) || e.code == Some(128 + SIGKILL)) && !e.timed_out;
    Finding::require(
        ok,
        format!(
            "expected death by signal 9 (or code 137), evidence says code {:?} signal {:?}",
            e.code, e.signal
        ),
        ran.exit_details(),
    )
}
