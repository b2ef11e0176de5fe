//! The egress proxy's cost, against direct loopback measured in the same run.
//!
//! - Throughput: 1 GiB (`EGRESS_BENCH_MIB` MiB) written to a sink server on 127.0.0.1, directly
//!   and through a `CONNECT` tunnel; the ratio proxied/direct (target >= 0.5).
//! - Latency: connect, one byte to an echo server and its echo back, directly and through the
//!   proxy (`CONNECT` and its `200` included), p50 and p99 over 2000 rounds; the added p50
//!   (target <= 1 ms).
//! - CPU: the proxy thread's CPU time (`ProxyThread`'s, from `CLOCK_THREAD_CPUTIME_ID`) per GiB
//!   relayed.
//!
//! The proxy runs on a `ProxyThread` (a current-thread runtime on a thread of its own); the
//! client and servers are plain blocking threads. Rounds of both kinds alternate, and the best
//! throughput of each is kept, so a noisy neighbour on a shared machine lowers both rather than
//! one. Run with `cargo bench -p agentdiff-egress --bench proxy`.

// A benchmark is a measuring tool, not library code: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentdiff_egress::{Bind, ProxyConfig, ProxyThread, SystemResolver};
use agentdiff_policy::Policy;

const CHUNK: usize = 256 * 1024;
const ROUNDS: usize = 3;
const LATENCY_ROUNDS: usize = 2000;

/// A server that reads everything a connection sends and then answers one byte.
fn sink() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            std::thread::spawn(move || {
                let mut buf = vec![0u8; CHUNK];
                let mut want = [0u8; 8];
                s.read_exact(&mut want).unwrap();
                let mut left = u64::from_be_bytes(want);
                while left > 0 {
                    let n = s.read(&mut buf).unwrap();
                    assert!(n > 0, "the sink's client went away");
                    left -= n as u64;
                }
                s.write_all(b"k").unwrap();
            });
        }
    });
    addr
}

/// A server that echoes each byte.
fn echo() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let mut s = s.unwrap();
            s.set_nodelay(true).unwrap();
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).is_ok() {
                    if s.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// The proxy on a thread of its own with a current-thread runtime.
fn proxy() -> ProxyThread {
    let egress = Policy::from_yaml_or_json(
        "version: 2\nnetwork:\n  egress:\n    allow: [\"127.0.0.1\"]\n",
        "bench.yaml",
    )
    .unwrap()
    .egress()
    .clone();
    ProxyThread::spawn(
        egress,
        Arc::new(SystemResolver),
        ProxyConfig::default(),
        Bind::Tcp("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap()
}

/// A connection to `target`, through the proxy's `CONNECT` when given.
fn open(target: SocketAddr, via: Option<SocketAddr>) -> TcpStream {
    let Some(proxy) = via else {
        let s = TcpStream::connect(target).unwrap();
        s.set_nodelay(true).unwrap();
        return s;
    };
    let mut s = TcpStream::connect(proxy).unwrap();
    s.set_nodelay(true).unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\n\r\n").unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).unwrap();
        head.push(b[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"), "the proxy refused");
    s
}

/// Seconds to send `bytes` to the sink and get its answer.
fn transfer(sink: SocketAddr, via: Option<SocketAddr>, bytes: u64) -> f64 {
    let mut s = open(sink, via);
    let chunk = vec![7u8; CHUNK];
    let started = Instant::now();
    s.write_all(&bytes.to_be_bytes()).unwrap();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        s.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    let mut k = [0u8; 1];
    s.read_exact(&mut k).unwrap();
    started.elapsed().as_secs_f64()
}

fn round_trip(echo: SocketAddr, via: Option<SocketAddr>) -> Duration {
    let started = Instant::now();
    let mut s = open(echo, via);
    s.write_all(b"x").unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    started.elapsed()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mib: u64 = std::env::var("EGRESS_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let bytes = mib * 1024 * 1024;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let sink = sink();
    let echo = echo();

    let p = proxy();
    let paddr = p.tcp_addr().unwrap();
    let (mut direct, mut proxied) = (f64::MAX, f64::MAX);
    for _ in 0..ROUNDS {
        direct = direct.min(transfer(sink, None, bytes));
        proxied = proxied.min(transfer(sink, Some(paddr), bytes));
    }
    let outcome = p.stop();
    assert_eq!(
        outcome.log.allowed, ROUNDS as u64,
        "every transfer was recorded"
    );
    let cpu = outcome.cpu.expect("the thread's CPU time");
    let rate = |secs: f64| bytes as f64 / secs / (1u64 << 20) as f64;
    println!("throughput, {mib} MiB per transfer, best of {ROUNDS}:");
    println!("  direct loopback   {:>9.0} MiB/s", rate(direct));
    println!("  through CONNECT   {:>9.0} MiB/s", rate(proxied));
    println!(
        "  ratio             {:>9.2}   (target >= 0.50)",
        direct / proxied
    );
    println!(
        "  proxy CPU         {:>9.3} s per GiB relayed ({:.3} s for {:.2} GiB)",
        cpu.as_secs_f64() / (gib * ROUNDS as f64),
        cpu.as_secs_f64(),
        gib * ROUNDS as f64
    );

    let proxy = proxy();
    let paddr = proxy.tcp_addr().unwrap();
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..LATENCY_ROUNDS {
        d.push(round_trip(echo, None));
        p.push(round_trip(echo, Some(paddr)));
    }
    proxy.stop();
    d.sort();
    p.sort();
    println!("latency, connect + 1-byte echo, {LATENCY_ROUNDS} rounds:");
    println!(
        "  direct            p50 {:>8.1?}  p99 {:>8.1?}",
        percentile(&d, 0.5),
        percentile(&d, 0.99)
    );
    println!(
        "  through CONNECT   p50 {:>8.1?}  p99 {:>8.1?}",
        percentile(&p, 0.5),
        percentile(&p, 0.99)
    );
    println!(
        "  added p50         {:>8.1?}   (target <= 1 ms)",
        percentile(&p, 0.5).saturating_sub(percentile(&d, 0.5))
    );
}
