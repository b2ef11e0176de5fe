//! Evidence: schema, redaction, environment fingerprints, labels.

use std::sync::Arc;

use agentdiff_backend_api::{Boundary, Enforcement, Level, RunEvidence};
use agentdiff_host::redact;
use serde_json::{json, Value};

use super::{scratch_failure, stage_failure};
use crate::harness::{self, Invocation};
use crate::{Ctx, Finding};

async fn run_once(ctx: &Ctx, inv: Invocation) -> Result<harness::Ran, Finding> {
    let backend = ctx.backend();
    let scratch = ctx.scratch().map_err(scratch_failure)?;
    harness::run(backend.as_ref(), &scratch, &inv)
        .await
        .map_err(stage_failure)
}

/// The evidence as the transaction stores it in `runtime.json`.
pub fn as_stored(evidence: &RunEvidence) -> Value {
    agentdiff_engine::transaction::runtime_document(evidence)
}

/// JSON paths of string values containing `needle`.
fn find_string(value: &Value, needle: &str, path: &str, out: &mut Vec<String>) {
    match value {
        Value::String(s) if s.contains(needle) => out.push(path.to_string()),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .for_each(|(i, v)| find_string(v, needle, &format!("{path}[{i}]"), out)),
        Value::Object(m) => m.iter().for_each(|(k, v)| {
            if k.contains(needle) {
                out.push(format!("{path}.{k} (key)"));
            }
            find_string(v, needle, &format!("{path}.{k}"), out)
        }),
        _ => {}
    }
}

pub async fn schema(ctx: Arc<Ctx>) -> Finding {
    let (path, text) = match ctx.options.runtime_schema() {
        Ok(found) => found,
        Err(e) => return Finding::fail(e.to_string(), json!(null)),
    };
    let schema: Value = match serde_json::from_str(&text) {
        Ok(s) => s,
        Err(e) => return Finding::fail(format!("{path} is not valid JSON: {e}"), json!(null)),
    };
    let ran = match run_once(&ctx, ctx.sh("exit 0")).await {
        Ok(r) => r,
        Err(f) => return f,
    };
    let doc = as_stored(&ran.evidence);
    let v = crate::schema::validate(&schema, &doc);
    let details =
        json!({"schema": path, "errors": v.errors, "keywords_not_checked": v.ignored_keywords});
    Finding::require(
        v.is_valid(),
        format!("{} schema violations", v.errors.len()),
        details,
    )
}

pub async fn argv_redaction(ctx: Arc<Ctx>) -> Finding {
    let secrets = [
        "ghp_conformanceSecretToken000000000001",
        "hunter2-conformance-password",
        "urlpass-conformance-secret",
        "apikey-conformance-value-123",
    ];
    let inv = ctx.argv([
        "sh".to_string(),
        "-c".into(),
        "exit 0".into(),
        "sh".into(),
        "--token".into(),
        secrets[0].into(),
        format!("--password={}", secrets[1]),
        format!("https://user:{}@example.invalid/repo", secrets[2]),
        format!("API_KEY={}", secrets[3]),
    ]);
    let ran = match run_once(&ctx, inv).await {
        Ok(r) => r,
        Err(f) => return f,
    };
    let stored = as_stored(&ran.evidence);
    let mut leaks = Vec::new();
    for s in secrets {
        find_string(&stored, s, "$", &mut leaks);
    }
    let details = json!({"leaked_at": leaks, "wrapper_argv_as_stored": stored.get("wrapper_argv")});
    Finding::require(
        leaks.is_empty(),
        "a secret from argv survives in evidence as stored (store argv as a list, never as one joined string)",
        details,
    )
}

pub async fn environment_fingerprints(ctx: Arc<Ctx>) -> Finding {
    let name = "AGENTDIFF_CONFORMANCE_API_TOKEN";
    let value = format!("env-secret-{}", crate::host::random_token());
    let ran = match run_once(&ctx, ctx.sh("exit 0").env(name, &value)).await {
        Ok(r) => r,
        Err(f) => return f,
    };
    let raw = serde_json::to_value(&ran.evidence).unwrap_or(Value::Null);
    let mut leaks = Vec::new();
    find_string(&raw, &value, "$", &mut leaks);
    let env = ran.evidence.environment.as_ref();
    let malformed: Vec<String> = env
        .map(|e| {
            e.variables
                .iter()
                .filter(|(_, fp)| {
                    !(fp.starts_with("sha256:")
                        && fp.len() > 7
                        && fp[7..].chars().all(|c| c.is_ascii_hexdigit()))
                })
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    let expected = redact::fingerprint(name, value.as_bytes());
    let details = json!({
        "environment_reported": env.is_some(),
        "value_found_at": leaks,
        "not_a_fingerprint": malformed,
        "fingerprint_recorded": env.and_then(|e| e.variables.get(name)),
        "fingerprint_expected": expected,
    });
    if !leaks.is_empty() {
        return Finding::fail("an environment value appears in the evidence", details);
    }
    if !malformed.is_empty() {
        return Finding::fail(
            "environment evidence holds values that are not sha256 fingerprints",
            details,
        );
    }
    Finding::pass(details)
}

pub async fn labels_match(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let declared = backend.capabilities(&ctx.options.backend_options);
    let id = backend.id().to_string();
    let ran = match run_once(&ctx, ctx.sh("exit 0")).await {
        Ok(r) => r,
        Err(f) => return f,
    };
    let ev = &ran.evidence;
    let mut problems = Vec::new();
    if ev.backend != id {
        problems.push(format!(
            "evidence names backend `{}`, the backend's id is `{id}`",
            ev.backend
        ));
    }
    for b in Boundary::ALL {
        if ev.capabilities.level(b) > declared.level(b) {
            problems.push(format!(
                "{} is `{}` in evidence but declared `{}`",
                b.as_str(),
                ev.capabilities.level(b).as_str(),
                declared.level(b).as_str()
            ));
        }
    }
    if ev.capabilities.sandboxed && !declared.sandboxed {
        problems.push("evidence says sandboxed, the backend does not declare it".into());
    }
    if ev.capabilities.network_enforcement && !declared.network_enforcement {
        problems.push("evidence says network_enforcement, the backend does not declare it".into());
    }
    if ev.enforcement == Enforcement::None
        && Boundary::ALL
            .iter()
            .any(|b| ev.capabilities.level(*b) == Level::Requested)
    {
        problems.push("enforcement `none` but a boundary is labelled `requested` (handed to an external tool)".into());
    }
    let details = json!({"evidence_backend": ev.backend, "enforcement": ev.enforcement, "evidence_capabilities": ev.capabilities, "declared": declared});
    Finding::require(problems.is_empty(), problems.join("; "), details)
}
