//! HTTP proxy requests: `CONNECT host:port` and requests with an absolute `http://` URI.
//!
//! Invariants: the request head is read to at most [`MAX_HEAD`] bytes; the host decided is the
//! one in the request line (a `Host` header is never consulted), and the bytes that follow go to
//! that host only. An absolute request is rewritten to origin form with the target's `Host`,
//! `Connection: close` and without the proxy's own headers, so the upstream serves the decided
//! host and ends the connection after its response (a second request the client pipelines
//! still reaches only that address).
//!
//! Not handled: `https://` absolute URIs (clients use `CONNECT` for them), proxy
//! authentication (the proxy is reachable only through the run's socket), HTTP/2 prior
//! knowledge.

use agentdiff_policy::egress::split_port;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest request head read.
pub(crate) const MAX_HEAD: usize = 64 * 1024;
const MAX_HEADERS: usize = 128;

/// Why a request cannot be served. Each message is sent back to the client.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HeadError {
    #[error("the request head is larger than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("the connection closed before a whole request head")]
    Truncated,
    #[error("reading the request failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("not an HTTP/1 request: {0}")]
    Parse(#[from] httparse::Error),
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Host(#[from] agentdiff_policy::egress::HostError),
}

/// A parsed proxy request.
#[derive(Debug)]
pub(crate) struct HttpRequest {
    pub(crate) connect: bool,
    pub(crate) host: String,
    pub(crate) port: u16,
    /// Bytes to send upstream before relaying: the rewritten head and any body already read
    /// (for `CONNECT`, only bytes the client sent after the head).
    pub(crate) upstream: Vec<u8>,
}

/// Read a request head that starts with `buf` (already read from `client`).
pub(crate) async fn read<S: AsyncRead + Unpin>(
    client: &mut S,
    mut buf: Vec<u8>,
) -> Result<HttpRequest, HeadError> {
    loop {
        if let Some(end) = find_head_end(&buf) {
            return parse(&buf[..end], &buf[end..]);
        }
        if buf.len() >= MAX_HEAD {
            return Err(HeadError::TooLarge);
        }
        let mut chunk = [0u8; 4096];
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(HeadError::Truncated);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn parse(head: &[u8], rest: &[u8]) -> Result<HttpRequest, HeadError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    if req.parse(head)?.is_partial() {
        return Err(HeadError::Truncated);
    }
    let unsupported = |s: String| Err(HeadError::Unsupported(s));
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(HeadError::Truncated);
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) = split_port(target)?;
        let Some(port) = port else {
            return unsupported(format!("CONNECT {target:?} names no port"));
        };
        return Ok(HttpRequest {
            connect: true,
            host: host.to_owned(),
            port,
            upstream: rest.to_vec(),
        });
    }
    let lower = target.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return unsupported(
            "an https:// URI must go through CONNECT (set HTTPS_PROXY to this proxy)".to_owned(),
        );
    }
    if !lower.starts_with("http://") {
        return unsupported(format!(
            "{target:?} is not an absolute http:// URI; this is a proxy (use it as HTTP_PROXY)"
        ));
    }
    let after = &target["http://".len()..];
    let cut = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, path) = after.split_at(cut);
    if authority.contains('@') {
        return unsupported("credentials in the URI are not forwarded".to_owned());
    }
    let (host, port) = split_port(authority)?;
    let path = match path {
        "" => "/".to_owned(),
        p if p.starts_with('/') => p.to_owned(),
        p => format!("/{p}"),
    };
    // RFC 9112 §3.2.2: a proxy replaces the Host header by the request target's authority, so
    // the upstream serves the host that was decided, never another name behind the same
    // address (a virtual host, a CDN's other customers).
    let mut out = format!("{method} {path} HTTP/1.{version}\r\nHost: {authority}\r\n").into_bytes();
    for h in req.headers.iter() {
        let name = h.name.to_ascii_lowercase();
        if matches!(
            name.as_str(),
            "host" | "proxy-connection" | "proxy-authorization" | "connection" | "keep-alive"
        ) {
            continue;
        }
        out.extend_from_slice(h.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(h.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
    out.extend_from_slice(rest);
    Ok(HttpRequest {
        connect: false,
        host: host.to_owned(),
        port: port.unwrap_or(80),
        upstream: out,
    })
}

/// A short plain-text response that ends the connection.
pub(crate) fn response(status: &str, rule: Option<&str>, body: &str) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len() + 1
    );
    if let Some(rule) = rule {
        head.push_str(&format!("X-Agentdiff-Rule: {rule}\r\n"));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.as_bytes());
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any head a client sends is answered or refused, never a panic; a forwarded request
        /// always goes out in origin form with `Connection: close`.
        #[test]
        fn any_head_is_parsed_or_refused(head in proptest::collection::vec(any::<u8>(), 0..300),
                                         target in "[a-zA-Z0-9:/.\\[\\]@?#%*-]{0,40}") {
            let mut bytes = head;
            bytes.extend_from_slice(b"\r\n\r\n");
            let _ = parse(&bytes, b"");
            let text = format!("GET {target} HTTP/1.1\r\nHost: x\r\n\r\n");
            if let Ok(r) = parse(text.as_bytes(), b"") {
                let out = String::from_utf8_lossy(&r.upstream).into_owned();
                prop_assert!(out.starts_with("GET /"), "{}", out);
                prop_assert!(out.ends_with("Connection: close\r\n\r\n"), "{}", out);
                prop_assert!(!r.host.is_empty() || !r.connect);
            }
        }
    }

    fn req(text: &str) -> Result<HttpRequest, HeadError> {
        let end = find_head_end(text.as_bytes()).unwrap();
        parse(&text.as_bytes()[..end], &text.as_bytes()[end..])
    }

    #[test]
    fn connect_and_absolute_requests() {
        let r = req("CONNECT Example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(r.connect);
        assert_eq!((r.host.as_str(), r.port), ("Example.com", 443));
        let r = req("CONNECT [::1]:8443 HTTP/1.1\r\n\r\nearly").unwrap();
        assert_eq!((r.host.as_str(), r.port), ("::1", 8443));
        assert_eq!(r.upstream, b"early");
        let r = req(
            "POST http://a.test:8080/p?q=1 HTTP/1.1\r\nHost: other.test\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi",
        )
        .unwrap();
        assert!(!r.connect);
        assert_eq!((r.host.as_str(), r.port), ("a.test", 8080));
        assert_eq!(
            String::from_utf8(r.upstream).unwrap(),
            "POST /p?q=1 HTTP/1.1\r\nHost: a.test:8080\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi"
        );
        let r = req("GET http://a.test HTTP/1.0\r\n\r\n").unwrap();
        assert_eq!(r.port, 80);
        assert!(String::from_utf8(r.upstream)
            .unwrap()
            .starts_with("GET / HTTP/1.0\r\n"));
    }

    #[test]
    fn what_is_refused() {
        for text in [
            "GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET https://a.test/ HTTP/1.1\r\n\r\n",
            "GET http://u:p@a.test/ HTTP/1.1\r\n\r\n",
            "CONNECT a.test HTTP/1.1\r\n\r\n",
            "CONNECT a.test:0 HTTP/1.1\r\n\r\n",
            "GET http://a.test:99999/ HTTP/1.1\r\n\r\n",
            "G\0T x HTTP/1.1\r\n\r\n",
        ] {
            assert!(req(text).is_err(), "{text:?}");
        }
    }
}
