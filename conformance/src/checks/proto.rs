//! Protocol checks for external backends (`PROTO-*`): the plugin executable is spoken to
//! directly, with requests agentdiff would never send, and killed in the middle of a run.
//! Skipped for a backend that is not an external one.

use std::sync::Arc;
use std::time::Duration;

use agentdiff_backend_api::protocol::{
    Request, Response, WireCommand, WireSpec, PROTOCOL_VERSION, PROTOCOL_VERSIONS,
};
use agentdiff_plugins::external::{
    verify_descendant, ExternalError, Parentage, Plugin, PluginStdio, Session,
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

/// agentdiff's own `hello`: the oldest version in `protocol`, every one in `protocols`.
fn client_hello() -> Value {
    json!({"type": "hello", "protocol": PROTOCOL_VERSIONS[0], "protocols": PROTOCOL_VERSIONS})
}

/// PROTO-001: agentdiff's `hello` is answered with a version it offered and the id of the file
/// name, and the descriptor is well formed.
pub async fn handshake(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    let id = plugin.id.clone();
    let requests = [client_hello(), json!({"type": "describe"})];
    let answers = match blocking(move || exchange(&plugin, &requests)).await {
        Some(Ok(a)) => a,
        Some(Err(e)) => return Finding::fail(e.to_string(), Value::Null),
        None => return Finding::fail("the exchange did not complete", Value::Null),
    };
    let mut problems: Vec<String> = answers.iter().flat_map(schema_errors).collect();
    let offered = PROTOCOL_VERSIONS
        .iter()
        .any(|v| answers[0]["protocol"] == json!(v));
    if answers[0]["type"] != "hello" || answers[0]["id"] != id.as_str() || !offered {
        problems.push(format!(
            "hello offering {PROTOCOL_VERSIONS:?} answered {}",
            answers[0]
        ));
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

/// PROTO-002: a `hello` with a version the plugin does not speak is refused, not served; and a
/// version-1 client's `hello` (no `protocols`) is never answered with another version.
pub async fn version_mismatch(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    if let Some(problem) = version_1_client(&plugin).await {
        return Finding::fail(problem, Value::Null);
    }
    let unsupported = PROTOCOL_VERSION + 998;
    let requests = [json!({"type": "hello", "protocol": unsupported, "protocols": [unsupported]})];
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

/// A plugin asked by a version-1 client (`{"protocol": 1}` alone) answers version 1 or refuses;
/// answering a version that was not offered is the problem returned.
async fn version_1_client(plugin: &Plugin) -> Option<String> {
    let plugin = plugin.clone();
    let requests = [json!({"type": "hello", "protocol": 1})];
    let answer = match blocking(move || exchange(&plugin, &requests)).await {
        Some(Ok(a)) => a.into_iter().next().unwrap_or(Value::Null),
        // A plugin that no longer speaks version 1 may refuse by closing the channel.
        _ => return None,
    };
    (answer["type"] == "hello" && answer["protocol"] != json!(1)).then(|| {
        format!("a hello offering only protocol 1 was answered with another version: {answer}")
    })
}

/// PROTO-003: an unknown request type is answered with an `error` of kind `protocol`, and the
/// plugin goes on answering.
pub async fn unknown_request(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    let requests = [
        client_hello(),
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

/// How long PROTO-004 waits between `launched` and its check: far longer than a backend that
/// reaps at once takes to do so.
const HOLD: Duration = Duration::from_millis(300);

/// PROTO-004: the process a launch reports descends from the plugin and is still there to be
/// verified: a command that ends at once is kept unreaped until agentdiff's `ack`. The suite
/// speaks the protocol itself and waits [`HOLD`] before its check, so a plugin that reaps early
/// fails every time, not only when agentdiff happens to be slow.
pub async fn launched_is_a_descendant(ctx: Arc<Ctx>) -> Finding {
    let plugin = match self::plugin(&ctx) {
        Ok(p) => p,
        Err(skip) => return skip,
    };
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let spec = harness::spec_for(&scratch, &ctx.sh("exit 0"), "conformance-proto-004");
    let prepared = match ctx.backend().prepare(&spec) {
        Ok(p) => p,
        Err(e) => return stage_failure(harness::Stage::Prepare(e)),
    };
    let launch = match (
        WireSpec::from_spec(prepared.spec()),
        WireCommand::from_command(prepared.command()),
    ) {
        (Ok(spec), Ok(command)) => Request::Launch { spec, command },
        (Err(e), _) | (_, Err(e)) => return Finding::fail(e.to_string(), Value::Null),
    };
    match blocking(move || launch_held(&plugin, &launch)).await {
        Some(Ok(held)) => {
            let mut problems = Vec::new();
            match held.parentage {
                Some(Parentage::Verified) => {}
                Some(Parentage::Ended) => problems.push(format!(
                    "pid {} was already reaped {HOLD:?} after `launched`, before any `ack`: it \
                     must stay unreaped (a zombie is fine) until `ack`",
                    held.pid
                )),
                None => problems.push(format!(
                    "pid {} is not the plugin's descendant with the reported start time",
                    held.pid
                )),
            }
            if !held.exited {
                problems.push("`exited` did not follow the `ack`".into());
            }
            Finding::require(
                problems.is_empty(),
                problems.join("; "),
                json!({ "pid": held.pid, "launched_process": held.parentage, "exited": held.exited }),
            )
        }
        Some(Err(e)) => Finding::fail(e.to_string(), Value::Null),
        None => Finding::fail("the exchange did not complete", Value::Null),
    }
}

/// What PROTO-004 saw of one launch.
struct Held {
    pid: u32,
    /// `None`: the pid is not the plugin's descendant (or has another start time).
    parentage: Option<Parentage>,
    exited: bool,
}

/// Launch, wait [`HOLD`], check the reported process, then `ack` and read `exited`.
fn launch_held(plugin: &Plugin, launch: &Request) -> Result<Held, ExternalError> {
    let mut session = Session::start(plugin, PluginStdio::Quiet)?;
    let answer = session
        .send(launch)
        .and_then(|()| session.receive(Some(ANSWER)));
    let (pid, start_time_ticks) = match answer {
        Ok(Response::Launched {
            pid,
            start_time_ticks,
        }) => (pid, start_time_ticks),
        Ok(other) => {
            let e = session.unexpected("launched", &other);
            session.kill();
            return Err(e);
        }
        Err(e) => {
            session.kill();
            return Err(e);
        }
    };
    std::thread::sleep(HOLD);
    let parentage = verify_descendant(pid, start_time_ticks, session.pid()).ok();
    let exited = session
        .acknowledge()
        .and_then(|()| session.receive(Some(ANSWER)))
        .is_ok_and(|r| matches!(r, Response::Exited { .. }));
    session.finish();
    Ok(Held {
        pid,
        parentage,
        exited,
    })
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
        let stat = agentdiff_process::read_stat(current).ok()?;
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

fn alive(id: &agentdiff_backend_api::ProcessIdentity) -> bool {
    match agentdiff_process::read_stat(id.pid) {
        Ok(s) => s.start_time_ticks == id.start_time_ticks && !s.is_zombie(),
        Err(_) => false,
    }
}
