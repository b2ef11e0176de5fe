//! A small launcher for the local backend, used by its integration tests (terminal behaviour
//! under tmux, stdout routing) where the test must observe a separate process with its own
//! terminal and signal handling.
//!
//! `agentdiff-local-harness [--evidence FILE] [--stdout-to-stderr] [--timeout-ms N]
//!  [--grace-ms N] [--tracking auto|cgroup|proc_poll] [--observe-ports] -- PROGRAM ARGS...`
//!
//! SIGINT and SIGTERM received by the harness are handed to the backend as an interruption, as
//! `agentdiff run` does. The evidence is written as JSON to FILE; the exit code is the command's
//! (128 + signal when it was killed by one).

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use agentdiff_backend_api::{BackendOptions, LaunchContext, LaunchSpec, RuntimeBackend, StdioMode};
use agentdiff_backend_local::LocalBackend;

struct Args {
    evidence: Option<std::path::PathBuf>,
    stdout_to_stderr: bool,
    timeout: Option<Duration>,
    grace: Duration,
    tracking: Option<String>,
    observe_ports: bool,
    argv: Vec<OsString>,
}

fn parse() -> Result<Args, String> {
    let mut it = std::env::args_os().skip(1);
    let mut a = Args {
        evidence: None,
        stdout_to_stderr: false,
        timeout: None,
        grace: Duration::from_secs(2),
        tracking: None,
        observe_ports: false,
        argv: Vec::new(),
    };
    let ms = |v: Option<OsString>| -> Result<Duration, String> {
        v.and_then(|s| s.to_str().and_then(|s| s.parse::<u64>().ok()))
            .map(Duration::from_millis)
            .ok_or_else(|| "expected milliseconds".to_string())
    };
    while let Some(arg) = it.next() {
        match arg.to_str() {
            Some("--evidence") => a.evidence = it.next().map(Into::into),
            Some("--stdout-to-stderr") => a.stdout_to_stderr = true,
            Some("--timeout-ms") => a.timeout = Some(ms(it.next())?),
            Some("--grace-ms") => a.grace = ms(it.next())?,
            Some("--tracking") => a.tracking = it.next().map(|s| s.to_string_lossy().into_owned()),
            Some("--observe-ports") => a.observe_ports = true,
            Some("--") => {
                a.argv = it.collect();
                break;
            }
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    if a.argv.is_empty() {
        return Err("no command given after --".into());
    }
    Ok(a)
}

async fn run(a: Args) -> Result<ExitCode, String> {
    use tokio::signal::unix::{signal, SignalKind};
    let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
    let mut options = BackendOptions::new();
    if let Some(t) = &a.tracking {
        options.push("tracking", t.clone());
    }
    let spec = LaunchSpec {
        run_id: "harness".into(),
        root: cwd.clone(),
        workdir: cwd.clone(),
        capsule_dir: cwd.join(".agentdiff"),
        argv: a.argv,
        env: std::env::vars_os().collect(),
        env_plan: Default::default(),
        timeout: a.timeout,
        grace: a.grace,
        poll_interval: Duration::from_millis(10),
        observe_ports: a.observe_ports,
        options,
        deny_patterns: Vec::new(),
        git_dirs: Vec::new(),
        egress_proxy: None,
    };
    let backend = LocalBackend::new();
    let prepared = backend.prepare(&spec).map_err(|e| e.to_string())?;
    let (tx, rx) = tokio::sync::watch::channel(None);
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        let sig = tokio::select! {
            _ = int.recv() => libc::SIGINT,
            _ = term.recv() => libc::SIGTERM,
        };
        let _ = tx.send(Some(sig));
        // Keep the sender alive so the receiver keeps the value.
        std::future::pending::<()>().await;
    });
    let ctx = LaunchContext {
        stdio: if a.stdout_to_stderr {
            StdioMode::StdoutToStderr
        } else {
            StdioMode::Inherit
        },
        interrupt: rx,
        hold_reap: None,
        hold_start: false,
    };
    let running = backend
        .launch(prepared, ctx)
        .await
        .map_err(|e| e.to_string())?;
    let ev = running.wait().await.map_err(|e| e.to_string())?;
    if let Some(path) = &a.evidence {
        let json = serde_json::to_vec_pretty(&ev).map_err(|e| e.to_string())?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, json).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, path).map_err(|e| e.to_string())?;
    }
    let code = match (ev.exit.code, ev.exit.signal) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 70,
    };
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agentdiff-local-harness: {e}");
            return ExitCode::from(64);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentdiff-local-harness: {e}");
            return ExitCode::from(70);
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentdiff-local-harness: {e}");
            ExitCode::from(70)
        }
    }
}
