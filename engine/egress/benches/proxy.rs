//! The egress proxy's cost, against direct loopback measured in the same run.
//!
//! - Throughput: 1 GiB (`EGRESS_BENCH_MIB` MiB) written to a sink server on 127.0.0.1, directly
//!   and through a `CONNECT` tunnel; the ratio proxied/direct (target >= 0.5).
//! - Latency: connect, one byte to an echo server and its echo back, directly and through the
//!   proxy (`CONNECT` and its `200` included), p50 and p99 over 2000 rounds; the added p50
//!   (target <= 1 ms).
//! - CPU: the proxy thread's CPU time (getrusage RUSAGE_THREAD) per GiB relayed.
//!
//! The proxy runs as agentdiff runs it: a current-thread tokio runtime on its own thread. The
//! client and servers are plain blocking threads. Rounds of both kinds alternate, and the best
//! throughput of each is kept, so a noisy neighbour on a shared machine lowers both rather than
//! one. Run with `cargo bench -p agentdiff-egress --bench proxy`.

// A benchmark is a measuring tool, not library code: a failed step should stop it loudly.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentdiff_egress::{Bind, Proxy, ProxyConfig, SystemResolver};
use agentdiff_policy::Policy;

const CHUNK: usize = 256 * 1024;
const ROUNDS: usize = 3;
const LATENCY_ROUNDS: usize = 2000;

fn thread_cpu() -> Duration {
    // SAFETY: getrusage writes into the struct we own; RUSAGE_THREAD is valid on Linux.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    assert_eq!(rc, 0, "getrusage");
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

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

/// The proxy on its own current-thread runtime; dropping the sender stops it and the thread
/// returns its CPU time.
fn proxy() -> (
    SocketAddr,
    mpsc::Sender<()>,
    std::thread::JoinHandle<Duration>,
) {
    let (addr_tx, addr_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let egress = Policy::from_yaml_or_json(
            "version: 2\nnetwork:\n  egress:\n    allow: [\"127.0.0.1\"]\n",
            "bench.yaml",
        )
        .unwrap()
        .egress()
        .clone();
        let before = thread_cpu();
        rt.block_on(async move {
            let p = Proxy::start(
                egress,
                Arc::new(SystemResolver),
                ProxyConfig::default(),
                Bind::Tcp("127.0.0.1:0".parse().unwrap()),
            )
            .await
            .unwrap();
            addr_tx.send(p.tcp_addr().unwrap()).unwrap();
            let _ = tokio::task::spawn_blocking(move || stop_rx.recv()).await;
            p.stop().await;
        });
        thread_cpu() - before
    });
    (addr_rx.recv().unwrap(), stop_tx, handle)
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

    let (paddr, stop, handle) = proxy();
    let (mut direct, mut proxied) = (f64::MAX, f64::MAX);
    for _ in 0..ROUNDS {
        direct = direct.min(transfer(sink, None, bytes));
        proxied = proxied.min(transfer(sink, Some(paddr), bytes));
    }
    drop(stop);
    let cpu = handle.join().unwrap();
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

    let (paddr, stop, handle) = proxy();
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for _ in 0..LATENCY_ROUNDS {
        d.push(round_trip(echo, None));
        p.push(round_trip(echo, Some(paddr)));
    }
    drop(stop);
    handle.join().unwrap();
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
