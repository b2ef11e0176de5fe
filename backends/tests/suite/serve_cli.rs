//! `agentdiff serve`: the token and Host checks, the pages, and the live event stream, over raw
//! HTTP/1.1 on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use super::html_cli::{hostile_run, project, SECRETS};
use super::{agentdiff, bin, cmd, state_dir};

/// A running `agentdiff serve`, stopped on drop.
pub struct Served {
    child: Child,
    pub port: u16,
    pub token: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `agentdiff serve --port 0` in `proj` and reads the URL it prints.
pub fn serve(proj: &Path) -> Served {
    served(cmd(proj, &["serve", "--port", "0"]))
}

/// Starts `command` (an `agentdiff serve`) and reads the URL it prints.
fn served(mut command: std::process::Command) -> Served {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_string();
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .unwrap_or_else(|| panic!("{url}"));
    let (port, token) = rest.split_once("/?token=").unwrap();
    Served {
        port: port.parse().unwrap(),
        token: token.to_string(),
        child,
    }
}

/// One GET (or `method`) request; returns the status code and the whole response text.
pub fn request(port: u16, method: &str, target: &str, host: &str, headers: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n{headers}\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    (status, out)
}

#[test]
fn serve_refuses_a_missing_or_wrong_token_and_a_foreign_host() {
    let dir = hostile_run("serve-1");
    let server = serve(&project(&dir));
    let (port, token) = (server.port, server.token.clone());
    let host = format!("127.0.0.1:{port}");
    // A wrong token of the same length, differing in the last character only.
    let mut wrong = token.clone();
    let last = if wrong.ends_with('0') { "1" } else { "0" };
    wrong.replace_range(31.., last);
    assert_eq!(wrong.len(), token.len());

    assert_eq!(request(port, "GET", "/", &host, "").0, 401);
    // Two Host headers, even the right one twice, are refused before the token is looked at.
    for second in ["evil.com", host.as_str()] {
        let (status, body) = request(
            port,
            "GET",
            &format!("/?token={token}"),
            &host,
            &format!("Host: {second}\r\n"),
        );
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("more than one Host header"), "{body}");
    }
    assert_eq!(
        request(port, "GET", &format!("/?token={wrong}"), &host, "").0,
        401
    );
    assert_eq!(request(port, "GET", "/run/serve-1", &host, "").0, 401);
    assert_eq!(
        request(
            port,
            "GET",
            &format!("/run/serve-1?token={wrong}"),
            &host,
            ""
        )
        .0,
        401
    );
    assert_eq!(request(port, "GET", "/events", &host, "").0, 401);
    let bearer_wrong = format!("Authorization: Bearer {wrong}\r\n");
    assert_eq!(request(port, "GET", "/events", &host, &bearer_wrong).0, 401);
    // A page does not take the bearer header (query only).
    let bearer = format!("Authorization: Bearer {token}\r\n");
    assert_eq!(request(port, "GET", "/", &host, &bearer).0, 401);
    // DNS rebinding: the right token under a name that is not loopback.
    let good = format!("/?token={token}");
    for foreign in [
        format!("evil.example:{port}"),
        format!("127.0.0.1:{}", port.wrapping_add(1)),
        "127.0.0.1".into(),
    ] {
        assert_eq!(
            request(port, "GET", &good, &foreign, "").0,
            403,
            "{foreign}"
        );
    }
    // Read-only.
    assert_eq!(
        request(port, "POST", &good, &host, "Content-Length: 0\r\n").0,
        405
    );

    let (status, index) = request(port, "GET", &good, &format!("localhost:{port}"), "");
    assert_eq!(status, 200, "{index}");
    assert!(index.contains(">serve-1</a>"), "{index}");
    assert!(
        !index.to_ascii_lowercase().contains("access-control-allow"),
        "{index}"
    );
    assert!(index.contains("referrer-policy: no-referrer"), "{index}");
    let (status, page) = request(
        port,
        "GET",
        &format!("/run/serve-1?token={token}"),
        &host,
        "",
    );
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("<code id=\"run-id\">serve-1</code>"),
        "{page}"
    );
    assert!(page.contains("src/lib.rs"), "{page}");
    for secret in SECRETS {
        assert!(!page.contains(secret), "{secret} leaked");
    }
    assert!(
        page.contains(&format!("<a href=\"/?token={token}\">")),
        "{page}"
    );
    assert_eq!(
        request(port, "GET", &format!("/run/nope?token={token}"), &host, "").0,
        404
    );
    // Also on IPv6 loopback, where this host has it.
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        let mut s = TcpStream::connect(("::1", port)).unwrap();
        write!(
            s,
            "GET {good} HTTP/1.1\r\nHost: [::1]:{port}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
}

#[test]
fn events_stream_a_run_started_after_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(dir.path(), &["run", "--run-id", "before-1", "--", "true"]);
    assert!(out.status.code().is_some(), "{out:?}");
    let server = serve(dir.path());
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET /events HTTP/1.1\r\nHost: [::1]:{}\r\nAuthorization: Bearer {}\r\n\r\n",
        server.port, server.token
    )
    .unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut started = false;
    while Instant::now() < deadline {
        if !started && seen.contains(": connected") {
            started = true;
            let run = agentdiff(
                dir.path(),
                &[
                    "run",
                    "--run-id",
                    "after-1",
                    "--",
                    "sh",
                    "-c",
                    "echo x > new.txt",
                ],
            );
            assert!(run.status.code().is_some(), "{run:?}");
        }
        if seen.contains("\"run_id\":\"after-1\",\"kind\":\"finished\"") {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => seen.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => panic!("{e}: {seen}"),
        }
    }
    assert!(seen.starts_with("HTTP/1.1 200"), "{seen}");
    assert!(seen.contains("content-type: text/event-stream"), "{seen}");
    assert!(seen.contains("event: run\ndata: {\"run_id\":\"after-1\",\"kind\":\"event\",\"text\":\"capsule_created"), "{seen}");
    assert!(seen.contains("\"run_id\":\"after-1\",\"kind\":\"finished\",\"text\":\"sealed: status review, 1 change(s)\""), "{seen}");
    // A run sealed before the stream opened is history, not news.
    assert!(!seen.contains("\"run_id\":\"before-1\""), "{seen}");
}

/// Reads until the server closes the connection (or 30 s pass, which fails the test); returns what
/// arrived.
fn read_until_closed(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return String::from_utf8_lossy(&out).into_owned(),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return String::from_utf8_lossy(&out).into_owned()
            }
            Err(e) => panic!("the server did not close the connection: {e}"),
        }
    }
}

/// More idle connections than the server may hold (under a descriptor limit of 64, which used to
/// leave it unable to accept anything once ~60 idle connections were open) do not lock out a
/// client with the token; a connection that sends no header, and a keep-alive connection idle
/// after its response, are closed after the header timeout.
#[test]
fn idle_connections_neither_exhaust_the_server_nor_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(dir.path(), &["run", "--run-id", "r1", "--", "true"]);
    assert!(out.status.code().is_some(), "{out:?}");
    let mut command = std::process::Command::new("sh");
    command
        .args(["-c", "ulimit -n 64 && exec \"$@\"", "sh"])
        .arg(bin())
        .args(["serve", "--port", "0", "--header-timeout", "2s"])
        .current_dir(dir.path())
        .env_remove("AGENTDIFF_POLICY")
        .env("AGENTDIFF_STATE_DIR", state_dir());
    let server = served(command);

    let idle: Vec<TcpStream> = (0..150)
        .map(|_| TcpStream::connect(("127.0.0.1", server.port)).unwrap())
        .collect();
    let (status, page) = request(
        server.port,
        "GET",
        &format!("/run/r1?token={}", server.token),
        &format!("127.0.0.1:{}", server.port),
        "",
    );
    assert_eq!(status, 200, "{page}");
    // The newest idle connection was let in; it sent nothing and is closed for it.
    let mut newest = idle.into_iter().last().unwrap();
    assert_eq!(read_until_closed(&mut newest), "");

    // A keep-alive connection: answered, then closed once it stays idle.
    let mut s = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        s,
        "GET /?token={} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
        server.token, server.port
    )
    .unwrap();
    let answered = read_until_closed(&mut s);
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
}
