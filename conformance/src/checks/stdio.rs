//! Standard streams pass through.

use std::sync::Arc;

use serde_json::json;

use super::{scratch_failure, stage_failure};
use crate::harness::{self, excerpt};
use crate::{Ctx, Finding};

pub async fn stdin_to_stdout(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let input: &[u8] = b"line one\nline two\n\0binary\xff\xfe\nno trailing newline";
    let inv = ctx.argv(["cat"]).stdin(input);
    let ran = match harness::run(backend.as_ref(), &scratch, &inv).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let details = json!({"sent_len": input.len(), "received_len": ran.stdout.len(), "received": excerpt(&ran.stdout), "exit": ran.evidence.exit});
    Finding::require(
        ran.stdout == input && ran.evidence.exit.code == Some(0),
        "what `cat` printed differs from what was fed to its stdin",
        details,
    )
}

pub async fn separate_streams(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let inv = ctx.sh("printf 'to-stdout'; printf 'to-stderr' >&2");
    let ran = match harness::run(backend.as_ref(), &scratch, &inv).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let details = json!({"stdout": excerpt(&ran.stdout), "stderr": excerpt(&ran.stderr)});
    // A wrapper may add its own diagnostics on stderr; stdout must be exactly the command's.
    let ok = ran.stdout == b"to-stdout" && ran.stderr_text().contains("to-stderr");
    Finding::require(ok, "stdout/stderr did not pass through separately", details)
}
