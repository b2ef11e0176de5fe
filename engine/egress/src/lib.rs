//! The egress proxy: every connection a sandboxed command makes leaves through here, is decided
//! by the policy's `network.egress` (host name and port, then every resolved address), and is
//! recorded.
//!
//! ```text
//! client ─▶ first byte 0x05? ─▶ SOCKS5 CONNECT ─┐
//!                  └─ else ─▶ HTTP CONNECT / absolute http:// URI ─┤
//!    Egress::decide(host, port) ─▶ resolve here ─▶ check_address each ─▶ connect ─▶ relay
//!    every attempt, from its request read ─▶ EgressLog (first records, per-destination
//!    aggregates bounded per kind, exact totals of the rest)
//! ```
//!
//! Invariants:
//! - The proxy resolves names itself; the client's idea of an address is never used for a name.
//! - Bytes a client sends after its request go only to the address decided for it (one upstream
//!   per client connection; an HTTP request is forwarded with `Connection: close`).
//! - Every phase before the relay is bounded in time and size (handshake timeout, head size,
//!   connect timeout); the number of concurrent connections is bounded, and the log is bounded
//!   (record.rs).
//! - An attempt is recorded as soon as its request is read (before any resolution). Stopping
//!   the proxy ends every attempt in every phase, and each is closed with how far it got: an
//!   allowed name still resolving becomes `review` (`in_flight_at_exit`), never a silent pass;
//!   a request still being read is counted (`unread_at_exit`).
//!
//! Not defended here: what flows inside an allowed connection (a program can tunnel anything
//! through an allowed host); a program that does not use the proxy (the sandbox must leave it
//! no other route: that is the backend's job); UDP and ICMP (never relayed). See docs/network.md.

mod http;
mod record;
mod socks;
mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use agentdiff_policy::Egress;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use record::{
    Bounds, ConnectionRecord, Destination, EgressLog, Frequent, Omitted, OmittedByDecision,
    Outcome, Protocol, MAX_DISTINCT, MAX_FREQUENT,
};
pub use upstream::{Resolve, ResolveFuture, SystemResolver};

use record::{End, Recorder};
use upstream::{Checked, Counted, Counters};

/// Relay buffer per direction. 256 KiB relays a bulk transfer with a quarter of the syscalls of
/// 64 KiB (the proxy's CPU per GiB fell by about a fifth in the benchmark); with at most
/// `max_connections` (256) relays that is at most 128 MiB of buffers.
const RELAY_BUFFER: usize = 256 * 1024;

/// Errors of starting the proxy.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("cannot listen on {what}: {source}")]
    Bind {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start the proxy's thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the proxy's thread ended before it listened")]
    ThreadEnded,
}

/// Limits of one proxy.
#[derive(Debug, Clone, Copy)]
pub struct ProxyConfig {
    /// How long a client may take to send its request.
    pub handshake_timeout: Duration,
    /// How long resolving a name, and connecting to one address, may take.
    pub connect_timeout: Duration,
    /// Connections served at once; a client beyond this is closed at once and counted.
    pub max_connections: usize,
    pub bounds: Bounds,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            max_connections: 256,
            bounds: Bounds {
                max_records: 1000,
                max_destinations: 1000,
            },
        }
    }
}

/// Where the proxy listens.
#[derive(Debug, Clone)]
pub enum Bind {
    /// A TCP address (tests and benchmarks; port 0 picks one).
    Tcp(SocketAddr),
    /// A Unix socket at this path (created with mode 0600; it must not exist).
    Unix(PathBuf),
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

struct Shared {
    egress: Egress,
    resolver: Arc<dyn Resolve>,
    config: ProxyConfig,
    recorder: Recorder,
}

/// A running proxy. [`Proxy::stop`] ends it and returns what it saw.
pub struct Proxy {
    shared: Arc<Shared>,
    shutdown: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
    local_tcp: Option<SocketAddr>,
    unix_path: Option<PathBuf>,
}

impl Proxy {
    /// Listen and serve on the current tokio runtime.
    pub async fn start(
        egress: Egress,
        resolver: Arc<dyn Resolve>,
        config: ProxyConfig,
        bind: Bind,
    ) -> Result<Proxy, ProxyError> {
        let (listener, local_tcp, unix_path) = match bind {
            Bind::Tcp(addr) => {
                let l = TcpListener::bind(addr)
                    .await
                    .map_err(|source| ProxyError::Bind {
                        what: addr.to_string(),
                        source,
                    })?;
                let local = l.local_addr().ok();
                (Listener::Tcp(l), local, None)
            }
            Bind::Unix(path) => {
                let bind_error = |source| ProxyError::Bind {
                    what: path.display().to_string(),
                    source,
                };
                let l = UnixListener::bind(&path).map_err(bind_error)?;
                // Connecting needs write permission on the socket: only agentdiff's user gets
                // it, whatever the umask.
                use std::os::unix::fs::PermissionsExt;
                if let Err(e) =
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                {
                    let _ = std::fs::remove_file(&path);
                    return Err(bind_error(e));
                }
                (Listener::Unix(l), None, Some(path))
            }
        };
        let shared = Arc::new(Shared {
            egress,
            resolver,
            config,
            recorder: Recorder::new(config.bounds),
        });
        let (shutdown, rx) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(listener, shared.clone(), rx));
        Ok(Proxy {
            shared,
            shutdown,
            accept,
            local_tcp,
            unix_path,
        })
    }

    /// The TCP address listened on (`Bind::Tcp`).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.local_tcp
    }

    /// The socket path listened on (`Bind::Unix`).
    pub fn unix_path(&self) -> Option<&Path> {
        self.unix_path.as_deref()
    }

    /// What the proxy has seen so far.
    pub fn snapshot(&self) -> EgressLog {
        self.shared.recorder.snapshot()
    }

    /// Stop accepting, end every open relay, and return the log.
    pub async fn stop(self) -> EgressLog {
        let _ = self.shutdown.send(true);
        let _ = self.accept.await;
        if let Some(path) = &self.unix_path {
            let _ = std::fs::remove_file(path);
        }
        self.shared.recorder.snapshot()
    }
}

/// A proxy on a thread of its own, with its own current-thread runtime: whatever the caller's
/// thread does (a blocking wait for the command, another runtime), the proxy keeps serving.
pub struct ProxyThread {
    tcp_addr: Option<SocketAddr>,
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<ThreadOutcome>,
}

/// What the proxy thread returns: the log and the thread's CPU time (user + system).
#[derive(Debug, Clone, Default)]
pub struct ThreadOutcome {
    pub log: EgressLog,
    pub cpu: Option<Duration>,
}

impl ProxyThread {
    /// Start the proxy on a new thread; returns once it listens (or failed to).
    pub fn spawn(
        egress: Egress,
        resolver: Arc<dyn Resolve>,
        config: ProxyConfig,
        bind: Bind,
    ) -> Result<ProxyThread, ProxyError> {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("agentdiff-egress".to_owned())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(ProxyError::Thread(e)));
                        return ThreadOutcome::default();
                    }
                };
                let log = rt.block_on(async move {
                    let proxy = match Proxy::start(egress, resolver, config, bind).await {
                        Ok(p) => p,
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return EgressLog::default();
                        }
                    };
                    let _ = ready_tx.send(Ok(proxy.tcp_addr()));
                    // Ends when `stop` is used or dropped.
                    let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
                    proxy.stop().await
                });
                ThreadOutcome {
                    log,
                    cpu: thread_cpu(),
                }
            })
            .map_err(ProxyError::Thread)?;
        match ready_rx.recv() {
            Ok(Ok(tcp_addr)) => Ok(ProxyThread {
                tcp_addr,
                stop,
                thread,
            }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => {
                let _ = thread.join();
                Err(ProxyError::ThreadEnded)
            }
        }
    }

    /// The TCP address listened on (`Bind::Tcp`).
    pub fn tcp_addr(&self) -> Option<SocketAddr> {
        self.tcp_addr
    }

    /// Stop the proxy (every open relay is ended) and return its log.
    pub fn stop(self) -> ThreadOutcome {
        let _ = self.stop.send(());
        self.thread.join().unwrap_or_default()
    }
}

/// The calling thread's CPU time, where the platform says.
fn thread_cpu() -> Option<Duration> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>) {
    let mut tasks = JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = accept(&listener) => {
                let Ok(client) = accepted else {
                    // Out of descriptors or similar: do not spin.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                if tasks.len() >= shared.config.max_connections {
                    shared.recorder.over_capacity();
                    continue;
                }
                let shared = shared.clone();
                let rx = shutdown.clone();
                match client {
                    Client::Tcp(s) => tasks.spawn(serve(s, shared, rx)),
                    Client::Unix(s) => tasks.spawn(serve(s, shared, rx)),
                };
            }
        }
    }
    while tasks.join_next().await.is_some() {}
}

enum Client {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

async fn accept(listener: &Listener) -> std::io::Result<Client> {
    match listener {
        Listener::Tcp(l) => l.accept().await.map(|(s, _)| {
            let _ = s.set_nodelay(true);
            Client::Tcp(s)
        }),
        Listener::Unix(l) => l.accept().await.map(|(s, _)| Client::Unix(s)),
    }
}

/// What a client asked for.
struct Request {
    protocol: Protocol,
    host: String,
    port: u16,
    /// Bytes for the upstream before relaying.
    upstream: Vec<u8>,
}

/// Read the request: SOCKS5 when the first byte is its version, else HTTP. A request that
/// cannot be served is answered here and `None` returned.
async fn read_request<S>(client: &mut S) -> Option<Request>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut first = vec![0u8; 4096];
    let n = client.read(&mut first).await.ok()?;
    if n == 0 {
        return None;
    }
    first.truncate(n);
    if first[0] == 5 {
        let r = socks::handshake(client, &first).await.ok()?;
        return Some(Request {
            protocol: Protocol::Socks5,
            host: r.host,
            port: r.port,
            upstream: r.early,
        });
    }
    match http::read(client, first).await {
        Ok(r) => Some(Request {
            protocol: if r.connect {
                Protocol::Connect
            } else {
                Protocol::Http
            },
            host: r.host,
            port: r.port,
            upstream: r.upstream,
        }),
        Err(e) => {
            let body = format!("agentdiff egress proxy: {e}");
            let _ = client
                .write_all(&http::response("400 Bad Request", None, &body))
                .await;
            None
        }
    }
}

/// Serve one client connection to its end. The attempt is recorded as soon as its request is
/// read, and every way out, the proxy stopping included, records how it ended.
async fn serve<S>(mut client: S, shared: Arc<Shared>, mut shutdown: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let config = shared.config;
    let read = tokio::time::timeout(config.handshake_timeout, read_request(&mut client));
    let request = tokio::select! {
        r = read => r.ok().flatten(),
        _ = stopped(&mut shutdown) => {
            shared.recorder.unread_at_exit();
            return;
        }
    };
    let Some(request) = request else {
        shared.recorder.malformed();
        return;
    };
    let decision = shared.egress.decide(&request.host, request.port);
    let slot = shared.recorder.start(request.protocol, &decision);
    let name_decision = decision.clone();
    let check = upstream::check(
        &shared.egress,
        shared.resolver.as_ref(),
        decision,
        config.connect_timeout,
    );
    let checked = tokio::select! {
        c = check => c,
        _ = stopped(&mut shutdown) => {
            shared.recorder.finish(slot, in_flight(name_decision));
            return;
        }
    };
    let (decision, addrs) = match checked {
        Checked::Denied(d) => {
            let _ = client.write_all(&refusal(request.protocol, &d)).await;
            shared.recorder.finish(slot, End::new(d, Outcome::Refused));
            return;
        }
        Checked::Failed { decision, error } => {
            return failed(
                &mut client,
                &shared,
                slot,
                request.protocol,
                decision,
                error,
            )
            .await;
        }
        Checked::Permitted(decision, addrs) => (decision, addrs),
    };
    let connect = upstream::connect(
        &decision.host,
        &addrs,
        decision.port,
        config.connect_timeout,
    );
    let (stream, address) = tokio::select! {
        c = connect => match c {
            Ok(c) => c,
            Err(e) => {
                let error = e.to_string();
                return failed(&mut client, &shared, slot, request.protocol, decision, error).await;
            }
        },
        _ = stopped(&mut shutdown) => {
            // Every address was checked: the decision stands, the connection was never made.
            let mut end = End::new(decision, Outcome::InFlightAtExit);
            end.error = Some("still connecting when the run ended".to_owned());
            shared.recorder.finish(slot, end);
            return;
        }
    };
    let relayed = relay(client, stream, request, &mut shutdown).await;
    let end = End {
        decision,
        outcome: relayed.outcome,
        address: Some(address.to_string()),
        bytes_up: relayed.bytes_up,
        bytes_down: relayed.bytes_down,
        error: relayed.error,
    };
    shared.recorder.finish(slot, end);
}

/// Resolves once the proxy is stopping (at once if it already is).
/// An allowed attempt that could not reach its destination: the client is told, and the
/// attempt is recorded as failed with why.
async fn failed<S>(
    client: &mut S,
    shared: &Shared,
    slot: record::Slot,
    protocol: Protocol,
    decision: agentdiff_policy::EgressDecision,
    error: String,
) where
    S: AsyncWrite + Unpin,
{
    let _ = client
        .write_all(&unreachable(protocol, &decision, &error))
        .await;
    let mut end = End::new(decision, Outcome::Failed);
    end.error = Some(error);
    shared.recorder.finish(slot, end);
}

async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

/// The end of an attempt the proxy stopped before its addresses were checked: an allowed name
/// becomes `review` (what it would have reached is unknown), a refusal stays a refusal.
fn in_flight(mut d: agentdiff_policy::EgressDecision) -> End {
    let error = if d.action == agentdiff_policy::Action::Allow {
        d.action = agentdiff_policy::Action::Review;
        d.reason = format!(
            "{}; but the run ended while the name was still being resolved, so its addresses \
             were never checked",
            d.reason
        );
        "still resolving when the run ended"
    } else {
        "still being refused when the run ended"
    };
    let mut end = End::new(d, Outcome::InFlightAtExit);
    end.error = Some(error.to_owned());
    end
}

/// How a relay ended.
struct Relayed {
    outcome: Outcome,
    bytes_up: u64,
    bytes_down: u64,
    error: Option<String>,
}

/// Relay between the client and the upstream until either closes or the proxy stops.
async fn relay<S>(
    mut client: S,
    stream: tokio::net::TcpStream,
    request: Request,
    shutdown: &mut watch::Receiver<bool>,
) -> Relayed
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let counters = Arc::new(Counters::default());
    let mut upstream = Counted::new(stream, counters.clone());
    let relay = async {
        match request.protocol {
            Protocol::Socks5 => client.write_all(&socks::reply(socks::REPLY_OK)).await?,
            Protocol::Connect => {
                client
                    .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    .await?
            }
            Protocol::Http => {}
        }
        upstream.write_all(&request.upstream).await?;
        tokio::io::copy_bidirectional_with_sizes(
            &mut client,
            &mut upstream,
            RELAY_BUFFER,
            RELAY_BUFFER,
        )
        .await
        .map(|_| ())
    };
    let (outcome, error) = tokio::select! {
        r = relay => (Outcome::Relayed, r.err().map(|e| e.to_string())),
        _ = stopped(shutdown) => (
            Outcome::ClosedAtExit,
            Some("still open when the run ended; closed".to_owned()),
        ),
    };
    Relayed {
        outcome,
        bytes_up: counters.up.load(Ordering::Relaxed),
        bytes_down: counters.down.load(Ordering::Relaxed),
        error,
    }
}

/// The answer to an allowed request that could not be connected.
fn unreachable(protocol: Protocol, d: &agentdiff_policy::EgressDecision, error: &str) -> Vec<u8> {
    match protocol {
        Protocol::Socks5 => socks::reply(socks::REPLY_HOST_UNREACHABLE).to_vec(),
        _ => http::response(
            "502 Bad Gateway",
            Some(&d.rule),
            &format!("agentdiff egress proxy: {error}"),
        ),
    }
}

/// The answer to a denied request: SOCKS5 "not allowed by ruleset", or HTTP 403 naming the rule.
fn refusal(protocol: Protocol, d: &agentdiff_policy::EgressDecision) -> Vec<u8> {
    match protocol {
        Protocol::Socks5 => socks::reply(socks::REPLY_NOT_ALLOWED).to_vec(),
        _ => http::response(
            "403 Forbidden",
            Some(&d.rule),
            &format!("agentdiff egress proxy: denied by {}: {}", d.rule, d.reason),
        ),
    }
}
