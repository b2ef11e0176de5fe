//! Argument-vector boundaries: the command must receive exactly the words it was given.

use std::ffi::OsString;
use std::sync::Arc;

use serde_json::json;

use super::{scratch_failure, stage_failure};
use crate::harness;
use crate::{Ctx, Finding};

/// Prints every argument followed by a NUL byte, so nothing is ambiguous.
const ECHO_ARGS: &str = "for a in \"$@\"; do printf '%s\\0' \"$a\"; done";

fn show(words: &[Vec<u8>]) -> Vec<String> {
    words
        .iter()
        .map(|w| agentdiff_host::redact::escape_terminal(&String::from_utf8_lossy(w)))
        .collect()
}

async fn roundtrip(ctx: Arc<Ctx>, args: Vec<OsString>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let mut argv: Vec<OsString> = vec!["sh".into(), "-c".into(), ECHO_ARGS.into(), "sh".into()];
    argv.extend(args.iter().cloned());
    let ran = match harness::run(backend.as_ref(), &scratch, &ctx.argv(argv)).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let sent: Vec<Vec<u8>> = args.iter().map(|a| a.as_encoded_bytes().to_vec()).collect();
    let received = harness::split_nul(&ran.stdout);
    let details = json!({
        "sent": show(&sent),
        "received": show(&received),
        "exit": ran.evidence.exit,
        "prepared_program": ran.prepared.program().to_string_lossy(),
        "prepared_args": ran.prepared.args().iter().map(|a| a.to_string_lossy().into_owned()).collect::<Vec<_>>(),
    });
    if received == sent && ran.evidence.exit.code == Some(0) {
        return Finding::pass(details);
    }
    let reason = if received.len() != sent.len() {
        format!(
            "sent {} arguments, the command received {}",
            sent.len(),
            received.len()
        )
    } else if let Some(i) = (0..sent.len()).find(|i| sent[*i] != received[*i]) {
        format!("argument {} changed in transit", i + 1)
    } else {
        format!(
            "arguments arrived but the command exited {:?}",
            ran.evidence.exit
        )
    };
    Finding::fail(reason, details)
}

fn os(words: &[&str]) -> Vec<OsString> {
    words.iter().map(OsString::from).collect()
}

pub async fn spaces_quotes(ctx: Arc<Ctx>) -> Finding {
    roundtrip(
        ctx,
        os(&[
            "two words",
            "  padded  ",
            "'single'",
            "\"double\"",
            "it's",
            "back\\slash",
            "$HOME",
            "`id`",
            "$(id)",
            "a;b|c&d>e<f",
            "*",
            "~",
            "{a,b}",
            "%s%n",
        ]),
    )
    .await
}

pub async fn newlines(ctx: Arc<Ctx>) -> Finding {
    roundtrip(
        ctx,
        os(&[
            "line1\nline2",
            "\n",
            "trailing\n",
            "cr\rlf",
            "tab\tsep",
            "bell\u{7}",
            "esc\u{1b}[31m",
        ]),
    )
    .await
}

pub async fn dashes(ctx: Arc<Ctx>) -> Finding {
    roundtrip(
        ctx,
        os(&[
            "-n",
            "-e",
            "--",
            "-",
            "--help",
            "-c",
            "--flag=value",
            "-rf",
            "--version",
        ]),
    )
    .await
}

pub async fn empty(ctx: Arc<Ctx>) -> Finding {
    roundtrip(ctx, os(&["", "between", "", ""])).await
}

pub async fn unicode(ctx: Arc<Ctx>) -> Finding {
    roundtrip(
        ctx,
        os(&[
            "héllo wörld",
            "日本語",
            "emoji 🚀",
            "\u{202e}rtl",
            "ＦＵＬＬ",
            "e\u{301}",
        ]),
    )
    .await
}

pub async fn non_utf8(ctx: Arc<Ctx>) -> Finding {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        roundtrip(
            ctx,
            vec![
                OsString::from_vec(vec![0xff, 0xfe, b'a']),
                OsString::from_vec(vec![b'x', 0x80]),
            ],
        )
        .await
    }
    #[cfg(not(unix))]
    {
        let _ = ctx;
        Finding::skip("non-UTF-8 arguments are a Unix notion")
    }
}
