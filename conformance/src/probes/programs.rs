//! The probe programs and how their outcome is judged from the host.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::DynRuntimeBackend;
use serde_json::json;

use super::{inconclusive, ProbeKind, ProbeOptions, ProbeResult, Verdict};
use crate::harness::{self, excerpt, Invocation, Ran, Scratch};
use crate::host;

pub(super) const RAN_MARKER: &str = "probe-ran";

pub(super) fn result(
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

pub(super) fn ran_marker_present(scratch: &Scratch) -> bool {
    scratch.work_file(RAN_MARKER).exists()
}

pub(super) fn run_facts(ran: &Ran) -> serde_json::Value {
    json!({
        "exit": ran.evidence.exit,
        "failure": ran.evidence.failure,
        "stdout": excerpt(&ran.stdout),
        "stderr": excerpt(&ran.stderr),
    })
}

pub(super) async fn run(
    backend: &dyn DynRuntimeBackend,
    kind: ProbeKind,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    match kind {
        ProbeKind::OutsideWrite => outside_write(backend, scratch, options).await,
        ProbeKind::OutsideRead => outside_read(backend, scratch, options).await,
        ProbeKind::HomeRead => home_read(backend, scratch, options).await,
        ProbeKind::HostLoopbackConnect => loopback(backend, scratch, options).await,
        ProbeKind::Environment => environment(backend, scratch, options).await,
        ProbeKind::Daemon => daemon(backend, scratch, options).await,
        ProbeKind::PidsLimit => pids(backend, scratch, options).await,
        ProbeKind::Privileges => privileges(backend, scratch, options).await,
        ProbeKind::HostTree => host_tree(backend, scratch, options).await,
        ProbeKind::EgressFiltered => super::egress::filtered(backend, scratch, options).await,
    }
}

pub(super) async fn launch(
    kind: ProbeKind,
    backend: &dyn DynRuntimeBackend,
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

/// Directories outside the root where the filesystem probes leave their files: next to the root
/// (the scratch directory, in `$TMPDIR`), `/var/tmp` and `$HOME`. The last two are outside
/// `$TMPDIR`, so a backend that only makes `/tmp` private cannot pass by hiding the scratch
/// directory.
fn outside_dirs(scratch: &Scratch) -> Vec<PathBuf> {
    let mut dirs = vec![scratch.outside.clone()];
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    for d in [Some(PathBuf::from("/var/tmp")), home]
        .into_iter()
        .flatten()
    {
        let d = d.canonicalize().unwrap_or(d);
        if d.is_dir() && !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

/// Files the probe created outside the root, removed when dropped (also on early returns), so a
/// probe never leaves anything in `/var/tmp` or the user's home.
struct Planted(Vec<PathBuf>);

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// One location of the outside-write probe.
struct WriteTarget {
    sentinel: PathBuf,
    new_file: PathBuf,
    before: Option<String>,
}

async fn outside_write(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::OutsideWrite;
    let token = host::random_token();
    let mut planted = Planted(Vec::new());
    let mut targets = Vec::new();
    let mut unusable = Vec::new();
    for dir in outside_dirs(scratch) {
        let sentinel = dir.join(format!(".agentdiff-probe-{token}-sentinel"));
        let new_file = dir.join(format!(".agentdiff-probe-{token}-new"));
        planted.0.push(new_file.clone());
        match std::fs::write(&sentinel, format!("sentinel {token}\n")) {
            Ok(()) => {
                planted.0.push(sentinel.clone());
                let before = host::file_digest(&sentinel);
                targets.push(WriteTarget {
                    sentinel,
                    new_file,
                    before,
                });
            }
            Err(e) => unusable.push(format!("{}: {e}", dir.display())),
        }
    }
    if targets.is_empty() {
        return inconclusive(
            kind,
            format!(
                "could not write a sentinel anywhere: {}",
                unusable.join("; ")
            ),
            json!(null),
        );
    }
    let script = format!(
        "echo ran > {RAN_MARKER}; for f in \"$@\"; do echo agentdiff-probe >> \"$f\"; done; exit 0"
    );
    let mut argv = vec![
        OsString::from("sh"),
        "-c".into(),
        script.into(),
        "sh".into(),
    ];
    for t in &targets {
        argv.push(t.sentinel.clone().into_os_string());
        argv.push(t.new_file.clone().into_os_string());
    }
    let ran = match launch(kind, backend, scratch, Invocation::new(argv), options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut reached = Vec::new();
    let locations: Vec<serde_json::Value> = targets
        .iter()
        .map(|t| {
            let after = host::file_digest(&t.sentinel);
            let created = t.new_file.exists();
            if after != t.before || created {
                reached.push(
                    t.sentinel
                        .parent()
                        .unwrap_or(Path::new(""))
                        .display()
                        .to_string(),
                );
            }
            json!({
                "sentinel": t.sentinel.display().to_string(),
                "sha256_before": t.before,
                "sha256_after": after,
                "new_file_created": created,
            })
        })
        .collect();
    let evidence = json!({
        "locations": locations,
        "locations_not_usable": unusable,
        "run": run_facts(&ran),
    });
    if !reached.is_empty() {
        return result(
            kind,
            Verdict::NotEnforced,
            format!(
                "a write outside the root reached the host in {}",
                reached.join(", ")
            ),
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
        format!(
            "writes outside the root were refused in {} location(s); every sentinel is unchanged",
            targets.len()
        ),
        evidence,
    )
}

/// `HOME` is a fresh directory with a canary at `~/.agentdiff-probe-secret` (on no allowlist)
/// and one at `~/.cargo/agentdiff-probe` (on bwrap's): the first must not be read.
async fn home_read(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::HomeRead;
    let home = match tempfile::Builder::new()
        .prefix("agentdiff-probe-home-")
        .tempdir_in(&scratch.outside)
    {
        Ok(h) => h,
        Err(e) => return inconclusive(kind, format!("no temporary home: {e}"), json!(null)),
    };
    let secret = format!("agentdiff-canary-{}", host::random_token());
    let listed = format!("agentdiff-canary-{}", host::random_token());
    let unlisted = home.path().join(".agentdiff-probe-secret");
    let allowed = home.path().join(".cargo/agentdiff-probe");
    let planted = std::fs::write(&unlisted, &secret)
        .and_then(|()| std::fs::create_dir_all(home.path().join(".cargo")))
        .and_then(|()| std::fs::write(&allowed, &listed));
    if let Err(e) = planted {
        return inconclusive(
            kind,
            format!("could not plant the canaries: {e}"),
            json!(null),
        );
    }
    let script = format!(
        "echo ran > {RAN_MARKER}; cat \"$HOME/.agentdiff-probe-secret\"; echo; \
         cat \"$HOME/.cargo/agentdiff-probe\"; exit 0"
    );
    let home_str = home.path().to_string_lossy().into_owned();
    let inv = Invocation::new(["sh", "-c", script.as_str()]).env("HOME", &home_str);
    let ran = match launch(kind, backend, scratch, inv, options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let out = ran.stdout_text();
    let evidence = json!({
        "home": home_str,
        "unlisted": unlisted.display().to_string(),
        "unlisted_read": out.contains(secret.as_str()),
        "allowlisted": allowed.display().to_string(),
        "allowlisted_read": out.contains(listed.as_str()),
        "exit": ran.evidence.exit,
        "stderr": excerpt(&ran.stderr),
    });
    if out.contains(secret.as_str()) {
        let why = format!(
            "a file in HOME on no allowlist was readable: {}",
            unlisted.display()
        );
        return result(kind, Verdict::NotEnforced, why, evidence);
    }
    if !ran_marker_present(scratch) {
        return inconclusive(kind, "the probe did not run".into(), evidence);
    }
    let summary = if out.contains(listed.as_str()) {
        "a file in HOME on no allowlist was unreadable; one in ~/.cargo was readable"
    } else {
        "a file in HOME on no allowlist was unreadable (so was one in ~/.cargo)"
    };
    result(kind, Verdict::Verified, summary, evidence)
}

async fn outside_read(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::OutsideRead;
    let token = host::random_token();
    let mut planted = Planted(Vec::new());
    let mut canaries = Vec::new();
    for dir in outside_dirs(scratch) {
        let canary = dir.join(format!(".agentdiff-probe-{token}-canary"));
        let secret = format!("agentdiff-canary-{}", host::random_token());
        if std::fs::write(&canary, &secret).is_ok() {
            planted.0.push(canary.clone());
            canaries.push((canary, secret));
        }
    }
    if canaries.is_empty() {
        return inconclusive(
            kind,
            "could not write a canary anywhere".into(),
            json!(null),
        );
    }
    let script =
        format!("echo ran > {RAN_MARKER}; for f in \"$@\"; do cat \"$f\"; echo; done; exit 0");
    let mut argv = vec![
        OsString::from("sh"),
        "-c".into(),
        script.into(),
        "sh".into(),
    ];
    argv.extend(canaries.iter().map(|(c, _)| c.clone().into_os_string()));
    let ran = match launch(kind, backend, scratch, Invocation::new(argv), options).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let out = ran.stdout_text();
    let read: Vec<String> = canaries
        .iter()
        .filter(|(_, secret)| out.contains(secret.as_str()))
        .map(|(c, _)| c.display().to_string())
        .collect();
    let evidence = json!({
        "canaries": canaries.iter().map(|(c, _)| c.display().to_string()).collect::<Vec<_>>(),
        "canaries_read": read,
        "exit": ran.evidence.exit,
        "stderr": excerpt(&ran.stderr),
    });
    if !read.is_empty() {
        return result(
            kind,
            Verdict::NotEnforced,
            format!(
                "a secret file outside the root was readable: {}",
                read.join(", ")
            ),
            evidence,
        );
    }
    if !ran_marker_present(scratch) {
        return inconclusive(kind, "the probe did not run".into(), evidence);
    }
    result(
        kind,
        Verdict::Verified,
        "no canary outside the root could be read",
        evidence,
    )
}

/// A non-loopback address of this host (the source address of the default route), found
/// without sending anything; `None` on a host without one.
pub(super) fn host_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // TEST-NET-1: connect() on UDP only selects a route and a source address.
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

async fn loopback(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let kind = ProbeKind::HostLoopbackConnect;
    // Listening on every address: the probe tries loopback and this host's own address, so a
    // sandbox that blocks only 127.0.0.1 is caught.
    let listener = match std::net::TcpListener::bind("0.0.0.0:0") {
        Ok(l) => l,
        Err(e) => {
            return inconclusive(
                kind,
                format!("could not open a host listener: {e}"),
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
    let mut addresses = vec!["127.0.0.1".to_string()];
    addresses.extend(host_address().map(|a| a.to_string()));
    // Accept in the background for as long as the probe runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_flag = std::sync::Arc::clone(&stop);
    let accepted = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut peers = Vec::new();
        while std::time::Instant::now() < deadline {
            if let Ok((_, peer)) = listener.accept() {
                peers.push(peer.to_string());
                continue;
            }
            if stop_flag.load(std::sync::atomic::Ordering::Relaxed) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        peers
    });
    let script = format!(
        "echo ran > {RAN_MARKER}; p=$1; shift; \
         if command -v nc >/dev/null 2>&1; then t=nc; \
         elif command -v bash >/dev/null 2>&1; then t=bash; \
         elif command -v python3 >/dev/null 2>&1; then t=python3; \
         elif command -v socat >/dev/null 2>&1; then t=socat; \
         else t=none; fi; echo tool=$t; \
         for a in \"$@\"; do case $t in \
           nc) echo agentdiff-probe | nc -w 2 $a $p;; \
           bash) bash -c \"echo agentdiff-probe > /dev/tcp/$a/$p\";; \
           python3) python3 -c \"import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 2)\" $a $p;; \
           socat) echo agentdiff-probe | socat - TCP:$a:$p,connect-timeout=2;; \
         esac; done; exit 0"
    );
    let mut argv = vec![
        OsString::from("sh"),
        "-c".into(),
        script.into(),
        "sh".into(),
        port.to_string().into(),
    ];
    argv.extend(addresses.iter().map(OsString::from));
    let ran = launch(kind, backend, scratch, Invocation::new(argv), options).await;
    // Give a connection that raced the command's exit a moment to be accepted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peers = tokio::task::spawn_blocking(move || accepted.join().unwrap_or_default())
        .await
        .unwrap_or_default();
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
        "listener": format!("0.0.0.0:{port}"),
        "addresses_tried": addresses,
        "connections_from": peers,
        "tool": tool,
        "run": run_facts(&ran),
    });
    if !peers.is_empty() {
        return result(
            kind,
            Verdict::NotEnforced,
            "the command connected to a listener on this host",
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
        format!(
            "no connection reached the host listener at {} (tried with {tool})",
            addresses.join(", ")
        ),
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
    backend: &dyn DynRuntimeBackend,
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
    // command line holds the full name the host searches for. The root's second begins once the
    // daemon has written its first heartbeat (at most 10 s): on a loaded machine the daemon may
    // start late, and a root that ended first had its tree cleaned up before the host saw it.
    let outer = format!(
        "echo ran > {RAN_MARKER}; ( sh -c \"$1\" \"agentdiff-probe-daemon-$2\" & ); \
         n=0; while [ ! -s probe-heartbeat ] && [ $n -lt 200 ]; do n=$((n+1)); sleep 0.05; done; \
         sleep 1; exit 0"
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
    backend: &dyn DynRuntimeBackend,
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
    backend: &dyn DynRuntimeBackend,
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
    backend: &dyn DynRuntimeBackend,
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
    backend: &dyn DynRuntimeBackend,
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
