//! Standard streams pass through, and never hand the command a host file or directory.

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

/// What STDIO-003's command prints about its streams and what it could reach through them.
const REOPEN_SCRIPT: &str =
    "for n in 0 1 2; do [ -p /proc/self/fd/$n ] || echo fd$n-not-a-pipe; done; \
     echo X > /proc/self/fd/0 2>/dev/null; cat /proc/self/fd/0/canary 2>/dev/null; \
     echo x > /proc/self/fd/0/planted 2>/dev/null; true";

/// STDIO-003: a host file and a host directory given as stdin (stdout and stderr are host files
/// in this harness) reach the command as pipes: it cannot write the file through
/// `/proc/self/fd/0`, nor read or create files below the directory through it.
pub async fn host_streams_not_reopenable(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let file = scratch.outside.join("stdio-host-file");
    let dir = scratch.outside.join("stdio-host-dir");
    let seeded = std::fs::write(&file, "ORIGINAL\n")
        .and_then(|()| std::fs::create_dir_all(&dir))
        .and_then(|()| std::fs::write(dir.join("canary"), "STDIO-CANARY\n"));
    if let Err(e) = seeded {
        return Finding::fail(format!("suite setup: {e}"), serde_json::Value::Null);
    }
    let mut outputs = Vec::new();
    for stdin in [&file, &dir] {
        let inv = ctx.sh(REOPEN_SCRIPT).stdin_from(stdin);
        match harness::run(backend.as_ref(), &scratch, &inv).await {
            Ok(ran) => outputs.push(ran.stdout_text()),
            Err(stage) => return stage_failure(stage),
        }
    }
    let file_now = std::fs::read_to_string(&file).unwrap_or_default();
    let planted = dir.join("planted").exists();
    let printed = outputs.join("");
    let details = json!({"stdout": printed, "file_after": file_now, "planted": planted});
    let ok = file_now == "ORIGINAL\n"
        && !planted
        && !printed.contains("not-a-pipe")
        && !printed.contains("STDIO-CANARY");
    Finding::require(
        ok,
        "the command held a host file or directory as a standard stream (reopenable through /proc/self/fd)",
        details,
    )
}
