//! Bounds on the dashboard's connections, so idle or slow clients cannot use up the server.
//!
//! Without them, every idle connection held a descriptor for ever: about a thousand of them (the
//! usual descriptor limit) and the server could accept nothing else. Now:
//! - a connection has [`Limits::header_timeout`] to send a request's header, counted from when it
//!   waits for one: on connect and again after each response (hyper's header read timeout), so an
//!   idle keep-alive connection is closed after the same time;
//! - at most [`Limits::max_connections`] are open (never more than half the descriptor limit). A
//!   connection beyond that closes the oldest one that is not in a request (waiting for a header,
//!   or idle between requests); when every one is in a request (an event stream, say), the new
//!   connection is closed at once. An event stream needs the token, so a client without it can
//!   only hold connections that the next one replaces.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Bytes, Frame};
use tokio::sync::Notify;

use super::Body;

/// The connection bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest wait for a request's header (on connect and between keep-alive requests).
    pub header_timeout: Duration,
}

/// Default [`Limits::max_connections`].
pub const MAX_CONNECTIONS: usize = 256;
/// Default [`Limits::header_timeout`].
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            header_timeout: HEADER_TIMEOUT,
        }
    }
}

impl Limits {
    /// These limits with the connection cap lowered to half this process's descriptor limit:
    /// the rest is left for the store's files, the runtime and the listeners.
    pub fn within_descriptor_limit(self) -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit only writes the struct it is given, which lives for the call.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0;
        let half = usize::try_from(limit.rlim_cur / 2).unwrap_or(usize::MAX);
        Limits {
            max_connections: if read {
                self.max_connections.min(half).max(1)
            } else {
                self.max_connections
            },
            ..self
        }
    }
}

struct Slot {
    /// Requests in progress on the connection (hyper serves one at a time on HTTP/1).
    busy: Arc<AtomicUsize>,
    close: Arc<Notify>,
}

/// The open connections, oldest first.
pub struct Connections {
    limits: Limits,
    open: Mutex<(u64, BTreeMap<u64, Slot>)>,
}

/// A connection let in: its id, its request counter and the signal that closes it.
pub struct Admitted {
    pub id: u64,
    pub busy: Arc<AtomicUsize>,
    pub close: Arc<Notify>,
}

impl Connections {
    pub fn new(limits: Limits) -> Self {
        Connections {
            limits,
            open: Mutex::new((0, BTreeMap::new())),
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Lets a new connection in, closing the oldest connection not in a request when all slots
    /// are taken; `None` (close the new one) when every open connection is in a request.
    pub fn admit(&self) -> Option<Admitted> {
        let mut guard = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, open) = &mut *guard;
        if open.len() >= self.limits.max_connections {
            let idle = open
                .iter()
                .find(|(_, slot)| slot.busy.load(Ordering::SeqCst) == 0)
                .map(|(id, _)| *id)?;
            if let Some(slot) = open.remove(&idle) {
                slot.close.notify_one();
            }
        }
        let id = *next;
        *next += 1;
        let slot = Slot {
            busy: Arc::new(AtomicUsize::new(0)),
            close: Arc::new(Notify::new()),
        };
        let admitted = Admitted {
            id,
            busy: Arc::clone(&slot.busy),
            close: Arc::clone(&slot.close),
        };
        open.insert(id, slot);
        Some(admitted)
    }

    /// Forgets a connection that ended.
    pub fn release(&self, id: u64) {
        let mut guard = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        guard.1.remove(&id);
    }
}

/// Counts a request in progress on its connection until dropped (with the response body, once
/// hyper has written it or the client went away).
pub struct InRequest(Arc<AtomicUsize>);

impl InRequest {
    pub fn enter(busy: &Arc<AtomicUsize>) -> Self {
        busy.fetch_add(1, Ordering::SeqCst);
        InRequest(Arc::clone(busy))
    }
}

impl Drop for InRequest {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its connection counted as in a request while it is sent.
pub struct Tracked {
    pub body: Body,
    pub _request: InRequest,
}

impl hyper::body::Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        hyper::body::Body::poll_frame(Pin::new(&mut self.get_mut().body), cx)
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.body)
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::Body::size_hint(&self.body)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_full_table_closes_the_oldest_idle_connection_or_refuses() {
        let conns = Connections::new(Limits {
            max_connections: 2,
            header_timeout: HEADER_TIMEOUT,
        });
        let a = conns.admit().unwrap();
        let b = conns.admit().unwrap();
        let _in_a = InRequest::enter(&a.busy);
        // `a` is in a request: `b`, the oldest idle one, is closed for `c`.
        let c = conns.admit().unwrap();
        assert_eq!(Arc::strong_count(&b.close), 1, "b's slot is gone");
        let _in_c = InRequest::enter(&c.busy);
        // Both open connections are in requests: the new one is refused.
        assert!(conns.admit().is_none());
        conns.release(a.id);
        assert!(conns.admit().is_some());
    }
}
