//! Containers a container engine created while a run was going on.
//!
//! A command can ask a daemon (docker, or podman's API service) to start a container: the
//! container's processes are then the daemon's, not the command's, and process tracking alone
//! sees at most a client and a monitor (`conmon`). When an engine API socket is reachable, the
//! engine's event log is read for the run window and every container created in it is recorded
//! with its image, command, and whether it was still running when the command ended and after
//! cleanup. A container is `attributed` when its monitor (`conmon`) or its main process was one
//! of the run's tracked processes; otherwise it is a machine-wide observation: started during the
//! run, by someone.
//!
//! Invariants:
//! - Sockets are found from `DOCKER_HOST` (agentdiff's and the command's, `unix://` only) and the
//!   usual paths; a socket counts only when `GET /_ping` answers `OK`. No socket is created and no
//!   engine is started.
//! - The HTTP/1.1 client is deliberately small: one request per connection (`Connection: close`),
//!   at most [`MAX_RESPONSE_BYTES`] read per response; `Content-Length`, chunked and read-to-close
//!   bodies are understood.
//! - Bounded in time: every request shares the deadline of its phase (discovery, the observation
//!   at the end of the command, the check after cleanup), a deadline no read or write outlives,
//!   so an engine that accepts and never answers, or answers a byte at a time, costs a run at most
//!   [`OBSERVE_BUDGET`] per phase; the phase then reports the engine as not answering. A socket
//!   that did not answer discovery is not asked again at the end.
//! - Containers are never stopped here without a request: [`stop_recorded`] stops a recorded
//!   container by id only after the engine confirms its creation time lies inside the recorded
//!   run window.
//!
//! Not defended: a `connect` to a socket whose listener never accepts and whose backlog is full
//! blocks the phase's worker thread; the run stops waiting for it at the deadline (the thread is
//! left behind). A container created and removed within the run on an engine whose socket is not
//! reachable (for example podman used without its API service) is not seen; the evidence's
//! `note` names installed engine clients with no reachable socket. The engine's own clock and
//! event log are trusted.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use agentdiff_host::system::find_program;

/// Upper bound of one response body.
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// Time one observation phase may take, whatever the engine does.
pub const OBSERVE_BUDGET: Duration = Duration::from_secs(2);
/// Containers recorded per run; the rest is counted.
pub const MAX_CONTAINERS: usize = 256;

/// Errors of the engine client.
#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("{socket}: {source}")]
    Io {
        socket: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{socket}: {problem}")]
    Protocol {
        socket: String,
        #[source]
        problem: ProtocolError,
    },
    #[error("{socket}: the engine did not answer within {budget:?}")]
    TimedOut { socket: String, budget: Duration },
    #[error("{socket}: the engine answered {status} to {path}")]
    Status {
        socket: String,
        path: String,
        status: u16,
    },
}

pub use agentdiff_backend_api::containers::{
    ContainerEvidence, ContainerRecord, ContainerStop, EngineReach, EngineRecord, HiddenSocket,
    Observation,
};

/// Why the engines must be queried after all: a candidate socket that exists now and is not
/// one the backend hid, as it was when hidden. `None`: every existing candidate is covered.
fn uncovered_socket(candidates: &[PathBuf], hidden: &[HiddenSocket]) -> Option<String> {
    candidates.iter().find_map(|c| {
        let now = HiddenSocket::of(c)?;
        match hidden.iter().find(|h| h.path == now.path) {
            Some(h) if *h == now => None,
            Some(_) => Some(format!(
                "{} was replaced during the run (a new socket is not covered by the sandbox's \
                 mount)",
                c.display()
            )),
            None => Some(format!(
                "{} exists but was not hidden from the command (it appeared after the launch was \
                 planned, or the backend did not cover it)",
                c.display()
            )),
        }
    })
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

// ---- a minimal HTTP/1.1 client over a Unix socket ----

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn request(
    socket: &Path,
    method: &str,
    path: &str,
    deadline: Instant,
) -> Result<Response, ContainerError> {
    let shown = socket.display().to_string();
    let io = |source| ContainerError::Io {
        socket: shown.clone(),
        source,
    };
    let timed_out = || ContainerError::TimedOut {
        socket: shown.clone(),
        budget: OBSERVE_BUDGET,
    };
    // Each read or write waits at most until the phase's deadline.
    let until_deadline = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
    };
    let Some(left) = until_deadline() else {
        return Err(timed_out());
    };
    let mut s = UnixStream::connect(socket).map_err(io)?;
    s.set_write_timeout(Some(left)).map_err(io)?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: d\r\nUser-Agent: agentdiff\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => timed_out(),
        _ => io(e),
    })?;
    let limit = MAX_RESPONSE_BYTES + 64 * 1024;
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while raw.len() < limit {
        let Some(left) = until_deadline() else {
            return Err(timed_out());
        };
        s.set_read_timeout(Some(left)).map_err(io)?;
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&chunk[..n.min(limit - raw.len())]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(timed_out())
            }
            Err(e) => return Err(io(e)),
        }
    }
    parse_response(&raw).map_err(|problem| ContainerError::Protocol {
        socket: shown,
        problem,
    })
}

/// Why an engine's HTTP answer cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("no end of the response headers")]
    NoHeaderEnd,
    #[error("response headers are not UTF-8")]
    HeadersNotUtf8,
    #[error("bad status line `{0}`")]
    StatusLine(String),
    #[error("a body shorter than Content-Length")]
    ShortBody,
    #[error("a response over {MAX_RESPONSE_BYTES} bytes")]
    TooLarge,
    #[error("bad chunk size `{0}`")]
    ChunkSize(String),
    #[error("{path}: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

fn parse_response(raw: &[u8]) -> Result<Response, ProtocolError> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or(ProtocolError::NoHeaderEnd)?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| ProtocolError::HeadersNotUtf8)?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| ProtocolError::StatusLine(status_line.to_string()))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut r = Response {
        status,
        headers,
        body: Vec::new(),
    };
    let rest = &raw[end + 4..];
    r.body = if r
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        dechunk(rest)?
    } else if let Some(len) = r
        .header("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        rest.get(..len).ok_or(ProtocolError::ShortBody)?.to_vec()
    } else {
        rest.to_vec()
    };
    if r.body.len() > MAX_RESPONSE_BYTES {
        return Err(ProtocolError::TooLarge);
    }
    Ok(r)
}

fn dechunk(mut b: &[u8]) -> Result<Vec<u8>, ProtocolError> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            // A stream cut at the size bound or by the engine: keep what arrived whole.
            return Ok(out);
        };
        let size_text = String::from_utf8_lossy(&b[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| ProtocolError::ChunkSize(size_text.to_string()))?;
        if size == 0 {
            return Ok(out);
        }
        let start = eol + 2;
        let Some(chunk) = b.get(start..start + size) else {
            return Ok(out);
        };
        out.extend_from_slice(chunk);
        b = b.get(start + size + 2..).unwrap_or_default();
    }
}

fn get_json(
    socket: &Path,
    path: &str,
    deadline: Instant,
) -> Result<Option<serde_json::Value>, ContainerError> {
    let r = request(socket, "GET", path, deadline)?;
    if r.status == 404 {
        return Ok(None);
    }
    if r.status != 200 {
        return Err(ContainerError::Status {
            socket: socket.display().to_string(),
            path: path.into(),
            status: r.status,
        });
    }
    serde_json::from_slice(&r.body)
        .map(Some)
        .map_err(|source| ContainerError::Protocol {
            socket: socket.display().to_string(),
            problem: ProtocolError::Json {
                path: path.to_string(),
                source,
            },
        })
}

// ---- discovery ----

/// Candidate sockets: `DOCKER_HOST` values first (agentdiff's, then the command's), then the
/// usual places.
pub fn candidate_sockets(command_env: &[(std::ffi::OsString, std::ffi::OsString)]) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut hosts: Vec<String> = std::env::var("DOCKER_HOST").into_iter().collect();
    hosts.extend(
        command_env
            .iter()
            .filter(|(k, _)| k == "DOCKER_HOST")
            .map(|(_, v)| v.to_string_lossy().into_owned()),
    );
    for h in hosts {
        if let Some(p) = h.strip_prefix("unix://") {
            out.push(PathBuf::from(p));
        }
    }
    for p in [
        "/run/podman/podman.sock",
        "/var/run/docker.sock",
        "/run/docker.sock",
    ] {
        out.push(PathBuf::from(p));
    }
    // SAFETY: getuid(2) cannot fail.
    let uid = unsafe { libc::getuid() };
    out.push(PathBuf::from(format!("/run/user/{uid}/podman/podman.sock")));
    out.push(PathBuf::from(format!("/run/user/{uid}/docker.sock")));
    let mut seen = std::collections::HashSet::new();
    out.retain(|p| {
        let key = agentdiff_host::system::canonical_if_present(p).unwrap_or_else(|_| p.clone());
        seen.insert(key)
    });
    out
}

/// `Ok(None)`: something answered, but not an engine.
fn ping(socket: &Path, deadline: Instant) -> Result<Option<EngineRecord>, ContainerError> {
    let r = request(socket, "GET", "/_ping", deadline)?;
    if r.status != 200 || r.body.trim_ascii() != b"OK" {
        return Ok(None);
    }
    let kind = if r.header("libpod-api-version").is_some() {
        "podman"
    } else {
        "docker"
    };
    Ok(Some(EngineRecord {
        socket: socket.display().to_string(),
        kind: kind.into(),
    }))
}

// ---- observation ----

fn created_ids(
    engine: &EngineRecord,
    since_ns: u64,
    until_ns: u64,
    deadline: Instant,
) -> Result<Vec<(String, serde_json::Value)>, ContainerError> {
    let socket = Path::new(&engine.socket);
    let since_s = since_ns / 1_000_000_000;
    let filters = "%7B%22type%22%3A%5B%22container%22%5D%2C%22event%22%3A%5B%22create%22%5D%7D";
    // podman's compatible API returns past events and closes with `stream=false` (its `until` in
    // the past returns nothing in 4.x); docker closes once `until` has passed.
    let path = if engine.kind == "podman" {
        format!("/events?since={since_s}&stream=false&filters={filters}")
    } else {
        let now = now_ns();
        format!(
            "/events?since={since_s}&until={}.{:09}&filters={filters}",
            now / 1_000_000_000,
            now % 1_000_000_000
        )
    };
    let r = request(socket, "GET", &path, deadline)?;
    if r.status != 200 {
        return Err(ContainerError::Status {
            socket: engine.socket.clone(),
            path,
            status: r.status,
        });
    }
    let mut out: Vec<(String, serde_json::Value)> = Vec::new();
    for line in r.body.split(|b| *b == b'\n') {
        let Ok(ev) = serde_json::from_slice::<serde_json::Value>(line) else {
            continue;
        };
        let action = ev["Action"]
            .as_str()
            .or(ev["status"].as_str())
            .unwrap_or("");
        if ev["Type"].as_str() != Some("container") || action != "create" {
            continue;
        }
        let t = ev["timeNano"].as_u64().unwrap_or(0);
        if t < since_ns || t > until_ns {
            continue;
        }
        let id = ev["Actor"]["ID"]
            .as_str()
            .or(ev["id"].as_str())
            .unwrap_or("");
        if !id.is_empty() && !out.iter().any(|(i, _)| i == id) {
            out.push((id.to_string(), ev));
        }
    }
    Ok(out)
}

fn str_list(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

fn record(
    engine: &EngineRecord,
    id: &str,
    event: &serde_json::Value,
    run_pids: &[u32],
    deadline: Instant,
) -> Result<ContainerRecord, ContainerError> {
    let socket = Path::new(&engine.socket);
    let attrs = &event["Actor"]["Attributes"];
    let mut rec = ContainerRecord {
        id: id.to_string(),
        socket: engine.socket.clone(),
        name: attrs["name"].as_str().unwrap_or("").to_string(),
        image: attrs["image"].as_str().unwrap_or("").to_string(),
        command: Vec::new(),
        created: String::new(),
        attributed: false,
        main_pid: 0,
        running_at_end: false,
        running_after_cleanup: false,
        removed: true,
    };
    let Some(c) = get_json(socket, &format!("/containers/{id}/json"), deadline)? else {
        return Ok(rec);
    };
    rec.removed = false;
    rec.name = c["Name"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches('/')
        .to_string();
    if let Some(img) = c["Config"]["Image"].as_str().filter(|s| !s.is_empty()) {
        rec.image = img.to_string();
    }
    let mut command = vec![c["Path"].as_str().unwrap_or("").to_string()];
    command.extend(str_list(&c["Args"]));
    command.retain(|s| !s.is_empty());
    rec.command = agentdiff_host::redact::redact_argv_deep(&command);
    rec.created = c["Created"].as_str().unwrap_or("").to_string();
    rec.running_at_end = c["State"]["Running"].as_bool().unwrap_or(false);
    let pid_of = |k: &str| c["State"][k].as_u64().map(|p| p as u32).filter(|p| *p > 0);
    rec.main_pid = pid_of("Pid").unwrap_or(0);
    rec.attributed = [pid_of("ConmonPid"), pid_of("Pid")]
        .into_iter()
        .flatten()
        .any(|p| run_pids.contains(&p));
    Ok(rec)
}

/// Read the containers created in `[since_ns, now]` on `engines`. `run_pids` are the run's
/// tracked pids (for attribution).
fn observe_engines(
    since_ns: u64,
    engines: Vec<EngineRecord>,
    run_pids: &[u32],
    deadline: Instant,
) -> ContainerEvidence {
    let until_ns = now_ns();
    let mut ev = ContainerEvidence {
        since_ns,
        until_ns,
        note: note_for(&engines),
        ..ContainerEvidence::default()
    };
    for engine in &engines {
        match created_ids(engine, since_ns, until_ns, deadline) {
            Ok(ids) => {
                for (id, event) in ids {
                    if ev.containers.len() >= MAX_CONTAINERS {
                        ev.omitted += 1;
                        continue;
                    }
                    match record(engine, &id, &event, run_pids, deadline) {
                        Ok(r) => ev.containers.push(r),
                        Err(e) => ev.errors.push(e.to_string()),
                    }
                }
            }
            Err(e) => ev.errors.push(e.to_string()),
        }
    }
    ev.engines = engines;
    ev
}

/// Run `work` on a thread of its own and wait for it until `deadline` (and a little more, for
/// the answer to be handed over). `None` when it did not finish: the thread is left to end at
/// its own deadline (or stays blocked in a `connect` that never completes).
fn within_deadline<T: Send + 'static>(
    deadline: Instant,
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("agentdiff-engines".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .ok()?;
    let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(100);
    rx.recv_timeout(wait).ok()
}

/// Engines that answered discovery, and sockets that exist but did not answer.
type Discovery = (Vec<EngineRecord>, Vec<String>);

/// Container observation of one run. Engine discovery (a `/_ping` per existing socket) runs in
/// the background from the launch, so its latency overlaps the command; the event-log query runs
/// when the command has ended, before cleanup, so `running_at_end` is the state the command left.
///
/// When the backend hid every engine socket ([`EngineReach::Hidden`]), nothing is asked during
/// the run; at the end the candidates are checked again (a stat each): if each one that exists is
/// still the socket the backend hid, the evidence says `not_applicable` and why; otherwise the
/// engines are queried as usual.
#[derive(Debug)]
pub struct ContainerWatch {
    since_ns: u64,
    /// Candidate sockets that did not exist at the launch (one may appear during the run).
    absent: Vec<PathBuf>,
    discovery: Option<std::thread::JoinHandle<Discovery>>,
    /// Every candidate, and what the backend hid (when it hid them all).
    hidden: Option<(Vec<PathBuf>, Vec<HiddenSocket>, String)>,
}

impl ContainerWatch {
    /// Start discovery; `since_ns` opens the run window (taken just before the launch).
    pub fn start(
        since_ns: u64,
        command_env: &[(std::ffi::OsString, std::ffi::OsString)],
        reach: &EngineReach,
    ) -> Self {
        Self::start_with(since_ns, candidate_sockets(command_env), reach)
    }

    fn start_with(since_ns: u64, candidates: Vec<PathBuf>, reach: &EngineReach) -> Self {
        if let EngineReach::Hidden { sockets, how } = reach {
            return ContainerWatch {
                since_ns,
                absent: Vec::new(),
                discovery: None,
                hidden: Some((candidates, sockets.clone(), how.clone())),
            };
        }
        let (present, absent): (Vec<PathBuf>, Vec<PathBuf>) =
            candidates.into_iter().partition(|p| p.exists());
        let deadline = Instant::now() + OBSERVE_BUDGET;
        let discovery = std::thread::Builder::new()
            .name("agentdiff-engines".into())
            .spawn(move || discover(&present, deadline))
            .ok();
        ContainerWatch {
            since_ns,
            absent,
            discovery,
            hidden: None,
        }
    }

    /// The command ended: the containers created since the launch. A socket that appeared
    /// during the run (an engine the command started) is included. `run_pids` are the run's
    /// tracked pids (for attribution). Takes at most [`OBSERVE_BUDGET`] after the call.
    pub fn observe(self, run_pids: &[u32]) -> ContainerEvidence {
        let deadline = Instant::now() + OBSERVE_BUDGET;
        let since_ns = self.since_ns;
        let run_pids = run_pids.to_vec();
        let (discovery, mut absent) = (self.discovery, self.absent);
        let mut why_queried = None;
        if let Some((candidates, hidden, how)) = self.hidden {
            match uncovered_socket(&candidates, &hidden) {
                None => return not_applicable(since_ns, &hidden, &how),
                Some(why) => {
                    why_queried = Some(why);
                    absent = candidates;
                }
            }
        }
        let ev = within_deadline(deadline, move || {
            let (mut engines, mut errors) = match discovery {
                Some(h) => h.join().unwrap_or_default(),
                None => Default::default(),
            };
            let (late, late_errors) = discover(&absent, deadline);
            engines.extend(late);
            errors.extend(late_errors);
            let mut ev = observe_engines(since_ns, engines, &run_pids, deadline);
            errors.append(&mut ev.errors);
            ev.errors = errors;
            ev
        })
        .unwrap_or_else(|| ContainerEvidence {
            since_ns,
            until_ns: now_ns(),
            errors: vec![format!(
                "the container engines did not answer within {OBSERVE_BUDGET:?}"
            )],
            note: "no container engine answered in time: containers started during the run are \
                   not observed"
                .into(),
            ..ContainerEvidence::default()
        });
        match why_queried {
            Some(why) => ContainerEvidence {
                note: format!("queried because {why}; {}", ev.note),
                ..ev
            },
            None => ev,
        }
    }
}

/// The evidence of a run whose command could reach no engine API.
fn not_applicable(since_ns: u64, hidden: &[HiddenSocket], how: &str) -> ContainerEvidence {
    let covered: Vec<String> = hidden
        .iter()
        .map(|h| h.path.display().to_string())
        .collect();
    let sockets = if covered.is_empty() {
        "no engine API socket existed at the launch or when it ended".to_string()
    } else {
        format!(
            "the engine API sockets {} were hidden from the command and were still the same \
             sockets when it ended",
            covered.join(", ")
        )
    };
    ContainerEvidence {
        observation: Observation::NotApplicable,
        since_ns,
        until_ns: now_ns(),
        note: format!(
            "the engines were not queried: the command could not reach a container engine API \
             ({sockets}; {how}); containers other processes started during the run are not listed"
        ),
        ..ContainerEvidence::default()
    }
}

/// Ping every candidate that exists, until `deadline`.
fn discover(candidates: &[PathBuf], deadline: Instant) -> Discovery {
    let mut engines = Vec::new();
    let mut errors = Vec::new();
    for p in candidates.iter().filter(|p| p.exists()) {
        match ping(p, deadline) {
            Ok(Some(e)) => engines.push(e),
            Ok(None) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    (engines, errors)
}

/// After cleanup: whether each recorded container still runs; extends the window to now. Takes
/// at most [`OBSERVE_BUDGET`].
pub fn refresh_after_cleanup(ev: ContainerEvidence) -> ContainerEvidence {
    if ev.containers.iter().all(|c| c.removed) {
        // Nothing to ask about (the usual case): no worker thread.
        return ContainerEvidence {
            until_ns: now_ns().max(ev.until_ns),
            ..ev
        };
    }
    let deadline = Instant::now() + OBSERVE_BUDGET;
    let before = ev.clone();
    within_deadline(deadline, move || {
        let mut ev = ev;
        ev.until_ns = now_ns().max(ev.until_ns);
        for c in ev.containers.iter_mut().filter(|c| !c.removed) {
            match get_json(
                Path::new(&c.socket),
                &format!("/containers/{}/json", c.id),
                deadline,
            ) {
                Ok(Some(v)) => {
                    c.running_after_cleanup = v["State"]["Running"].as_bool().unwrap_or(false)
                }
                Ok(None) => c.running_after_cleanup = false,
                Err(e) => ev.errors.push(e.to_string()),
            }
        }
        ev
    })
    .unwrap_or_else(|| {
        let mut ev = before;
        ev.until_ns = now_ns().max(ev.until_ns);
        ev.errors.push(format!(
            "the container engines did not answer within {OBSERVE_BUDGET:?} after cleanup: \
             whether the containers still run is unknown"
        ));
        ev
    })
}

fn note_for(engines: &[EngineRecord]) -> String {
    let clients: Vec<&str> = ["docker", "podman", "nerdctl"]
        .into_iter()
        .filter(|c| {
            // On agentdiff's own PATH, relative entries under its own working directory.
            let path = std::env::var_os("PATH");
            find_program(OsStr::new(c), path.as_deref(), Path::new(".")).is_some()
        })
        .collect();
    let mut note = String::from(
        "containers created through a reachable engine API during the run; they belong to the \
         engine, not to the run, and are stopped only on request (agentdiff cleanup RUN \
         --containers)",
    );
    if engines.is_empty() && !clients.is_empty() {
        note = format!(
            "{} installed but no engine API socket is reachable: containers started during the \
             run are not observed",
            clients.join(", ")
        );
    } else if engines.is_empty() {
        note = "no container engine API socket is reachable".into();
    }
    note
}

fn parse_created_ns(created: &str) -> Option<u64> {
    crate::rfc3339::parse_utc_ns(created).ok()
}

/// Stop the recorded containers that still exist, each by id after the engine confirms its
/// creation time is inside the recorded window. `grace` is the engine's stop timeout.
pub fn stop_recorded(ev: &ContainerEvidence, grace: Duration) -> Vec<ContainerStop> {
    let mut out = Vec::new();
    for c in &ev.containers {
        let socket = Path::new(&c.socket);
        let stop = |outcome: &str, detail: Option<String>| ContainerStop {
            id: c.id.clone(),
            outcome: outcome.into(),
            detail,
        };
        let info = match get_json(
            socket,
            &format!("/containers/{}/json", c.id),
            Instant::now() + OBSERVE_BUDGET,
        ) {
            Ok(Some(v)) => v,
            Ok(None) => {
                out.push(stop("gone", None));
                continue;
            }
            Err(e) => {
                out.push(stop("error", Some(e.to_string())));
                continue;
            }
        };
        let created = info["Created"].as_str().unwrap_or("");
        let inside =
            parse_created_ns(created).is_some_and(|t| t >= ev.since_ns && t <= ev.until_ns);
        if !inside || info["Id"].as_str() != Some(c.id.as_str()) {
            out.push(stop(
                "refused_outside_window",
                Some(format!(
                    "created {created:?}, outside the run window; not the container the run recorded"
                )),
            ));
            continue;
        }
        if !info["State"]["Running"].as_bool().unwrap_or(false) {
            out.push(stop("already_stopped", None));
            continue;
        }
        let path = format!("/containers/{}/stop?t={}", c.id, grace.as_secs());
        // The engine waits `grace` before it kills.
        match request(
            socket,
            "POST",
            &path,
            Instant::now() + grace + OBSERVE_BUDGET,
        ) {
            Ok(r) if r.status == 204 => out.push(stop("stopped", None)),
            Ok(r) if r.status == 304 => out.push(stop("already_stopped", None)),
            Ok(r) if r.status == 404 => out.push(stop("gone", None)),
            Ok(r) => out.push(stop(
                "error",
                Some(format!(
                    "the engine answered {}: {}",
                    r.status,
                    String::from_utf8_lossy(&r.body).trim()
                )),
            )),
            Err(e) => out.push(stop("error", Some(e.to_string()))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_with_length_chunks_or_close_parse() {
        let r = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOKextra").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, b"OK".as_slice()));
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(r.body, b"abcde");
        let r = parse_response(b"HTTP/1.1 404 Not Found\r\nX: y\r\n\r\nnope").unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, b"nope".as_slice()));
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        assert!(parse_response(b"garbage\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
    }

    #[test]
    fn a_cut_chunked_stream_keeps_whole_chunks_only() {
        assert_eq!(dechunk(b"3\r\nabc\r\n5\r\nde").unwrap(), b"abc");
        assert!(dechunk(b"zz\r\n").is_err());
    }

    #[test]
    fn docker_host_and_usual_sockets_are_candidates_once() {
        let env = vec![(
            std::ffi::OsString::from("DOCKER_HOST"),
            std::ffi::OsString::from("unix:///tmp/x.sock"),
        )];
        let c = candidate_sockets(&env);
        assert!(c.contains(&PathBuf::from("/tmp/x.sock")));
        assert!(c.contains(&PathBuf::from("/run/podman/podman.sock")));
        let tcp = vec![(
            std::ffi::OsString::from("DOCKER_HOST"),
            std::ffi::OsString::from("tcp://1.2.3.4:2375"),
        )];
        assert!(!candidate_sockets(&tcp)
            .iter()
            .any(|p| p.to_string_lossy().contains("1.2.3.4")));
    }

    use agentdiff_test_support::fake_podman;

    #[test]
    fn engine_creation_times_parse_to_unix_nanoseconds() {
        let t = parse_created_ns("2026-11-30T16:53:36.956847568Z").unwrap();
        assert_eq!(t % 1_000_000_000, 956_847_568);
        assert!(parse_created_ns("yesterday").is_none());
    }

    fn hidden(sockets: Vec<HiddenSocket>) -> EngineReach {
        EngineReach::Hidden {
            sockets,
            how: "own network namespace".into(),
        }
    }

    #[test]
    fn hidden_engines_are_not_queried_while_the_hidden_sockets_stay_the_same() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("podman.sock");
        let asked = fake_podman(&sock);
        let candidates = vec![sock.clone(), dir.path().join("absent.sock")];
        let reach = hidden(vec![HiddenSocket::of(&sock).unwrap()]);
        let ev = ContainerWatch::start_with(now_ns(), candidates, &reach).observe(&[]);
        assert_eq!(ev.observation, Observation::NotApplicable);
        assert!(ev.engines.is_empty() && ev.errors.is_empty(), "{ev:?}");
        let shown = std::fs::canonicalize(&sock).unwrap().display().to_string();
        assert!(ev.note.contains(&shown), "{}", ev.note);
        assert!(ev.note.contains("own network namespace"), "{}", ev.note);
        assert!(ev.until_ns >= ev.since_ns);
        assert_eq!(asked.load(Ordering::SeqCst), 0, "the engine was asked");
        // The same engine, unhidden: asked (so the test above can fail).
        let ev = ContainerWatch::start_with(now_ns(), vec![sock], &EngineReach::Unrestricted)
            .observe(&[]);
        assert_eq!(ev.observation, Observation::Queried);
        assert_eq!(ev.engines.len(), 1, "{ev:?}");
        assert!(asked.load(Ordering::SeqCst) >= 2);
    }

    #[test]
    fn a_socket_replaced_or_appearing_after_the_launch_is_queried() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("podman.sock");
        let _first = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let reach = hidden(vec![HiddenSocket::of(&sock).unwrap()]);
        let watch = ContainerWatch::start_with(now_ns(), vec![sock.clone()], &reach);
        // The engine restarts during the run: a new socket at the same path is not covered.
        std::fs::remove_file(&sock).unwrap();
        fake_podman(&sock);
        let ev = watch.observe(&[]);
        assert_eq!(ev.observation, Observation::Queried, "{ev:?}");
        assert_eq!(ev.engines.len(), 1, "{ev:?}");
        assert!(
            ev.note.contains("was replaced during the run"),
            "{}",
            ev.note
        );

        let late = dir.path().join("late.sock");
        let watch = ContainerWatch::start_with(now_ns(), vec![late.clone()], &hidden(vec![]));
        fake_podman(&late);
        let ev = watch.observe(&[]);
        assert_eq!(ev.observation, Observation::Queried, "{ev:?}");
        assert_eq!(ev.engines.len(), 1, "{ev:?}");
        assert!(ev.note.contains("was not hidden"), "{}", ev.note);
    }

    #[test]
    fn older_evidence_without_an_observation_reads_as_queried() {
        let ev: ContainerEvidence = serde_json::from_value(serde_json::json!({
            "engines": [], "since_ns": 1, "until_ns": 2, "containers": [], "errors": [],
            "note": "x"
        }))
        .unwrap();
        assert_eq!(ev.observation, Observation::Queried);
        let not = serde_json::to_value(Observation::NotApplicable).unwrap();
        assert_eq!(not, "not_applicable");
    }
}
