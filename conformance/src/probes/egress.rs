//! The `filtered` network probe: agentdiff's egress proxy (started here, on a Unix socket, with a
//! resolver of its own and a fixed allowlist) is handed to the backend, and a Python script
//! inside tries every way out.
//!
//! The proxy resolves `listed.agentdiff.test` and `rebind.agentdiff.test` to 127.0.0.1; the
//! allowlist lists `listed…`, `rebind…` and the address `127.0.0.1:PORT` of a host listener, so:
//! `listed…:PORT` must be reached through the proxy (one connection at the listener, one allowed
//! record), `unlisted…` must be refused by name and recorded, `rebind…:9` must be refused as an
//! internal address (its port is not the listed one), a direct connection to the listener (at
//! 127.0.0.1 and at this host's address) must fail, a UDP datagram to a host socket must not
//! arrive, and a name must not resolve inside (no resolver reachable).
//!
//! Not covered: ICMP; a resolver the sandbox reaches through a path other than UDP to this
//! host's addresses (the probe sees only what arrives here, and that the name did not resolve).

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use agentdiff_backend_api::{DynRuntimeBackend, Level};
use agentdiff_egress::{Bind, EgressLog, ProxyConfig, ProxyThread, Resolve, ResolveFuture};
use serde_json::json;

use super::programs::{host_address, launch, ran_marker_present, result, run_facts, RAN_MARKER};
use super::{inconclusive, ProbeKind, ProbeOptions, ProbeResult, Verdict};
use crate::harness::{Invocation, Scratch};

const LISTED: &str = "listed.agentdiff.test";
const UNLISTED: &str = "unlisted.agentdiff.test";
const REBIND: &str = "rebind.agentdiff.test";
const KIND: ProbeKind = ProbeKind::EgressFiltered;

/// Resolves the probe's two names to loopback and nothing else.
struct ProbeResolver;

impl Resolve for ProbeResolver {
    fn resolve<'a>(&'a self, name: &'a str, _port: u16) -> ResolveFuture<'a> {
        Box::pin(async move {
            match name {
                LISTED | REBIND => Ok(vec![IpAddr::V4(Ipv4Addr::LOCALHOST)]),
                _ => Err(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "not a probe name",
                )),
            }
        })
    }
}

const SCRIPT: &str = r#"
import os, socket, sys
port, udp, addrs = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
open(sys.argv[0] if False else 'RAN', 'w').write('ran')
hp = os.environ.get('HTTP_PROXY', '')
print('proxy=' + hp)
def via(host, p):
    try:
        h, pp = hp.split('//', 1)[1].rstrip('/').rsplit(':', 1)
        s = socket.create_connection((h, int(pp)), 5)
        s.sendall(('CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n' % (host, p, host, p)).encode())
        code = s.recv(256).split(b' ')[1].decode()
        if code == '200':
            s.sendall(b'agentdiff-probe\n')
        s.close()
        return code
    except Exception as e:
        return 'error-' + type(e).__name__
def direct(a):
    try:
        socket.create_connection((a, port), 3).close()
        return 'connected'
    except Exception:
        return 'failed'
print('listed=' + via('LISTED', port))
print('unlisted=' + via('UNLISTED', port))
print('rebind=' + via('REBIND', 9))
for a in addrs:
    print('direct_' + a + '=' + direct(a))
    try:
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'agentdiff-probe', (a, udp))
    except Exception:
        pass
try:
    socket.getaddrinfo('leak.agentdiff.test', 80)
    print('dns=resolved')
except Exception:
    print('dns=failed')
"#;

/// What the host saw while the probe ran.
struct HostSide {
    tcp_peers: usize,
    udp_datagrams: usize,
    log: EgressLog,
}

/// Runs the probe (see the module documentation).
pub(super) async fn filtered(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    options: &ProbeOptions,
) -> ProbeResult {
    let setup = |what: &str, e: &dyn std::fmt::Display| {
        inconclusive(KIND, format!("{what}: {e}"), json!(null))
    };
    let tcp = match TcpListener::bind("0.0.0.0:0").and_then(|l| {
        l.set_nonblocking(true)?;
        Ok(l)
    }) {
        Ok(l) => l,
        Err(e) => return setup("host listener", &e),
    };
    let udp = match UdpSocket::bind("0.0.0.0:0").and_then(|u| {
        u.set_nonblocking(true)?;
        Ok(u)
    }) {
        Ok(u) => u,
        Err(e) => return setup("host UDP socket", &e),
    };
    let (Ok(port), Ok(udp_port)) = (
        tcp.local_addr().map(|a| a.port()),
        udp.local_addr().map(|a| a.port()),
    ) else {
        return inconclusive(KIND, "host socket addresses".into(), json!(null));
    };
    let yaml = format!(
        "version: 2\nnetwork:\n  egress:\n    allow: [\"{LISTED}\", \"{REBIND}\", \"127.0.0.1:{port}\"]\n"
    );
    let policy = match agentdiff_policy::Policy::from_yaml_or_json(&yaml, "egress probe") {
        Ok(p) => p,
        Err(e) => return setup("probe policy", &e),
    };
    let dir = match tempfile::Builder::new()
        .prefix("agentdiff-egress-probe-")
        .tempdir_in("/tmp")
    {
        Ok(d) => d,
        Err(e) => return setup("proxy directory", &e),
    };
    let socket = dir.path().join("egress.sock");
    let proxy = match ProxyThread::spawn(
        policy.egress().clone(),
        Arc::new(ProbeResolver),
        ProxyConfig::default(),
        Bind::Unix(socket.clone()),
    ) {
        Ok(p) => p,
        Err(e) => return setup("egress proxy", &e),
    };
    // Whether the backend labels its network filtered when handed the proxy, asked with a command
    // every sandbox has: a backend that does not claim it is not judged on a program (python3)
    // its image may lack.
    let mut label_inv = Invocation::new(["sh", "-c", ":"]);
    label_inv.egress_proxy = Some(socket.clone());
    match launch(KIND, backend, scratch, label_inv, options).await {
        Ok(ran) if ran.evidence.capabilities.network != Level::Filtered => {
            let _ = proxy.stop();
            return result(
                KIND,
                Verdict::NotApplicable,
                format!(
                    "handed the egress proxy, the backend labelled the network `{}`, not \
                     `filtered`",
                    ran.evidence.capabilities.network.as_str()
                ),
                json!({"label": ran.evidence.capabilities.network, "run": run_facts(&ran)}),
            );
        }
        Ok(_) => {}
        Err(r) => {
            let _ = proxy.stop();
            return r;
        }
    }
    let mut addresses = vec!["127.0.0.1".to_string()];
    addresses.extend(host_address().map(|a| a.to_string()));
    let script = SCRIPT
        .replace(
            "sys.argv[0] if False else 'RAN'",
            &format!("'{RAN_MARKER}'"),
        )
        .replace("'LISTED'", &format!("'{LISTED}'"))
        .replace("'UNLISTED'", &format!("'{UNLISTED}'"))
        .replace("'REBIND'", &format!("'{REBIND}'"));
    let mut argv: Vec<OsString> = vec!["python3".into(), "-c".into(), script.into()];
    argv.push(port.to_string().into());
    argv.push(udp_port.to_string().into());
    argv.extend(addresses.iter().map(OsString::from));
    let mut inv = Invocation::new(argv);
    inv.egress_proxy = Some(socket);
    let ran = launch(KIND, backend, scratch, inv, options).await;
    // A connection or datagram that raced the command's exit gets a moment to arrive.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let host = HostSide {
        tcp_peers: std::iter::from_fn(|| tcp.accept().ok()).count(),
        udp_datagrams: std::iter::from_fn(|| udp.recv_from(&mut [0u8; 64]).ok()).count(),
        log: proxy.stop().log,
    };
    let ran = match ran {
        Ok(r) => r,
        Err(r) => return r,
    };
    let lines = ran.stdout_text();
    let evidence = json!({
        "lines": lines.lines().collect::<Vec<_>>(),
        "tcp_connections_at_listener": host.tcp_peers,
        "udp_datagrams_received": host.udp_datagrams,
        "proxy_log": host.log,
        "label": ran.evidence.capabilities.network,
        "run": run_facts(&ran),
    });
    if ran.evidence.capabilities.network != Level::Filtered {
        return result(
            KIND,
            Verdict::NotApplicable,
            format!(
                "handed the egress proxy, the backend labelled the network `{}`, not `filtered`",
                ran.evidence.capabilities.network.as_str()
            ),
            evidence,
        );
    }
    if !ran_marker_present(scratch) || !lines.contains("dns=") {
        return inconclusive(
            KIND,
            "the probe did not run (it needs python3 in the sandbox)".into(),
            evidence,
        );
    }
    let (verdict, summary) = judge(&lines, &host);
    result(KIND, verdict, summary, evidence)
}

/// The verdict from the script's lines and what the host saw.
fn judge(lines: &str, host: &HostSide) -> (Verdict, String) {
    let said = |key: &str| {
        lines
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or("")
            .to_string()
    };
    let recorded = |h: &str, allow: bool| {
        host.log
            .records
            .iter()
            .any(|r| r.host == h && (r.action == agentdiff_policy::Action::Allow) == allow)
    };
    let mut failures = Vec::new();
    if said("listed") != "200" || !recorded(LISTED, true) {
        failures.push(format!(
            "the listed host was not reached through the proxy ({})",
            said("listed")
        ));
    }
    if said("unlisted") != "403" || !recorded(UNLISTED, false) {
        failures.push(format!(
            "the unlisted host was not refused and recorded ({})",
            said("unlisted")
        ));
    }
    let rebind_refused = host
        .log
        .records
        .iter()
        .any(|r| r.host == REBIND && r.rule == "network.egress.internal_address");
    if said("rebind") != "403" || !rebind_refused {
        failures.push(format!(
            "a name resolving to loopback was not refused ({})",
            said("rebind")
        ));
    }
    let direct: Vec<&str> = lines
        .lines()
        .filter(|l| l.starts_with("direct_") && l.ends_with("=connected"))
        .collect();
    // The proxy's own connection to the listed host is the only one the listener may see.
    if !direct.is_empty() || host.tcp_peers > 1 {
        failures.push(format!(
            "a direct connection reached this host ({direct:?}, {} at the listener)",
            host.tcp_peers
        ));
    }
    if host.udp_datagrams > 0 {
        failures.push(format!(
            "{} UDP datagram(s) reached this host",
            host.udp_datagrams
        ));
    }
    if said("dns") != "failed" {
        failures.push("a name resolved inside the sandbox (a resolver is reachable)".into());
    }
    if failures.is_empty() {
        (
            Verdict::Verified,
            "only the listed host was reached, through the proxy; unlisted and loopback-resolving \
             names refused and recorded; no direct TCP, no UDP, no resolver"
                .into(),
        )
    } else {
        (Verdict::NotEnforced, failures.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(records: &[(&str, bool, &str)]) -> EgressLog {
        let mut log = EgressLog::default();
        for (host, allow, rule) in records {
            log.records.push(agentdiff_egress::ConnectionRecord {
                host: host.to_string(),
                port: 1,
                protocol: agentdiff_egress::Protocol::Connect,
                action: if *allow {
                    agentdiff_policy::Action::Allow
                } else {
                    agentdiff_policy::Action::Deny
                },
                rule: rule.to_string(),
                pattern: None,
                reason: String::new(),
                address: None,
                bytes_up: 0,
                bytes_down: 0,
                started_at: String::new(),
                ended_at: None,
                outcome: None,
                error: None,
            });
        }
        log
    }

    #[test]
    fn only_the_whole_picture_verifies_and_a_network_that_was_not_unshared_fails() {
        let honest_log = log(&[
            (LISTED, true, "network.egress.allow[0]"),
            (UNLISTED, false, "network.egress.default"),
            (REBIND, false, "network.egress.internal_address"),
        ]);
        let honest = "listed=200\nunlisted=403\nrebind=403\ndirect_127.0.0.1=failed\ndns=failed\n";
        let host = |tcp, udp, log: &EgressLog| HostSide {
            tcp_peers: tcp,
            udp_datagrams: udp,
            log: log.clone(),
        };
        assert_eq!(judge(honest, &host(1, 0, &honest_log)).0, Verdict::Verified);
        // Proxy variables set, network not unshared: the direct tries get through.
        let lying = honest.replace("direct_127.0.0.1=failed", "direct_127.0.0.1=connected");
        let (v, why) = judge(&lying, &host(2, 1, &honest_log));
        assert_eq!(v, Verdict::NotEnforced);
        assert!(why.contains("direct") && why.contains("UDP"), "{why}");
        let resolving = honest.replace("dns=failed", "dns=resolved");
        assert_eq!(
            judge(&resolving, &host(1, 0, &honest_log)).0,
            Verdict::NotEnforced
        );
        // A refusal the proxy did not record does not count.
        let unrecorded = log(&[(LISTED, true, "network.egress.allow[0]")]);
        assert_eq!(
            judge(honest, &host(1, 0, &unrecorded)).0,
            Verdict::NotEnforced
        );
    }
}
