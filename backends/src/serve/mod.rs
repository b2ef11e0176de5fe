//! The local dashboard's HTTP server (`agentdiff serve`): hyper 1 HTTP/1 on the tokio runtime
//! already in the tree, listening on loopback only.
//!
//! Routes (GET only; read-only):
//! - `/?token=T` — every agent session and run in the store, and the live feed;
//! - `/run/ID?token=T` — the run's HTML report;
//! - `/session/ID?token=T` — an agent session: its calls, its changes with the calls each is
//!   attributed to, links to its runs;
//! - `/events` with `Authorization: Bearer T` or `?token=T` — server-sent events of runs in
//!   progress (the new lines of their `events.jsonl`, and their outcome once sealed).
//!
//! Every request is checked, in this order: the `Host` header names a loopback address with this
//! port ([`auth::host_allowed`]), then the token ([`auth::Token::matches`]). Responses carry no
//! CORS header, `Cache-Control: no-store`, `Referrer-Policy: no-referrer`, `nosniff` and a
//! frame-ancestors policy, so another site can neither read nor frame a page.

pub mod auth;
pub mod conns;

use std::convert::Infallible;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Bytes, Frame};
use hyper::header::{HeaderValue, AUTHORIZATION, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use agentdiff_report::live::LiveTail;
use agentdiff_report::session::{self, SessionViewError};
use agentdiff_report::{dashboard, listing};
use agentdiff_store::{Store, StoreError};

use auth::Token;
use conns::{Connections, InRequest, Tracked};

/// How often the event stream looks for new events.
const POLL: Duration = Duration::from_millis(250);
/// A comment line this often keeps proxies from closing an idle stream and notices a gone client.
const KEEPALIVE: Duration = Duration::from_secs(15);

/// A response body: whole, or a stream of server-sent events.
pub enum Body {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Bytes>),
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            Body::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Body::Stream(rx) => rx.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Body::Full(None))
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        match self {
            Body::Full(b) => {
                hyper::body::SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64))
            }
            Body::Stream(_) => hyper::body::SizeHint::default(),
        }
    }
}

/// What every request handler shares.
pub struct Server {
    pub store: Store,
    pub token: Token,
    pub port: u16,
}

fn response(status: StatusCode, content_type: &'static str, body: Body) -> Response<Body> {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert("content-type", HeaderValue::from_static(content_type));
    h.insert("cache-control", HeaderValue::from_static("no-store"));
    h.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        "content-security-policy",
        HeaderValue::from_static("frame-ancestors 'none'"),
    );
    r
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    response(
        status,
        "text/plain; charset=utf-8",
        Body::Full(Some(Bytes::from(format!("{message}\n")))),
    )
}

fn page(html: String) -> Response<Body> {
    response(
        StatusCode::OK,
        "text/html; charset=utf-8",
        Body::Full(Some(Bytes::from(html))),
    )
}

impl Server {
    /// Checks a request and routes it.
    pub async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Result<Response<Body>, Infallible> {
        let header = |name| req.headers().get(name).and_then(|v| v.to_str().ok());
        // Two Host headers are ambiguous: a proxy in front may route by the other one.
        if req.headers().get_all(HOST).iter().nth(1).is_some() {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                "bad request: more than one Host header",
            ));
        }
        let host_ok = auth::host_allowed(header(HOST), self.port)
            && req
                .uri()
                .authority()
                .map_or(true, |a| auth::host_allowed(Some(a.as_str()), self.port));
        if !host_ok {
            return Ok(text(
                StatusCode::FORBIDDEN,
                "forbidden: the Host header must name this server by a loopback address \
                 (127.0.0.1, localhost or [::1]) and its port",
            ));
        }
        if req.method() != Method::GET {
            return Ok(text(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: the dashboard is read-only (GET only)",
            ));
        }
        let path = req.uri().path().to_string();
        let query = auth::query_token(req.uri().query());
        // Pages take the token from the query; the event stream also from a bearer header.
        let presented = if path == "/events" {
            auth::bearer_token(header(AUTHORIZATION)).or(query)
        } else {
            query
        };
        if !presented.is_some_and(|t| self.token.matches(t)) {
            return Ok(text(
                StatusCode::UNAUTHORIZED,
                "unauthorized: a missing or wrong token; open the URL `agentdiff serve` printed",
            ));
        }
        let server = Arc::clone(&self);
        let routed = tokio::task::spawn_blocking(move || server.route(&path)).await;
        Ok(match routed {
            Ok(Route::Page(r)) => r,
            Ok(Route::Events) => self.events(),
            Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "internal error"),
        })
    }

    fn route(&self, path: &str) -> Route {
        if path == "/events" {
            return Route::Events;
        }
        if path == "/" {
            // The same verifying listing as `agentdiff runs`, with the same key and ledger.
            let (ctx, _) = crate::common::context::verify_context(self.store.root());
            let listed = listing::list(&self.store, &ctx).and_then(|runs| {
                let sessions = session::list(&self.store, &session::agent_runs)?;
                Ok((runs, sessions))
            });
            return Route::Page(match listed {
                Ok((runs, sessions)) => {
                    page(dashboard::index(&runs, &sessions, self.token.as_str()))
                }
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            });
        }
        if let Some(id) = path.strip_prefix("/session/") {
            return Route::Page(self.session_page(id));
        }
        let Some(id) = path.strip_prefix("/run/") else {
            return Route::Page(text(StatusCode::NOT_FOUND, "not found"));
        };
        let capsule = match self.store.open_run(id) {
            Ok(c) => c,
            Err(e) => return Route::Page(store_error_page(e)),
        };
        let back = format!("/?token={}", self.token.as_str());
        Route::Page(
            match crate::common::context::html_report(&self.store, &capsule, Some(&back)) {
                Ok(html) => page(html),
                Err(e) => text(
                    StatusCode::CONFLICT,
                    &escape_plain(&crate::common::exit::chain_text(&e)),
                ),
            },
        )
    }

    /// A session's page (404 for an unknown id or a run that is not a session).
    fn session_page(&self, id: &str) -> Response<Body> {
        let shown = session::open(&self.store, id).and_then(|(capsule, metadata)| {
            session::view(&capsule, metadata, &session::agent_runs)
        });
        match shown {
            Ok(view) => page(dashboard::session_page(&view, self.token.as_str())),
            Err(SessionViewError::Store(e)) => store_error_page(e),
            Err(e @ SessionViewError::NotASession { .. }) => {
                text(StatusCode::NOT_FOUND, &escape_plain(&e.to_string()))
            }
            Err(e) => text(StatusCode::CONFLICT, &escape_plain(&e.to_string())),
        }
    }

    /// The event stream: a task polls the store and feeds the response body until the client goes.
    fn events(self: &Arc<Self>) -> Response<Body> {
        let (tx, rx) = mpsc::channel::<Bytes>(64);
        let server = Arc::clone(self);
        tokio::spawn(async move {
            if tx
                .send(Bytes::from_static(b": connected\n\n"))
                .await
                .is_err()
            {
                return;
            }
            let store = server.store.clone();
            let started = tokio::task::spawn_blocking(move || {
                LiveTail::start(&store).map(|tail| (tail, store))
            })
            .await;
            let Ok(Ok((mut tail, store))) = started else {
                let _ = tx
                    .send(Bytes::from_static(
                        b"event: error\ndata: {\"text\":\"cannot read the store\"}\n\n",
                    ))
                    .await;
                return;
            };
            let mut idle = Duration::ZERO;
            while !tx.is_closed() {
                let polled = tokio::task::block_in_place(|| tail.poll(&store));
                let mut chunk = String::new();
                if let Ok(updates) = polled {
                    for u in &updates {
                        chunk.push_str(&format!(
                            "event: run\ndata: {}\n\n",
                            dashboard::live_data(u)
                        ));
                    }
                }
                if chunk.is_empty() && idle >= KEEPALIVE {
                    chunk.push_str(": keepalive\n\n");
                }
                if chunk.is_empty() {
                    idle += POLL;
                } else {
                    idle = Duration::ZERO;
                    if tx.send(Bytes::from(chunk)).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(POLL).await;
            }
        });
        let mut r = response(StatusCode::OK, "text/event-stream", Body::Stream(rx));
        r.headers_mut()
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
        r
    }
}

enum Route {
    Page(Response<Body>),
    Events,
}

/// A capsule that cannot be opened: 404 for an unknown or invalid id, 500 otherwise.
fn store_error_page(e: StoreError) -> Response<Body> {
    match e {
        e @ (StoreError::InvalidRunId { .. } | StoreError::RunNotFound { .. }) => {
            text(StatusCode::NOT_FOUND, &escape_plain(&e.to_string()))
        }
        e => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            &escape_plain(&e.to_string()),
        ),
    }
}

/// Error text in a plain-text response: control characters made visible.
fn escape_plain(s: &str) -> String {
    agentdiff_host::redact::escape_terminal(s)
}

/// The loopback listeners: 127.0.0.1 on `port` (0: the system picks), then `[::1]` on the same
/// port when this host has IPv6 loopback (said on stderr when not).
pub async fn listen(port: u16) -> std::io::Result<(Vec<TcpListener>, u16)> {
    let v4 = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await?;
    let port = v4.local_addr()?.port();
    let mut listeners = vec![v4];
    match TcpListener::bind(SocketAddr::from((Ipv6Addr::LOCALHOST, port))).await {
        Ok(v6) => listeners.push(v6),
        Err(e) => errln!("agentdiff: serve: not listening on [::1]:{port} ({e}); 127.0.0.1 only"),
    }
    Ok((listeners, port))
}

/// Serves connections from `listener` until the task is dropped, within the bounds of `conns`
/// (shared by every listener).
pub async fn accept_loop(server: Arc<Server>, listener: TcpListener, conns: Arc<Connections>) {
    let header_timeout = conns.limits().header_timeout;
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of descriptors or similar: wait instead of spinning.
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // Every open connection is in a request: this one is closed at once (dropped).
        let Some(admitted) = conns.admit() else {
            continue;
        };
        let server = Arc::clone(&server);
        let conns = Arc::clone(&conns);
        tokio::spawn(async move {
            let busy = admitted.busy;
            let service = hyper::service::service_fn(move |req| {
                let request = InRequest::enter(&busy);
                let server = Arc::clone(&server);
                async move {
                    let response = server.handle(req).await?;
                    Ok::<_, Infallible>(response.map(|body| Tracked {
                        body,
                        _request: request,
                    }))
                }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                // Replaced by a newer connection while idle: dropping it closes the socket.
                () = admitted.close.notified() => {}
            }
            conns.release(admitted.id);
        });
    }
}
