//! Protocol checks for external backends (`PROTO-*`): the plugin executable is spoken to
//! directly, with requests agentdiff would never send, and killed in the middle of a run.
//! Skipped for a backend that is not an external one.

use std::sync::Arc;
use std::time::Duration;

use agentdiff_engine::backend::external::protocol::PROTOCOL_VERSION;
use agentdiff_engine::backend::external::{
    ExternalError, ExternalFacts, Parentage, Plugin, PluginStdio, Session,
};
use serde_json::{json, Value};

use super::{scratch_failure, stage_failure};
use crate::harness;
use crate::{Ctx, Finding};

const ANSWER: Duration = Duration::from_secs(15);

fn plugin(ctx: &Ctx) -> Result<Plugin, Finding> {
    ctx.options
        .plugin
        .clone()
        .ok_or_else(|| Finding::skip("not an external backend: there is no protocol to check"))
}

/// Problems of one response against the published response schema.
fn schema_errors(response: &Value) -> Vec<String> {
    match serde_json::from_str::<Value>(crate::PROTOCOL_RESPONSE_SCHEMA) {
        Ok(schema) => crate::schema::validate(&schema, response).errors,
        Err(e) => vec![format!("the compiled-in response schema is not JSON: {e}")],
    }
}

/// Start the plugin, send `requests` in order, and collect one response per request.
/// Why an exchange with a plugin stopped.
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    #[error("{0}")]
    Start(#[source] ExternalError),
    #[error("after {request}: {source}")]
    After {
        request: Value,
        #[source]
        source: ExternalError,
    },
}

fn exchange(plugin: &Plugin, requests: &[Value]) -> Result<Vec<Value>, ExchangeError> {
    let mut session =
        Session::start_raw(plugin, PluginStdio::Quiet).map_err(ExchangeError::Start)?;
    let mut answers = Vec::new();
    for request in requests {
        let answer = session
            .send_value(request)
            .and_then(|()| session.receive_value(ANSWER));
        match answer {
            Ok(v) => answers.push(v),
            Err(source) => {
                session.kill();
                return Err(ExchangeError::After {
                    request: request.clone(),
                    source,
                });
            }
        }
    }
    session.finish();
    Ok(answers)
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(f).await.ok()
}

/// PROTO-001: `hello` is answered with this protocol version and the id of the file name, and the
/// descriptor is well formed.
pub async fn handshake(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    let id = plugin.id.clone();
    let requests = [
        json!({"type": "hello", "protocol": PROTOCOL_VERSION}),
        json!({"type": "describe"}),
    ];
    let answers = match blocking(move || exchange(&plugin, &requests)).await {
        Some(Ok(a)) => a,
        Some(Err(e)) => return Finding::fail(e.to_string(), Value::Null),
        None => return Finding::fail("the exchange did not complete", Value::Null),
    };
    let mut problems: Vec<String> = answers.iter().flat_map(schema_errors).collect();
    if answers[0] != json!({"type": "hello", "protocol": PROTOCOL_VERSION, "id": id}) {
        problems.push(format!("hello answered {}", answers[0]));
    }
    if answers[1]["type"] != "descriptor" || answers[1]["id"] != id.as_str() {
        problems.push(format!(
            "describe answered a descriptor for {}",
            answers[1]["id"]
        ));
    }
    Finding::require(
        problems.is_empty(),
        problems.join("; "),
        json!({ "answers": answers }),
    )
}

/// PROTO-002: a `hello` with a version the plugin does not speak is refused, not served.
pub async fn version_mismatch(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    let unsupported = PROTOCOL_VERSION + 998;
    let requests = [json!({"type": "hello", "protocol": unsupported})];
    let answers = match blocking(move || exchange(&plugin, &requests)).await {
        Some(Ok(a)) => a,
        // Closing the channel without a word is a refusal too, if an unhelpful one.
        Some(Err(
            e @ (ExchangeError::Start(ExternalError::Died { .. })
            | ExchangeError::After {
                source: ExternalError::Died { .. },
                ..
            }),
        )) => {
            return Finding::pass(json!({"closed": e.to_string()}));
        }
        Some(Err(e)) => return Finding::fail(e.to_string(), Value::Null),
        None => return Finding::fail("the exchange did not complete", Value::Null),
    };
    let answer = &answers[0];
    let refused = answer["type"] == "error"
        || (answer["type"] == "hello" && answer["protocol"] != json!(unsupported));
    let mut problems = schema_errors(answer);
    if !refused {
        problems.push(format!("protocol {unsupported} was accepted: {answer}"));
    }
    Finding::require(
        problems.is_empty(),
        problems.join("; "),
        json!({ "answer": answer }),
    )
}

/// PROTO-003: an unknown request type is answered with an `error` of kind `protocol`, and the
/// plugin goes on answering.
pub async fn unknown_request(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    let requests = [
        json!({"type": "hello", "protocol": PROTOCOL_VERSION}),
        json!({"type": "agentdiff-conformance-unknown", "argv": ["sh", "-c", "exit 0"]}),
        json!({"type": "describe"}),
    ];
    let answers = match blocking(move || exchange(&plugin, &requests)).await {
        Some(Ok(a)) => a,
        Some(Err(e)) => return Finding::fail(e.to_string(), Value::Null),
        None => return Finding::fail("the exchange did not complete", Value::Null),
    };
    let mut problems: Vec<String> = answers.iter().flat_map(schema_errors).collect();
    if answers[1]["type"] != "error" || answers[1]["kind"] != "protocol" {
        problems.push(format!("the unknown request was answered {}", answers[1]));
    }
    if answers[2]["type"] != "descriptor" {
        problems.push(format!("the next request was answered {}", answers[2]));
    }
    Finding::require(
        problems.is_empty(),
        problems.join("; "),
        json!({ "answers": answers }),
    )
}

/// PROTO-004: the process a launch reports descends from the plugin and was verified as such
/// (the plugin does not reap it before agentdiff's `ack`).
pub async fn launched_is_a_descendant(ctx: Arc<Ctx>) -> Finding {
    if let Err(skip) = self::plugin(&ctx) {
        return skip;
    }
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let ran = match harness::run(backend.as_ref(), &scratch, &ctx.sh("sleep 1")).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let facts = ran
        .evidence
        .wrapper
        .as_ref()
        .map(|w| w.decode::<ExternalFacts>());
    let origin = match facts {
        Some(Ok(f)) => f.external_backend,
        Some(Err(e)) => {
            return Finding::fail(
                format!("the run's external_backend facts do not decode: {e}"),
                json!({ "wrapper": ran.evidence.wrapper.as_deref() }),
            )
        }
        None => return Finding::fail("the run recorded no external_backend facts", Value::Null),
    };
    Finding::require(
        origin.launched_process == Parentage::Verified,
        format!(
            "the launched process was not verified as the plugin's descendant: {:?}",
            origin.launched_process
        ),
        json!({ "external_backend": origin }),
    )
}

/// PROTO-005: a plugin killed while its command runs fails the run closed, and the command does
/// not outlive it.
pub async fn plugin_death_fails_closed(ctx: Arc<Ctx>) -> Finding {
    if let Err(skip) = self::plugin(&ctx) {
        return skip;
    }
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let inv = ctx.sh("sleep 60").timeout(Some(Duration::from_secs(90)));
    let started = match harness::start(backend.as_ref(), &scratch, &inv).await {
        Ok(s) => s,
        Err(stage) => return stage_failure(stage),
    };
    let Some(root) = started.running.launch_facts().root else {
        return Finding::fail("the launch recorded no process identity", Value::Null);
    };
    let Some(plugin_pid) = direct_child_ancestor(root.pid) else {
        let _ = started.finish().await;
        return Finding::fail(
            "the plugin process was not found above the command",
            Value::Null,
        );
    };
    // SAFETY: kill(2) on our own child, the plugin process.
    unsafe { libc::kill(plugin_pid as libc::pid_t, libc::SIGKILL) };
    let result = started.finish().await;
    let survived = (0..100).all(|_| {
        let alive = alive(&root);
        if alive {
            std::thread::sleep(Duration::from_millis(50));
        }
        alive
    });
    let details = json!({
        "plugin_pid": plugin_pid,
        "command_pid": root.pid,
        "run": match &result { Ok(_) => "completed".to_string(), Err(e) => e.to_string() },
    });
    match result {
        Ok(_) => Finding::fail("the run completed although its plugin was killed", details),
        Err(_) if survived => Finding::fail("the command outlived its plugin", details),
        Err(_) => Finding::pass(details),
    }
}

/// The ancestor of `pid` whose parent is this process (the plugin agentdiff started).
fn direct_child_ancestor(pid: u32) -> Option<u32> {
    let me = std::process::id();
    let mut current = pid;
    for _ in 0..64 {
        let stat = agentdiff_engine::process::read_stat(current).ok()?;
        if stat.ppid == me {
            return Some(current);
        }
        current = stat.ppid;
        if current <= 1 {
            return None;
        }
    }
    None
}

fn alive(id: &agentdiff_engine::backend::ProcessIdentity) -> bool {
    match agentdiff_engine::process::read_stat(id.pid) {
        Ok(s) => s.start_time_ticks == id.start_time_ticks && !s.is_zombie(),
        Err(_) => false,
    }
}
