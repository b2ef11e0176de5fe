//! Checks through a full evidence transaction (`agentdiff_engine::transaction::run`): what the
//! capsule really stores, and what a private workspace really leaves on the host.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use agentdiff_backend_api::{StdioMode, WorkspaceMode};
use agentdiff_engine::transaction::{self, RunOutcome, RunRequest};
use agentdiff_policy::{LoadedPolicy, Policy, PolicySource};
use serde_json::{json, Value};

use super::scratch_failure;
use crate::harness::Scratch;
use crate::probes::programs::snapshot;
use crate::{Ctx, Finding};

async fn transact(
    ctx: &Ctx,
    scratch: &Scratch,
    argv: Vec<OsString>,
) -> Result<RunOutcome, Finding> {
    let backend = ctx.backend();
    let (_tx, interrupt) = tokio::sync::watch::channel(None);
    // Never the real user's key: a key and ledger private to this scratch.
    let state_dir = agentdiff_store::seal::StateDir::at(scratch.outside.join("state"))
        .map_err(|e| Finding::fail(format!("no private state directory: {e}"), json!(null)))?;
    let request = RunRequest {
        root: scratch.root.clone(),
        policy: LoadedPolicy {
            policy: Policy::builtin(),
            source: PolicySource::BuiltIn,
        },
        argv,
        task: None,
        timeout: Some(Duration::from_secs(60)),
        run_id: None,
        backend: backend.as_ref(),
        options: ctx.options.backend_options.clone(),
        stdio: StdioMode::Files {
            stdin: None,
            stdout: scratch.outside.join("txn-stdout"),
            stderr: scratch.outside.join("txn-stderr"),
        },
        interrupt,
        env_mode: None,
        env_pass: Vec::new(),
        grace: Duration::from_millis(500),
        poll_interval: Duration::from_millis(50),
        progress: None,
        verified_controls: Vec::new(),
        state_dir: Some(state_dir),
    };
    transaction::run(request)
        .await
        .map_err(|e| Finding::fail(format!("the transaction failed: {e}"), json!(null)))
}

fn in_place_scratch(ctx: &Ctx) -> Result<Scratch, Finding> {
    Scratch::new(ctx.options.scratch_base.as_deref(), WorkspaceMode::InPlace)
        .map_err(scratch_failure)
}

/// Secrets on the command line, in the forms the engine's redaction recognises.
pub(crate) const SECRETS: [&str; 4] = [
    "ghp_conformanceSecretToken000000000001",
    "hunter2-conformance-password",
    "urlpass-conformance-secret",
    "apikey-conformance-value-123",
];

pub(crate) fn secret_argv() -> Vec<OsString> {
    vec![
        "sh".into(),
        "-c".into(),
        "exit 0".into(),
        "sh".into(),
        "--token".into(),
        SECRETS[0].into(),
        format!("--password={}", SECRETS[1]).into(),
        format!("https://user:{}@example.invalid/repo", SECRETS[2]).into(),
        format!("API_KEY={}", SECRETS[3]).into(),
    ]
}

pub async fn stored_runtime(ctx: Arc<Ctx>) -> Finding {
    let scratch = match in_place_scratch(&ctx) {
        Ok(s) => s,
        Err(f) => return f,
    };
    let outcome = match transact(&ctx, &scratch, secret_argv()).await {
        Ok(o) => o,
        Err(f) => return f,
    };
    let path = outcome.capsule_dir.join("runtime.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            return Finding::fail(
                format!("no runtime.json in the capsule ({e})"),
                json!({"status": outcome.result.status, "refusal": format!("{:?}", outcome.refusal)}),
            )
        }
    };
    let leaked: Vec<&str> = SECRETS
        .iter()
        .copied()
        .filter(|s| text.contains(s))
        .collect();
    let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let (schema_path, schema_errors) = match ctx.options.runtime_schema() {
        Ok((path, text)) => (
            path,
            serde_json::from_str::<Value>(&text)
                .ok()
                .map(|schema| crate::schema::validate(&schema, &doc).errors),
        ),
        Err(e) => (e.to_string(), None),
    };
    let details = json!({
        "runtime_json": path.display().to_string(),
        "launched": doc.get("launched"),
        "secrets_found": leaked,
        "schema": schema_path,
        "schema_errors": schema_errors,
    });
    if doc.get("launched") != Some(&Value::Bool(true)) {
        return Finding::fail("the transaction did not launch the command", details);
    }
    if !leaked.is_empty() {
        return Finding::fail("a secret from argv is stored in runtime.json", details);
    }
    match schema_errors {
        None => Finding::fail(
            format!("the runtime schema could not be loaded: {schema_path}"),
            details,
        ),
        Some(errors) if !errors.is_empty() => Finding::fail(
            format!("runtime.json violates its schema ({} errors)", errors.len()),
            details,
        ),
        Some(_) => Finding::pass(details),
    }
}

pub async fn private_host_tree(ctx: Arc<Ctx>) -> Finding {
    let scratch = match in_place_scratch(&ctx) {
        Ok(s) => s,
        Err(f) => return f,
    };
    for (name, body) in [
        ("keep.txt", "keep\n"),
        ("edit.txt", "before\n"),
        ("remove.txt", "remove\n"),
    ] {
        if let Err(e) = scratch.seed_file(name, body.as_bytes()) {
            return Finding::fail(format!("suite setup: {e}"), json!(null));
        }
    }
    let visible = |root: &std::path::Path| {
        snapshot(root)
            .into_iter()
            .filter(|(k, _)| !k.starts_with(".agentdiff"))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let before = visible(&scratch.root);
    let argv: Vec<OsString> = vec![
        "sh".into(),
        "-c".into(),
        "echo after > edit.txt; rm -f remove.txt; echo new > created.txt; exit 0".into(),
    ];
    let outcome = match transact(&ctx, &scratch, argv).await {
        Ok(o) => o,
        Err(f) => return f,
    };
    let after = visible(&scratch.root);
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    let reported = outcome.result.changes.len();
    let details = json!({
        "status": outcome.result.status,
        "changed_on_host": changed,
        "changes_reported": reported,
    });
    if !changed.is_empty() {
        return Finding::fail(
            "the host project tree changed during a private-workspace run",
            details,
        );
    }
    // The changes happened (in the workspace) and the transaction saw them.
    Finding::require(
        reported >= 3,
        "the transaction did not report the workspace changes",
        details,
    )
}
