//! The probe programs and how their outcome is judged from the host.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

use agentdiff_engine::backend::RuntimeBackend;
use serde_json::json;

use super::{inconclusive, ProbeKind, ProbeOptions, ProbeResult, Verdict};
use crate::harness::{self, excerpt, Invocation, Ran, Scratch};
use crate::host;

const RAN_MARKER: &str = "probe-ran";

fn result(
    kind: ProbeKind,
    verdict: Verdict,
    summary: impl Into<String>,
    evidence: serde_json::Value,
) -> ProbeResult {
    ProbeResult {
        probe: kind,
        boundary: kind.boundary(),
        verdict,
        summary: summary.into(),
        evidence,
    }
}

fn ran_marker_present(scratch: &Scratch) -> bool {
    scratch.work_file(RAN_MARKER).exists()
}

fn run_facts(ran: &Ran) -> serde_json::Value {
    json!({
        "exit": ran.evidence.exit,
        "failure": ran.evidence.failure,
        "stdout": excerpt(&ran.stdout),
        "stderr": excerpt(&ran.stderr),
    })
}

pub(super) async fn run(
    backend: &dyn RuntimeBackend,
    kind: ProbeKind,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    match kind {
        ProbeKind::OutsideWrite => outside_write(backend, scratch, options).await,
        ProbeKind::OutsideRead => outside_read(backend, scratch, options).await,
        ProbeKind::HostLoopbackConnect => loopback(backend, scratch, options).await,
        ProbeKind::Environment => environment(backend, scratch, options).await,
        ProbeKind::Daemon => daemon(backend, scratch, options).await,
        ProbeKind::PidsLimit => pids(backend, scratch, options).await,
        ProbeKind::Privileges => privileges(backend, scratch, options).await,
        ProbeKind::HostTree => host_tree(backend, scratch, options).await,
    }
}

async fn launch(
    kind: ProbeKind,
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    inv: Invocation,
    options: &ProbeOptions,
) -> Result<Ran, ProbeResult> {
    let inv = inv.options(&options.backend_options);
    match harness::run(backend, scratch, &inv).await {
        Ok(ran) => Ok(ran),
        Err(stage) => Err(inconclusive(
            kind,
            format!("the probe could not run: {stage}"),
            serde_json::Value::Null,
        )),
    }
}

async fn outside_write(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::OutsideWrite;
    let sentinel = scratch.outside.join("sentinel");
    let sibling = scratch.outside.join("sentinel-new");
    if let Err(e) = std::fs::write(&sentinel, format!("sentinel {}\n", host::random_token())) {
        return inconclusive(
            kind,
            format!("could not write the sentinel: {e}"),
            json!(null),
        );
    }
    let before = host::file_digest(&sentinel);
    let script = format!(
        "echo ran > {RAN_MARKER}; echo agentdiff-probe >> \"$1\"; echo agentdiff-probe > \"$2\"; exit 0"
    );
    let inv = Invocation::new([
        OsString::from("sh"),
        "-c".into(),
        script.into(),
        "sh".into(),
        sentinel.clone().into_os_string(),
        sibling.clone().into_os_string(),
    ]);
    let ran = match launch(kind, backend, scratch, inv, options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let after = host::file_digest(&sentinel);
    let evidence = json!({
        "sentinel": sentinel.display().to_string(),
        "sha256_before": before,
        "sha256_after": after,
        "new_file_outside_created": sibling.exists(),
        "run": run_facts(&ran),
    });
    if before != after || sibling.exists() {
        return result(
            kind,
            Verdict::NotEnforced,
            "a write outside the root reached the host",
            evidence,
        );
    }
    if !ran_marker_present(scratch) {
        return inconclusive(
            kind,
            "the probe did not run (no marker in the working directory)".into(),
            evidence,
        );
    }
    result(
        kind,
        Verdict::Verified,
        "the write outside the root was refused; the sentinel is unchanged",
        evidence,
    )
}

async fn outside_read(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::OutsideRead;
    let canary = scratch.outside.join("canary-secret");
    let secret = format!("agentdiff-canary-{}", host::random_token());
    if let Err(e) = std::fs::write(&canary, &secret) {
        return inconclusive(
            kind,
            format!("could not write the canary: {e}"),
            json!(null),
        );
    }
    let script = format!("echo ran > {RAN_MARKER}; cat \"$1\"; exit 0");
    let inv = Invocation::new([
        OsString::from("sh"),
        "-c".into(),
        script.into(),
        "sh".into(),
        canary.clone().into_os_string(),
    ]);
    let ran = match launch(kind, backend, scratch, inv, options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let leaked = ran.stdout_text().contains(&secret);
    let evidence = json!({
        "canary": canary.display().to_string(),
        "canary_read": leaked,
        "exit": ran.evidence.exit,
        "stderr": excerpt(&ran.stderr),
    });
    if leaked {
        return result(
            kind,
            Verdict::NotEnforced,
            "a secret file outside the root was readable",
            evidence,
        );
    }
    if !ran_marker_present(scratch) {
        return inconclusive(kind, "the probe did not run".into(), evidence);
    }
    result(
        kind,
        Verdict::Verified,
        "the canary outside the root could not be read",
        evidence,
    )
}

async fn loopback(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::HostLoopbackConnect;
    let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => {
            return inconclusive(
                kind,
                format!("could not open a loopback listener: {e}"),
                json!(null),
            )
        }
    };
    let port = match listener.local_addr() {
        Ok(a) => a.port(),
        Err(e) => return inconclusive(kind, format!("listener address: {e}"), json!(null)),
    };
    if let Err(e) = listener.set_nonblocking(true) {
        return inconclusive(kind, format!("listener: {e}"), json!(null));
    }
    // Accept in the background for as long as the probe runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_flag = std::sync::Arc::clone(&stop);
    let accepted = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < deadline {
            if let Ok((_, peer)) = listener.accept() {
                return Some(peer.to_string());
            }
            if stop_flag.load(std::sync::atomic::Ordering::Relaxed) {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    });
    let script = format!(
        "echo ran > {RAN_MARKER}; p=$1; \
         if command -v nc >/dev/null 2>&1; then echo tool=nc; echo agentdiff-probe | nc -w 2 127.0.0.1 $p; \
         elif command -v bash >/dev/null 2>&1; then echo tool=bash; bash -c \"echo agentdiff-probe > /dev/tcp/127.0.0.1/$p\"; \
         elif command -v python3 >/dev/null 2>&1; then echo tool=python3; python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 2)\" $p; \
         elif command -v socat >/dev/null 2>&1; then echo tool=socat; echo agentdiff-probe | socat - TCP:127.0.0.1:$p,connect-timeout=2; \
         else echo tool=none; fi; exit 0"
    );
    let inv = Invocation::new([
        OsString::from("sh"),
        "-c".into(),
        script.into(),
        "sh".into(),
        port.to_string().into(),
    ]);
    let ran = launch(kind, backend, scratch, inv, options).await;
    // Give a connection that raced the command's exit a moment to be accepted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peer = tokio::task::spawn_blocking(move || accepted.join().ok().flatten())
        .await
        .ok()
        .flatten();
    let ran = match ran {
        Ok(r) => r,
        Err(r) => return r,
    };
    let out = ran.stdout_text();
    let tool = out
        .lines()
        .find_map(|l| l.strip_prefix("tool="))
        .unwrap_or("unknown")
        .to_string();
    let evidence = json!({
        "listener": format!("127.0.0.1:{port}"),
        "connection_from": peer,
        "tool": tool,
        "run": run_facts(&ran),
    });
    if peer.is_some() {
        return result(
            kind,
            Verdict::NotEnforced,
            "the command connected to a host loopback listener",
            evidence,
        );
    }
    if !ran_marker_present(scratch) || tool == "unknown" {
        return inconclusive(kind, "the probe did not run".into(), evidence);
    }
    if tool == "none" {
        return inconclusive(
            kind,
            "no tool (nc, bash, python3, socat) to attempt a connection with".into(),
            evidence,
        );
    }
    result(
        kind,
        Verdict::Verified,
        format!("no connection reached the host listener (tried with {tool})"),
        evidence,
    )
}

/// Names a runtime sets by itself; their values matching the host's prove nothing.
const SELF_SET: &[&str] = &[
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    "HOME",
    "HOSTNAME",
    "TERM",
    "USER",
    "LOGNAME",
    "container",
];

async fn environment(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::Environment;
    let canary = format!("agentdiff-env-canary-{}", host::random_token());
    let inv = Invocation::new(["cat", "/proc/self/environ"]).env("AGENTDIFF_PROBE_CANARY", &canary);
    let ran = match launch(kind, backend, scratch, inv.clone(), options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let seen: BTreeMap<Vec<u8>, Vec<u8>> = harness::split_nul(&ran.stdout)
        .into_iter()
        .filter_map(|kv| {
            let i = kv.iter().position(|b| *b == b'=')?;
            Some((kv[..i].to_vec(), kv[i + 1..].to_vec()))
        })
        .collect();
    let given: Vec<Vec<u8>> = harness::base_env(&inv.env)
        .iter()
        .map(|(k, _)| k.as_encoded_bytes().to_vec())
        .collect();
    let leaked: Vec<String> = std::env::vars_os()
        .filter(|(k, v)| {
            let name = k.as_encoded_bytes().to_vec();
            !given.contains(&name)
                && !SELF_SET.iter().any(|s| s.as_bytes() == name.as_slice())
                && !v.is_empty()
                && seen
                    .get(&name)
                    .is_some_and(|sv| sv.as_slice() == v.as_encoded_bytes())
        })
        .map(|(k, _)| k.to_string_lossy().into_owned())
        .collect();
    let canary_seen = seen
        .get(b"AGENTDIFF_PROBE_CANARY".as_slice())
        .is_some_and(|v| v.as_slice() == canary.as_bytes());
    let evidence = json!({
        "canary_delivered": canary_seen,
        "host_variables_leaked": leaked,
        "variables_seen": seen.keys().map(|k| String::from_utf8_lossy(k).into_owned()).collect::<Vec<_>>(),
        "exit": ran.evidence.exit,
        "stderr": excerpt(&ran.stderr),
    });
    if seen.is_empty() {
        return inconclusive(kind, "the probe printed no environment".into(), evidence);
    }
    if !leaked.is_empty() {
        return result(
            kind,
            Verdict::NotEnforced,
            format!("host variables reached the command: {}", leaked.join(", ")),
            evidence,
        );
    }
    if !canary_seen {
        // Withholding even the given variables is a stricter filter, not a leak.
        return result(
            kind,
            Verdict::Verified,
            "no host variable reached the command (the backend also withheld the given canary)",
            evidence,
        );
    }
    result(
        kind,
        Verdict::Verified,
        "the command saw the given environment and nothing of the host's own",
        evidence,
    )
}

/// The daemon probe's programs: a grandchild that detaches and writes a heartbeat into the
/// working directory every 0.2 s (for at most 30 s, so a probe never leaves it forever).
pub(crate) fn daemon_invocation(token: &str) -> Invocation {
    let inner =
        "i=0; while [ $i -lt 150 ]; do i=$((i+1)); echo $i > probe-heartbeat; sleep 0.2; done";
    // The root only carries the token; the daemon's $0 is built inside, so only the daemon's
    // command line holds the full name the host searches for.
    let outer = format!(
        "echo ran > {RAN_MARKER}; ( sh -c \"$1\" \"agentdiff-probe-daemon-$2\" & ); sleep 1; exit 0"
    );
    Invocation::new([
        "sh".to_string(),
        "-c".into(),
        outer,
        "sh".into(),
        inner.into(),
        token.to_string(),
    ])
}

/// Whether the heartbeat file still changes over `window`.
pub(crate) async fn heartbeat_alive(path: &Path, window: Duration) -> bool {
    let first = std::fs::read(path).ok();
    tokio::time::sleep(window).await;
    let second = std::fs::read(path).ok();
    first != second
}

/// Kill whatever is left of a daemon probe (found by its token), so a failed probe does not
/// leave it running.
pub(crate) fn reap_daemon(token: &str) -> usize {
    let left = host::find_by_cmdline(&format!("agentdiff-probe-daemon-{token}"));
    for id in &left {
        let _ = host::signal_identity(id, 9);
    }
    left.len()
}

async fn daemon(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::Daemon;
    let token = host::random_token();
    let inv = daemon_invocation(&token);
    let ran = match launch(kind, backend, scratch, inv, options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let hb = scratch.work_file("probe-heartbeat");
    let started = hb.exists();
    let alive = started && heartbeat_alive(&hb, Duration::from_millis(1200)).await;
    let reaped = reap_daemon(&token);
    let evidence = json!({
        "heartbeat_seen": started,
        "alive_after_wait": alive,
        "left_running_and_reaped_by_probe": reaped,
        "cleanup": ran.evidence.cleanup,
        "run": run_facts(&ran),
    });
    if alive {
        return result(
            kind,
            Verdict::NotEnforced,
            "a daemonised grandchild outlived the command",
            evidence,
        );
    }
    if !started {
        return inconclusive(
            kind,
            "the daemon never started (no heartbeat)".into(),
            evidence,
        );
    }
    result(
        kind,
        Verdict::Verified,
        "the daemonised grandchild was ended with the command",
        evidence,
    )
}

async fn pids(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::PidsLimit;
    let n = options.pids_attempts.max(2);
    let script = format!(
        "echo ran > {RAN_MARKER}; i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo $i > probe-count; sleep 5 & done; echo all-started; exit 0"
    );
    let inv = Invocation::sh(&script).timeout(Some(Duration::from_secs(30)));
    let ran = match launch(kind, backend, scratch, inv, options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let count: u32 = std::fs::read_to_string(scratch.work_file("probe-count"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    let all = ran.stdout_text().contains("all-started");
    let evidence = json!({
        "attempted": n,
        "reached": count,
        "all_started": all,
        "run": run_facts(&ran),
    });
    if !ran_marker_present(scratch) {
        return inconclusive(kind, "the probe did not run".into(), evidence);
    }
    if all && count >= n {
        return result(
            kind,
            Verdict::NotEnforced,
            format!("{n} processes started without hitting a limit"),
            evidence,
        );
    }
    result(
        kind,
        Verdict::Verified,
        format!("process creation was refused after {count} of {n}"),
        evidence,
    )
}

async fn privileges(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::Privileges;
    let inv = Invocation::new(["cat", "/proc/self/status"]);
    let ran = match launch(kind, backend, scratch, inv, options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let text = ran.stdout_text();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_string())
    };
    let cap_eff = field("CapEff:");
    let evidence = json!({
        "CapEff": cap_eff,
        "NoNewPrivs": field("NoNewPrivs:"),
        "Uid": field("Uid:"),
        "exit": ran.evidence.exit,
    });
    match cap_eff {
        None => inconclusive(
            kind,
            "the probe could not read its own status".into(),
            evidence,
        ),
        Some(c) if u64::from_str_radix(&c, 16).is_ok_and(|v| v == 0) => result(
            kind,
            Verdict::Verified,
            "the command holds no effective capabilities",
            evidence,
        ),
        Some(c) => result(
            kind,
            Verdict::NotEnforced,
            format!("the command holds effective capabilities {c}"),
            evidence,
        ),
    }
}

/// Regular files below `root` → SHA-256 (directories as `dir`, symlinks as their target).
pub(crate) fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p
                .strip_prefix(base)
                .map(|r| r.display().to_string())
                .unwrap_or_default();
            match e.file_type() {
                Ok(t) if t.is_symlink() => {
                    let target = std::fs::read_link(&p)
                        .map(|t| t.display().to_string())
                        .unwrap_or_default();
                    out.insert(rel, format!("symlink:{target}"));
                }
                Ok(t) if t.is_dir() => {
                    out.insert(rel, "dir".into());
                    walk(base, &p, out);
                }
                Ok(_) => {
                    out.insert(
                        rel,
                        host::file_digest(&p).unwrap_or_else(|| "unreadable".into()),
                    );
                }
                Err(_) => {}
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

async fn host_tree(
    backend: &dyn RuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::HostTree;
    for (name, body) in [
        ("keep.txt", "keep\n"),
        ("edit.txt", "before\n"),
        ("remove.txt", "remove\n"),
    ] {
        if let Err(e) = scratch.seed_file(name, body.as_bytes()) {
            return inconclusive(kind, format!("could not seed the tree: {e}"), json!(null));
        }
    }
    let before = snapshot(&scratch.root);
    let script = format!(
        "echo ran > {RAN_MARKER}; echo after > edit.txt; rm -f remove.txt; echo new > created.txt; mkdir -p newdir; exit 0"
    );
    let ran = match launch(kind, backend, scratch, Invocation::sh(&script), options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let after = snapshot(&scratch.root);
    let changed: Vec<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    let evidence = json!({
        "host_root": scratch.root.display().to_string(),
        "workdir": scratch.workdir.display().to_string(),
        "changed_on_host": changed,
        "run": run_facts(&ran),
    });
    if !changed.is_empty() {
        return result(
            kind,
            Verdict::NotEnforced,
            "the host project tree changed",
            evidence,
        );
    }
    if !ran_marker_present(scratch) {
        return inconclusive(
            kind,
            "the probe did not run in its working directory".into(),
            evidence,
        );
    }
    result(
        kind,
        Verdict::Verified,
        "the command's changes stayed in its private workspace",
        evidence,
    )
}
