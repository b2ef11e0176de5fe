//! The proxy against servers on this machine: HTTP, CONNECT and SOCKS5, allowed and denied,
//! the internal-address check, the flood bound, stop.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use agentdiff_egress::{
    Bind, Bounds, EgressLog, Outcome, Protocol, Proxy, ProxyConfig, ProxyError, ProxyThread,
    Resolve, ResolveFuture,
};
use agentdiff_policy::{Action, Egress, Policy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

/// Names mapped by the test, nothing else resolves.
struct Map(HashMap<&'static str, IpAddr>);

impl Resolve for Map {
    fn resolve<'a>(&'a self, name: &'a str, _port: u16) -> ResolveFuture<'a> {
        Box::pin(async move {
            self.0
                .get(name)
                .map(|a| vec![*a])
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "unknown test name"))
        })
    }
}

fn egress(allow: &[&str], deny: &[&str]) -> Egress {
    let list = |l: &[&str]| {
        l.iter()
            .map(|p| format!("\"{p}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let doc = format!(
        "version: 2\nnetwork:\n  egress:\n    allow: [{}]\n    deny: [{}]\n",
        list(allow),
        list(deny)
    );
    Policy::from_yaml_or_json(&doc, "test.yaml")
        .unwrap()
        .egress()
        .clone()
}

fn resolver() -> Arc<dyn Resolve> {
    let lo: IpAddr = "127.0.0.1".parse().unwrap();
    Arc::new(Map(HashMap::from([
        ("allowed.test", lo),
        ("denied.test", lo),
        ("rebind.test", lo),
        ("metadata.test", "169.254.169.254".parse().unwrap()),
    ])))
}

async fn start(egress: Egress, config: ProxyConfig) -> Proxy {
    Proxy::start(
        egress,
        resolver(),
        config,
        Bind::Tcp("127.0.0.1:0".parse().unwrap()),
    )
    .await
    .unwrap()
}

/// A server that echoes every byte; reports each connection it accepts.
async fn echo_server() -> (SocketAddr, mpsc::UnboundedReceiver<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let _ = tx.send(());
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, rx)
}

/// An HTTP server that answers `hello` and reports the request head it got.
async fn http_server() -> (SocketAddr, mpsc::UnboundedReceiver<String>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = s.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
                    .await;
            });
        }
    });
    (addr, rx)
}

async fn read_all(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

async fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        buf.push(byte[0]);
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Wait until every record has ended (the relays notice a closed client on their own).
async fn settled(proxy: Proxy) -> EgressLog {
    for _ in 0..200 {
        if proxy
            .snapshot()
            .records
            .iter()
            .all(|r| r.ended_at.is_some())
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    proxy.stop().await
}

fn only(log: &EgressLog) -> &agentdiff_egress::ConnectionRecord {
    assert_eq!(log.records.len(), 1, "{log:#?}");
    &log.records[0]
}

#[tokio::test]
async fn absolute_http_requests_are_decided_rewritten_and_counted() {
    let (server, mut heads) = http_server().await;
    let proxy = start(
        egress(&["allowed.test", "127.0.0.1"], &[]),
        ProxyConfig::default(),
    )
    .await;
    let mut c = TcpStream::connect(proxy.tcp_addr().unwrap()).await.unwrap();
    let req = format!(
        "GET http://allowed.test:{}/a?b HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\n\r\n",
        server.port()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let answer = read_all(&mut c).await;
    assert!(answer.ends_with("hello"), "{answer}");
    let head = heads.recv().await.unwrap();
    assert!(head.starts_with("GET /a?b HTTP/1.1\r\n"), "{head}");
    assert!(head.contains("Connection: close"), "{head}");
    // The upstream is told the decided host, whatever Host header the client sent.
    let host = format!("\r\nHost: allowed.test:{}\r\n", server.port());
    assert!(head.contains(&host), "{head}");
    assert!(!head.contains("evil.test"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("proxy-connection"),
        "{head}"
    );
    drop(c);
    let log = settled(proxy).await;
    let r = only(&log);
    assert_eq!(r.protocol, Protocol::Http);
    assert_eq!((r.host.as_str(), r.port), ("allowed.test", server.port()));
    assert_eq!(
        (r.action, r.rule.as_str()),
        (Action::Allow, "network.egress.allow[0]")
    );
    assert_eq!(r.address.as_deref(), Some(server.to_string().as_str()));
    assert_eq!(r.bytes_up, head.len() as u64);
    assert_eq!(r.bytes_down, answer.len() as u64);
    assert!(r.ended_at.is_some() && r.error.is_none(), "{r:#?}");
    assert_eq!((log.total, log.allowed, log.denied), (1, 1, 0));
}

#[tokio::test]
async fn connect_tunnels_an_allowed_name_and_refuses_others() {
    let (server, mut accepted) = echo_server().await;
    let proxy = start(
        egress(&["allowed.test", "127.0.0.1"], &[]),
        ProxyConfig::default(),
    )
    .await;
    let addr = proxy.tcp_addr().unwrap();

    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!("CONNECT allowed.test:{} HTTP/1.1\r\n\r\n", server.port());
    c.write_all(req.as_bytes()).await.unwrap();
    let head = read_head(&mut c).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    c.write_all(b"ping-pong").await.unwrap();
    let mut back = [0u8; 9];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"ping-pong");
    drop(c);
    accepted.recv().await.unwrap();

    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!("CONNECT denied.test:{} HTTP/1.1\r\n\r\n", server.port());
    c.write_all(req.as_bytes()).await.unwrap();
    let answer = read_all(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(
        answer.contains("X-Agentdiff-Rule: network.egress.default"),
        "{answer}"
    );
    // The echo server never saw the denied attempt.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(accepted.try_recv().is_err());

    let log = proxy.stop().await;
    assert_eq!((log.total, log.allowed, log.denied), (2, 1, 1), "{log:#?}");
    let tunnel = &log.records[0];
    assert_eq!(tunnel.protocol, Protocol::Connect);
    assert_eq!((tunnel.bytes_up, tunnel.bytes_down), (9, 9));
    let denied = &log.records[1];
    assert_eq!(
        (denied.action, denied.rule.as_str(), denied.host.as_str()),
        (Action::Deny, "network.egress.default", "denied.test")
    );
    assert!(denied.address.is_none());
    let hosts: Vec<_> = log
        .destinations
        .iter()
        .map(|d| (d.host.as_str(), d.action, d.attempts, d.connected))
        .collect();
    assert_eq!(
        hosts,
        [
            ("allowed.test", Action::Allow, 1, 1),
            ("denied.test", Action::Deny, 1, 0)
        ]
    );
    assert_eq!(
        (tunnel.outcome, denied.outcome),
        (Some(Outcome::Relayed), Some(Outcome::Refused))
    );
}

async fn socks_connect(proxy: SocketAddr, host: &str, port: u16) -> (TcpStream, u8) {
    let mut c = TcpStream::connect(proxy).await.unwrap();
    c.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0u8; 2];
    c.read_exact(&mut method).await.unwrap();
    assert_eq!(method, [5, 0]);
    let mut req = vec![5, 1, 0, 3, host.len() as u8];
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&port.to_be_bytes());
    c.write_all(&req).await.unwrap();
    let mut reply = [0u8; 10];
    c.read_exact(&mut reply).await.unwrap();
    (c, reply[1])
}

#[tokio::test]
async fn socks5_resolves_names_in_the_proxy() {
    let (server, _accepted) = echo_server().await;
    let proxy = start(
        egress(&["*.test", "127.0.0.1"], &["denied.test"]),
        ProxyConfig::default(),
    )
    .await;
    let addr = proxy.tcp_addr().unwrap();
    let (mut c, code) = socks_connect(addr, "allowed.test", server.port()).await;
    assert_eq!(code, 0);
    c.write_all(b"abc").await.unwrap();
    let mut back = [0u8; 3];
    c.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"abc");
    drop(c);
    let (_, code) = socks_connect(addr, "denied.test", server.port()).await;
    assert_eq!(code, 2, "connection not allowed by ruleset");
    // UDP ASSOCIATE is refused: nothing but TCP is relayed.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(&[5, 1, 0]).await.unwrap();
    let mut method = [0u8; 2];
    c.read_exact(&mut method).await.unwrap();
    c.write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0]).await.unwrap();
    let mut reply = [0u8; 10];
    c.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[1], 7, "command not supported");
    drop(c);
    let log = proxy.stop().await;
    assert_eq!(
        (log.allowed, log.denied, log.malformed),
        (1, 1, 1),
        "{log:#?}"
    );
    assert_eq!(log.records[1].rule, "network.egress.deny[0]");
    assert_eq!(log.records[0].protocol, Protocol::Socks5);
}

#[tokio::test]
async fn internal_addresses_are_refused_unless_listed() {
    let (server, mut accepted) = echo_server().await;
    // The name is allowed, its loopback address is not listed: DNS rebinding reaches nothing.
    let proxy = start(egress(&["*.test"], &[]), ProxyConfig::default()).await;
    let addr = proxy.tcp_addr().unwrap();
    for host in ["rebind.test", "metadata.test"] {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let req = format!("CONNECT {host}:{} HTTP/1.1\r\n\r\n", server.port());
        c.write_all(req.as_bytes()).await.unwrap();
        let answer = read_all(&mut c).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
    }
    // An address literal is decided by address patterns only.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"CONNECT 169.254.169.254:80 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert!(read_all(&mut c).await.starts_with("HTTP/1.1 403"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(accepted.try_recv().is_err());
    let log = proxy.stop().await;
    let rules: Vec<_> = log.records.iter().map(|r| r.rule.as_str()).collect();
    assert_eq!(
        rules,
        [
            "network.egress.internal_address",
            "network.egress.internal_address",
            "network.egress.default"
        ]
    );
    assert!(
        log.records[1].reason.contains("metadata"),
        "{:?}",
        log.records[1]
    );
}

/// Junk refused hosts first, then repeats to one refused host, then an allowed tunnel that
/// moves bytes: the allowed host is listed with its bytes, the totals and the omitted counts
/// are exact, and repeats never cost an entry.
#[tokio::test]
async fn a_flood_of_refusals_cannot_hide_an_allowed_connection() {
    let (server, _accepted) = echo_server().await;
    let config = ProxyConfig {
        bounds: Bounds {
            max_records: 3,
            max_destinations: 4,
        },
        ..ProxyConfig::default()
    };
    let proxy = start(egress(&["127.0.0.1"], &[]), config).await;
    let addr = proxy.tcp_addr().unwrap();
    let refused = |host: String| async move {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let req = format!("CONNECT {host}:443 HTTP/1.1\r\n\r\n");
        c.write_all(req.as_bytes()).await.unwrap();
        assert!(read_all(&mut c).await.starts_with("HTTP/1.1 403"));
    };
    for i in 0..10 {
        refused(format!("junk{i}.test")).await;
    }
    for _ in 0..6 {
        refused("paste-site.test".to_owned()).await;
    }
    let mut c = TcpStream::connect(addr).await.unwrap();
    let req = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", server.port());
    c.write_all(req.as_bytes()).await.unwrap();
    assert!(read_head(&mut c).await.starts_with("HTTP/1.1 200"));
    let payload = vec![7u8; 190_000];
    c.write_all(&payload).await.unwrap();
    let mut back = vec![0u8; payload.len()];
    c.read_exact(&mut back).await.unwrap();
    drop(c);
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"nonsense\r\n\r\n").await.unwrap();
    assert!(read_all(&mut c).await.starts_with("HTTP/1.1 400"));
    let log = settled(proxy).await;
    assert_eq!(
        (log.total, log.denied, log.allowed, log.malformed),
        (17, 16, 1, 1)
    );
    assert_eq!((log.bytes_up, log.bytes_down), (190_000, 190_000));
    let listed = log
        .destinations
        .iter()
        .find(|d| d.host == "127.0.0.1")
        .expect("the allowed connection is listed");
    assert_eq!((listed.bytes_up, listed.connected), (190_000, 1));
    // 4 refused destinations listed; 6 junk hosts and paste-site.test (6 attempts) are not.
    let o = &log.omitted.denied;
    assert_eq!((o.attempts, o.hosts, o.destinations), (12, 7, 7));
    // The destination the flood repeats beyond the bound is still named, with its count.
    let top = &o.frequent[0];
    assert_eq!(
        (top.host.as_str(), top.port, top.min_attempts),
        ("paste-site.test", 443, 6)
    );
    let counted: u64 = log.destinations.iter().map(|d| d.attempts).sum();
    assert_eq!(counted + o.attempts, log.total);
    // Records: the first 3 refused, and the allowed one in a bound of its own.
    assert_eq!((log.records.len(), log.records_omitted), (4, 13));
    assert_eq!(log.records[3].host, "127.0.0.1");
}

/// Resolves `slow.test` only after a long time (a DNS answer that has not come yet).
struct Slow;

impl Resolve for Slow {
    fn resolve<'a>(&'a self, name: &'a str, _port: u16) -> ResolveFuture<'a> {
        Box::pin(async move {
            if name == "slow.test" {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Ok(vec!["127.0.0.1".parse().unwrap()])
        })
    }
}

/// A client that asks for a slow name and leaves: the attempt is in the log from the moment
/// its request was read, and stopping the proxy closes it as undecided (`review`), not as
/// nothing. A request still being read is counted too.
#[tokio::test]
async fn attempts_still_resolving_when_the_proxy_stops_are_recorded() {
    let proxy = Proxy::start(
        egress(&["*"], &[]),
        Arc::new(Slow),
        ProxyConfig::default(),
        Bind::Tcp("127.0.0.1:0".parse().unwrap()),
    )
    .await
    .unwrap();
    let addr = proxy.tcp_addr().unwrap();
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"CONNECT slow.test:443 HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"CONNECT half.test:443 HTTP/1.1\r\n")
        .await
        .unwrap();
    // Answered after the half-sent request's connection was accepted (accepts are in order).
    let (mut s, reply) = socks_connect(addr, "denied.0x1", 443).await;
    assert_eq!(reply, 2, "a name ending in a number is refused");
    drop(s.shutdown().await);
    // The attempt is visible while it is still resolving.
    let mut live = proxy.snapshot();
    for _ in 0..100 {
        if live.total == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        live = proxy.snapshot();
    }
    assert_eq!(live.total, 2, "{live:#?}");
    drop(c);
    let log = proxy.stop().await;
    assert_eq!(
        (log.total, log.allowed, log.denied, log.undecided),
        (2, 0, 1, 1)
    );
    assert_eq!((log.in_flight_at_exit, log.unread_at_exit), (1, 1));
    let r = log.records.iter().find(|r| r.host == "slow.test").unwrap();
    assert_eq!(
        (r.action, r.outcome, r.rule.as_str()),
        (
            Action::Review,
            Some(Outcome::InFlightAtExit),
            "network.egress.allow[0]"
        )
    );
    assert!(r.reason.contains("never checked"), "{}", r.reason);
    assert!(r.ended_at.is_some() && r.address.is_none(), "{r:#?}");
    let d = log
        .destinations
        .iter()
        .find(|d| d.host == "slow.test")
        .unwrap();
    assert_eq!((d.action, d.in_flight_at_exit), (Action::Review, 1));
}

/// Hosts the C resolver reads as IPv4 addresses are decided as those addresses, whatever way
/// the client names them, and are never handed to the resolver.
#[tokio::test]
async fn inet_aton_hosts_are_addresses_not_names() {
    let (server, _accepted) = echo_server().await;
    let port = server.port();
    let proxy = start(egress(&["*"], &[]), ProxyConfig::default()).await;
    let addr = proxy.tcp_addr().unwrap();
    for host in ["0x7f000001", "127.0.0.0x1", "0x7f.0x1", "0177.1", "127.1."] {
        let mut c = TcpStream::connect(addr).await.unwrap();
        let req = format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n");
        c.write_all(req.as_bytes()).await.unwrap();
        let answer = read_all(&mut c).await;
        assert!(answer.starts_with("HTTP/1.1 403"), "{host}: {answer}");
        let mut c = TcpStream::connect(addr).await.unwrap();
        let req = format!("GET http://{host}:{port}/ HTTP/1.1\r\n\r\n");
        c.write_all(req.as_bytes()).await.unwrap();
        assert!(read_all(&mut c).await.starts_with("HTTP/1.1 403"), "{host}");
        let (_s, reply) = socks_connect(addr, host, port).await;
        assert_eq!(reply, 2, "{host}");
    }
    let log = proxy.stop().await;
    assert_eq!((log.total, log.denied), (15, 15));
    for r in &log.records {
        assert_eq!(
            (r.host.as_str(), r.rule.as_str()),
            ("127.0.0.1", "network.egress.default"),
            "{r:#?}"
        );
        assert!(r.reason.contains("inet_aton"), "{}", r.reason);
    }
    // Written out as an address pattern, the same spelling reaches that address.
    let proxy = start(egress(&["*", "127.0.0.1"], &[]), ProxyConfig::default()).await;
    let mut c = TcpStream::connect(proxy.tcp_addr().unwrap()).await.unwrap();
    let req = format!("CONNECT 0x7f.0x1:{port} HTTP/1.1\r\n\r\n");
    c.write_all(req.as_bytes()).await.unwrap();
    assert!(read_head(&mut c).await.starts_with("HTTP/1.1 200"));
    drop(c);
    let log = settled(proxy).await;
    assert_eq!(
        only(&log).address.as_deref(),
        Some(server.to_string().as_str())
    );
    // The host's resolver is never asked to read an address.
    for host in ["0x7f.1", "127.1", "1.2.3.4", "0x2c000001."] {
        let e = agentdiff_egress::SystemResolver
            .resolve(host, 80)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{host}");
    }
}

#[tokio::test]
async fn stop_closes_open_tunnels_with_their_counts() {
    let (server, _accepted) = echo_server().await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("proxy.sock");
    let proxy = Proxy::start(
        egress(&["127.0.0.1"], &[]),
        resolver(),
        ProxyConfig::default(),
        Bind::Unix(socket.clone()),
    )
    .await
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    let mut c = tokio::net::UnixStream::connect(&socket).await.unwrap();
    let req = format!("CONNECT 127.0.0.1:{} HTTP/1.1\r\n\r\n", server.port());
    c.write_all(req.as_bytes()).await.unwrap();
    let mut head = vec![0u8; 39];
    c.read_exact(&mut head).await.unwrap();
    assert!(head.starts_with(b"HTTP/1.1 200"));
    c.write_all(b"1234").await.unwrap();
    let mut back = [0u8; 4];
    c.read_exact(&mut back).await.unwrap();
    let log = proxy.stop().await;
    let r = only(&log);
    assert_eq!((r.bytes_up, r.bytes_down), (4, 4));
    assert!(r.ended_at.is_some());
    assert!(
        r.error.as_deref().unwrap_or("").contains("run ended"),
        "{r:#?}"
    );
    assert!(!socket.exists(), "the socket is removed");
    // The client sees the end.
    let mut rest = Vec::new();
    assert_eq!(c.read_to_end(&mut rest).await.unwrap_or(0), 0);
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let config = ProxyConfig {
        handshake_timeout: Duration::from_millis(200),
        ..ProxyConfig::default()
    };
    let proxy = start(egress(&[], &[]), config).await;
    let mut c = TcpStream::connect(proxy.tcp_addr().unwrap()).await.unwrap();
    c.write_all(b"GET http://a.test/ HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest))
        .await
        .expect("the proxy closes a silent client");
    assert_eq!(n.unwrap_or(0), 0);
    assert_eq!(proxy.stop().await.malformed, 1);
}

#[test]
fn a_proxy_thread_serves_whatever_its_caller_does() {
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    let proxy = ProxyThread::spawn(
        egress(&["allowed.test", "127.0.0.1"], &[]),
        resolver(),
        ProxyConfig::default(),
        Bind::Unix(socket.clone()),
    )
    .unwrap();
    // The caller blocks (std I/O, no runtime): the proxy still answers.
    use std::io::{Read, Write};
    let mut c = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    write!(c, "CONNECT allowed.test:{port} HTTP/1.1\r\n\r\n").unwrap();
    let (mut upstream, _) = server.accept().unwrap();
    let mut head = [0u8; 12];
    c.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    upstream.write_all(b"x").unwrap();
    drop(upstream);
    let outcome = proxy.stop();
    assert_eq!(outcome.log.allowed, 1, "{:#?}", outcome.log);
    assert!(outcome.cpu.is_some());
    assert!(!socket.exists());

    // A socket path that cannot be bound is an error, not a proxy that never listens.
    let err = ProxyThread::spawn(
        egress(&[], &[]),
        resolver(),
        ProxyConfig::default(),
        Bind::Unix(dir.path().join("missing/dir/egress.sock")),
    )
    .err()
    .expect("binding fails");
    assert!(matches!(err, ProxyError::Bind { .. }), "{err}");
}
