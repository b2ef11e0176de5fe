//! Reaching an allowed host: resolve the name here (never in the sandbox), check every address,
//! connect to the first permitted one, relay with byte counts.
//!
//! Invariant: a connection is only ever made to an address `Egress::check_address` accepted for
//! the decided host and port; bytes the client sends go to that one address and nowhere else.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agentdiff_policy::egress::{inet_aton, HostError, Target};
use agentdiff_policy::{Action, Egress, EgressDecision};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// What [`Resolve::resolve`] returns: boxed, because the proxy holds its resolver as `dyn Resolve`.
pub type ResolveFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Name resolution, replaceable so tests can map names without touching the host.
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (a DNS name, never an address literal).
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> ResolveFuture<'a>;
}

/// The host's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str, port: u16) -> ResolveFuture<'a> {
        Box::pin(async move {
            // getaddrinfo reads an address literal in any inet_aton form as that address: only
            // names are looked up, so such a host can never pass as a name.
            if numeric_host(name) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{name:?} is an address, not a name to resolve"),
                ));
            }
            let addrs = tokio::net::lookup_host((name, port)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

/// What deciding every address of an allowed host came to.
pub(crate) enum Checked {
    /// The addresses every check permits, in resolver order (at least one).
    Permitted(EgressDecision, Vec<IpAddr>),
    /// The policy refused the host or every address it resolves to.
    Denied(EgressDecision),
    /// Allowed, but it has no address to reach.
    Failed {
        decision: EgressDecision,
        error: String,
    },
}

/// Why a name could not be reached.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    #[error("cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("resolving {host} took longer than {timeout:?}")]
    ResolveTimeout { host: String, timeout: Duration },
    #[error("{host} has no address")]
    NoAddress { host: String },
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("connecting to {address} took longer than {timeout:?}")]
    ConnectTimeout {
        address: SocketAddr,
        timeout: Duration,
    },
}

/// Resolve the host `decision` allowed (a name, here; an address as is) and check every
/// address it comes to.
pub(crate) async fn check(
    egress: &Egress,
    resolver: &dyn Resolve,
    decision: EgressDecision,
    timeout: Duration,
) -> Checked {
    if decision.action != Action::Allow {
        return Checked::Denied(decision);
    }
    let port = decision.port;
    let failed = |decision: EgressDecision, e: UpstreamError| Checked::Failed {
        decision,
        error: e.to_string(),
    };
    let addrs = match Target::parse(&decision.host) {
        Ok(Target::Addr(a)) => vec![a],
        // `Target::parse` makes every inet_aton form an address; a name here that the
        // resolver would still read as one is refused rather than resolved.
        Ok(Target::Name(name)) if numeric_host(&name) => {
            let reason = HostError::Numeric(name);
            return Checked::Denied(refused(decision, reason));
        }
        Ok(Target::Name(name)) => {
            match tokio::time::timeout(timeout, resolver.resolve(&name, port)).await {
                Ok(Ok(addrs)) => addrs,
                Ok(Err(source)) => {
                    let e = UpstreamError::Resolve { host: name, source };
                    return failed(decision, e);
                }
                Err(_) => {
                    let e = UpstreamError::ResolveTimeout {
                        host: name,
                        timeout,
                    };
                    return failed(decision, e);
                }
            }
        }
        // `decide` allowed it, so it parsed; a refusal is the safe reading.
        Err(reason) => return Checked::Denied(refused(decision, reason)),
    };
    let mut permitted = Vec::new();
    let mut refusal = None;
    for addr in addrs {
        match egress.check_address(&decision, addr, port) {
            None => permitted.push(addr),
            Some(d) => {
                refusal.get_or_insert(d);
            }
        }
    }
    match (permitted.is_empty(), refusal) {
        (false, _) => Checked::Permitted(decision, permitted),
        (true, Some(d)) => Checked::Denied(d),
        (true, None) => {
            let e = UpstreamError::NoAddress {
                host: decision.host.clone(),
            };
            failed(decision, e)
        }
    }
}

/// Whether the C resolver would read `name` as an address rather than look it up.
fn numeric_host(name: &str) -> bool {
    name.parse::<IpAddr>().is_ok() || inet_aton(name.strip_suffix('.').unwrap_or(name)).is_some()
}

/// Connect to the first of `addrs` that answers.
pub(crate) async fn connect(
    host: &str,
    addrs: &[IpAddr],
    port: u16,
    timeout: Duration,
) -> Result<(TcpStream, SocketAddr), UpstreamError> {
    let mut last = None;
    for ip in addrs {
        let address = SocketAddr::new(*ip, port);
        match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                // Small writes (a TLS handshake, an HTTP request) must not wait for more.
                let _ = stream.set_nodelay(true);
                return Ok((stream, address));
            }
            Ok(Err(source)) => last = Some(UpstreamError::Connect { address, source }),
            Err(_) => last = Some(UpstreamError::ConnectTimeout { address, timeout }),
        }
    }
    Err(last.unwrap_or(UpstreamError::NoAddress {
        host: host.to_owned(),
    }))
}

fn refused(mut d: EgressDecision, reason: HostError) -> EgressDecision {
    d.action = Action::Deny;
    d.rule = "network.egress.invalid_host".to_owned();
    d.pattern = None;
    d.reason = reason.to_string();
    d
}

/// Byte counters that survive a relay being cut short.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) up: AtomicU64,
    pub(crate) down: AtomicU64,
}

/// The upstream side of a relay: what is read from it went down to the client, what is written
/// to it went up.
pub(crate) struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S> Counted<S> {
    pub(crate) fn new(inner: S, counters: Arc<Counters>) -> Counted<S> {
        Counted { inner, counters }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len().saturating_sub(before);
        self.counters.down.fetch_add(n as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = &polled {
            self.counters.up.fetch_add(*n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
