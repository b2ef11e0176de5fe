//! Reaching an allowed host: resolve the name here (never in the sandbox), check every address,
//! connect to the first permitted one, relay with byte counts.
//!
//! Invariant: a connection is only ever made to an address `Egress::check_address` accepted for
//! the decided host and port; bytes the client sends go to that one address and nowhere else.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use agentdiff_policy::egress::Target;
use agentdiff_policy::{Action, Egress, EgressDecision};
use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Name resolution, replaceable so tests can map names without touching the host.
#[async_trait]
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (a DNS name, never an address literal).
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>>;
}

/// The host's resolver (`getaddrinfo`, through tokio).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

#[async_trait]
impl Resolve for SystemResolver {
    async fn resolve(&self, name: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        let addrs = tokio::net::lookup_host((name, port)).await?;
        Ok(addrs.map(|a| a.ip()).collect())
    }
}

/// What opening an upstream connection came to.
pub(crate) enum Opened {
    Connected {
        stream: TcpStream,
        address: SocketAddr,
        decision: EgressDecision,
    },
    /// The policy refused the host or every address it resolves to.
    Denied(EgressDecision),
    /// Allowed, but no connection could be made.
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

/// Decide `host:port`, resolve, check and connect.
pub(crate) async fn open(
    egress: &Egress,
    resolver: &dyn Resolve,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Opened {
    let decision = egress.decide(host, port);
    if decision.action != Action::Allow {
        return Opened::Denied(decision);
    }
    let failed = |decision: EgressDecision, e: UpstreamError| Opened::Failed {
        decision,
        error: e.to_string(),
    };
    let addrs = match Target::parse(&decision.host) {
        Ok(Target::Addr(a)) => vec![a],
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
        Err(reason) => return Opened::Denied(refused(decision, reason)),
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
    if permitted.is_empty() {
        return match refusal {
            Some(d) => Opened::Denied(d),
            None => {
                let e = UpstreamError::NoAddress {
                    host: decision.host.clone(),
                };
                failed(decision, e)
            }
        };
    }
    let mut last = None;
    for ip in permitted {
        let address = SocketAddr::new(ip, port);
        match tokio::time::timeout(timeout, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => {
                // Small writes (a TLS handshake, an HTTP request) must not wait for more.
                let _ = stream.set_nodelay(true);
                return Opened::Connected {
                    stream,
                    address,
                    decision,
                };
            }
            Ok(Err(source)) => last = Some(UpstreamError::Connect { address, source }),
            Err(_) => last = Some(UpstreamError::ConnectTimeout { address, timeout }),
        }
    }
    match last {
        Some(e) => failed(decision, e),
        None => {
            let e = UpstreamError::NoAddress {
                host: decision.host.clone(),
            };
            failed(decision, e)
        }
    }
}

fn refused(mut d: EgressDecision, reason: agentdiff_policy::egress::HostError) -> EgressDecision {
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
