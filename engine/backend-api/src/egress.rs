//! What a command routed through agentdiff's egress proxy is given, shared by every backend that
//! labels its network `filtered` (bwrap, container, and the SDK's `serve` for external backends):
//! the port of the forwarder on the sandbox's own loopback and the proxy variables pointing at it.
//!
//! Invariant: the variables name only the sandbox's `127.0.0.1`, never the proxy's socket path or
//! anything of the host, so they are the same in every run. Not defended: a program that ignores
//! them; the sandbox must leave it no other route out (that is what `filtered` promises).

use std::ffi::OsString;

/// The port the egress forwarder listens on inside the sandbox (the sandbox's own loopback, so
/// nothing else there uses it).
pub const FORWARDER_PORT: u16 = 3128;

/// The proxy variables a `filtered` sandbox gets, after the environment scrub: the standard
/// ones in both cases (curl, pip, git, Node's undici through `NODE_USE_ENV_PROXY`, most tools),
/// SOCKS5 with remote name resolution for `ALL_PROXY`, npm's own settings and cargo's. Local
/// addresses bypass the proxy (they are the sandbox's own loopback).
pub fn proxy_env() -> Vec<(OsString, OsString)> {
    let http = format!("http://127.0.0.1:{FORWARDER_PORT}");
    let socks = format!("socks5h://127.0.0.1:{FORWARDER_PORT}");
    let no_proxy = "localhost,127.0.0.1,::1";
    [
        ("HTTP_PROXY", http.as_str()),
        ("HTTPS_PROXY", &http),
        ("http_proxy", &http),
        ("https_proxy", &http),
        ("ALL_PROXY", &socks),
        ("all_proxy", &socks),
        ("NO_PROXY", no_proxy),
        ("no_proxy", no_proxy),
        ("npm_config_proxy", &http),
        ("npm_config_https_proxy", &http),
        ("CARGO_HTTP_PROXY", &http),
    ]
    .into_iter()
    .map(|(k, v)| (OsString::from(k), OsString::from(v)))
    .collect()
}

/// `env` with the proxy variables replacing any of the caller's own values of them.
pub fn with_proxy_env(env: &mut Vec<(OsString, OsString)>) {
    let ours = proxy_env();
    env.retain(|(k, _)| !ours.iter().any(|(o, _)| o == k));
    env.extend(ours);
}
