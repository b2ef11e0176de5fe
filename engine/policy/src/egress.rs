//! `network.egress`: which hosts a run may connect to, decided per connection with provenance.
//!
//! A pattern is one of
//! - `*`: any host *name* (never an IP literal);
//! - `name`: exactly that host name;
//! - `*.domain`: `domain` itself and every name below it, label-aligned (`*.npmjs.org` matches
//!   `npmjs.org` and `registry.npmjs.org`, never `evilnpmjs.org`);
//! - an IP literal (`10.0.0.5`, `::1`) or a CIDR (`10.0.0.0/8`, `fd00::/8`);
//!
//! each optionally with `:port` (`[v6]:port` for IPv6). Without a port, every port matches.
//!
//! Invariants:
//! - Deny before allow: a deny pattern that matches decides, whatever the allow list says; a
//!   target no allow pattern matches is denied (`network.egress.default`).
//! - A name pattern never matches an IP-literal target, and an address pattern never matches a
//!   name: addresses are allowed only when written out.
//! - A host the C resolver's `inet_aton` reads as an IPv4 address (`127.1`, `0x7f.1`,
//!   `0x2c000001`, `0177.0.0.1`: see [`inet_aton`]) is that address, decided exactly as the
//!   written-out literal; as a pattern it is refused (write the address out).
//! - Names are compared in ASCII lowercase without a trailing dot; a name that is not a valid
//!   DNS name (or whose last label is a number in any base, `a.0x1`) is denied as
//!   `network.egress.invalid_host`.
//! - After a name is resolved, [`Egress::check_address`] refuses every address a deny address
//!   pattern covers, and every loopback, private, shared, link-local (the cloud metadata address
//!   169.254.169.254), unspecified, multicast or documentation address unless an allow address
//!   pattern covers it: a listed public name that resolves to an internal address (DNS
//!   rebinding) reaches nothing.
//!
//! Not defended here: what flows inside an allowed connection (a program can tunnel anything
//! through an allowed host, or front another service behind its name); the proxy that applies
//! these decisions says what it enforces (docs/network.md).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::decide::Action;

/// Longest host name accepted (RFC 1035 limit, without the trailing dot).
const MAX_NAME: usize = 253;
/// Longest label.
const MAX_LABEL: usize = 63;

/// The presets a policy may name in `network.egress.presets`, and the patterns each stands for
/// (documented in docs/network.md; a change there must change here).
pub const PRESETS: [(&str, &[&str]); 6] = [
    ("anthropic", &["api.anthropic.com:443"]),
    ("openai", &["api.openai.com:443"]),
    (
        "github",
        &[
            "github.com:443",
            "api.github.com:443",
            "codeload.github.com:443",
            "objects.githubusercontent.com:443",
            "raw.githubusercontent.com:443",
        ],
    ),
    (
        "npm",
        &["registry.npmjs.org:443", "registry.yarnpkg.com:443"],
    ),
    ("pypi", &["pypi.org:443", "files.pythonhosted.org:443"]),
    (
        "crates",
        &[
            "crates.io:443",
            "index.crates.io:443",
            "static.crates.io:443",
        ],
    ),
];

/// The patterns of a preset, if `name` is one.
pub fn preset(name: &str) -> Option<&'static [&'static str]> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

/// What a pattern matches, without its port.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shape {
    AnyName,
    Name(String),
    Domain(String),
    Net { addr: IpAddr, prefix: u8 },
}

/// One parsed host pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    shape: Shape,
    port: Option<u16>,
}

/// The host a connection asks for: a name or an address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Name(String),
    Addr(IpAddr),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Name(n) => f.write_str(n),
            Target::Addr(a) => write!(f, "{a}"),
        }
    }
}

impl Target {
    /// `host:port`, with an IPv6 address in brackets.
    pub fn with_port(&self, port: u16) -> String {
        match self {
            Target::Addr(IpAddr::V6(a)) => format!("[{a}]:{port}"),
            other => format!("{other}:{port}"),
        }
    }

    /// Read a host as a client sends it (`Host`, `CONNECT`, SOCKS): an address (IPv6 possibly
    /// in brackets) or a DNS name, which is lowercased and loses a trailing dot.
    pub fn parse(host: &str) -> Result<Target, HostError> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(addr) = bare.parse::<IpAddr>() {
            return Ok(Target::Addr(canonical_addr(addr)));
        }
        if bare.len() != host.len() {
            return Err(HostError::NotIpv6(shown(bare)));
        }
        // The resolver would turn these into an address: decide them as that address.
        if let Some(v4) = inet_aton(host.strip_suffix('.').unwrap_or(host)) {
            return Ok(Target::Addr(IpAddr::V4(v4)));
        }
        check_name(host).map(Target::Name)
    }
}

/// The IPv4 address glibc's `inet_aton` (and so `getaddrinfo`) reads `text` as, if any: 1 to 4
/// parts split by `.`, each decimal, octal (leading `0`) or hex (`0x`); every part but the last
/// is one byte, the last fills the remaining bytes (`127.1` is 127.0.0.1, `0x2c000001` is
/// 44.0.0.1).
pub fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let mut values = [0u32; 4];
    let mut count = 0;
    for part in text.split('.') {
        let slot = values.get_mut(count)?;
        *slot = inet_part(part)?;
        count += 1;
    }
    let (last, leading) = values[..count].split_last()?;
    if leading.iter().any(|v| *v > 0xff) {
        return None;
    }
    let max = [u32::MAX, 0xff_ffff, 0xffff, 0xff]
        .get(leading.len())
        .copied()?;
    if *last > max {
        return None;
    }
    let head = leading
        .iter()
        .enumerate()
        .fold(0u32, |acc, (i, v)| acc | (v << (24 - 8 * i)));
    Some(Ipv4Addr::from(head | last))
}

/// One `inet_aton` part: the number `strtoul(part, _, 0)` reads when it reads all of `part`
/// and the value fits 32 bits.
fn inet_part(part: &str) -> Option<u32> {
    let (digits, radix) = match part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
        Some(hex) => (hex, 16),
        None if part.len() > 1 && part.starts_with('0') => (&part[1..], 8),
        None => (part, 10),
    };
    if digits.is_empty() {
        return None;
    }
    digits.chars().try_fold(0u32, |acc, c| {
        let d = c.to_digit(radix)?;
        acc.checked_mul(radix)?.checked_add(d)
    })
}

/// Whether a label is a number in some base (`12`, `017`, `0x1f`, `0x`): resolvers and URL
/// parsers read a name ending in one as an address, so it is never a host name.
fn numeric_label(label: &str) -> bool {
    match label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"))
    {
        Some(hex) => hex.chars().all(|c| c.is_ascii_hexdigit()),
        None => !label.is_empty() && label.chars().all(|c| c.is_ascii_digit()),
    }
}

/// An IPv4-mapped IPv6 address is the IPv4 address it carries (`::ffff:127.0.0.1` is loopback).
fn canonical_addr(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// Why a host, a `host:port` or a host pattern cannot be read. Every message names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("the host is empty")]
    Empty,
    #[error("the host name is longer than {MAX_NAME} characters")]
    TooLong,
    #[error("{0:?} is not a host name (every label between dots has 1 to {MAX_LABEL} characters)")]
    Label(String),
    #[error(
        "{0:?} is not a host name (letters, digits, `-` and `_`; write an internationalised \
         name in its xn-- form)"
    )]
    Characters(String),
    #[error(
        "{0:?} is not a host name (its last label is a number; resolvers read such names as \
         addresses, so write the address out)"
    )]
    Numeric(String),
    #[error(
        "{0:?} is the IPv4 address {1} to the resolver (inet_aton form); write the address \
         out as {1}"
    )]
    Ipv4Form(String, Ipv4Addr),
    #[error("{0:?} is not a port (1 to 65535)")]
    Port(String),
    #[error("`[` without its `]`")]
    Bracket,
    #[error("unexpected {0:?} after `]`")]
    AfterBracket(String),
    #[error("[{0}] is not an IPv6 address; brackets are for IPv6 only")]
    NotIpv6(String),
    #[error("{0:?}: `*` is allowed only as the whole host or as a leading `*.`")]
    Wildcard(String),
    #[error("{0:?} before `/` is not an IP address")]
    NetAddress(String),
    #[error("{bits:?} is not a prefix length (0 to {max})")]
    Prefix { bits: String, max: u8 },
}

/// Most characters of a refused host kept in an error or a decision: a client can send a host
/// of many kilobytes, and records of refused attempts must stay small.
const SHOWN: usize = 128;

/// `text` cut to [`SHOWN`] characters (marked with `…` when cut).
fn shown(text: &str) -> String {
    match text.char_indices().nth(SHOWN) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_owned(),
    }
}

/// A DNS name, lowercased, without its trailing dot.
fn check_name(host: &str) -> Result<String, HostError> {
    let name = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if name.len() > MAX_NAME {
        return Err(HostError::TooLong);
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > MAX_LABEL {
            return Err(HostError::Label(shown(host)));
        }
        let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_';
        if !label.chars().all(ok) || label.starts_with('-') || label.ends_with('-') {
            return Err(HostError::Characters(shown(host)));
        }
    }
    if name.rsplit('.').next().is_some_and(numeric_label) {
        return Err(HostError::Numeric(shown(host)));
    }
    Ok(name)
}

/// Split `host:port`, `[v6]:port`, `[v6]`; a bare IPv6 address (two colons or more) has no port.
/// The host keeps its brackets off; the port, when given, is 1 to 65535.
pub fn split_port(text: &str) -> Result<(&str, Option<u16>), HostError> {
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(HostError::Port(shown(p))),
    };
    if let Some(rest) = text.strip_prefix('[') {
        let Some((inside, after)) = rest.split_once(']') else {
            return Err(HostError::Bracket);
        };
        // Brackets are for IPv6 only (an address, or a network in a pattern).
        if !inside.contains(':') {
            return Err(HostError::NotIpv6(shown(inside)));
        }
        return match after {
            "" => Ok((inside, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((inside, port(p)?)),
                None => Err(HostError::AfterBracket(shown(after))),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, p) = text.split_once(':').unwrap_or((text, ""));
            Ok((host, port(p)?))
        }
        _ => Ok((text, None)),
    }
}

impl HostPattern {
    /// Parse one pattern as written in a policy or given to `--allow-host`.
    pub fn parse(text: &str) -> Result<HostPattern, HostError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(HostError::Empty);
        }
        let (host, port) = split_port(text)?;
        let shape = if host == "*" {
            Shape::AnyName
        } else if let Some(domain) = host.strip_prefix("*.") {
            Shape::Domain(check_name(domain)?)
        } else if host.contains('*') {
            return Err(HostError::Wildcard(shown(host)));
        } else if let Some((addr, bits)) = host.split_once('/') {
            let addr = addr
                .parse::<IpAddr>()
                .map_err(|_| HostError::NetAddress(shown(addr)))?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = match bits.parse::<u8>() {
                Ok(p) if p <= max => p,
                _ => {
                    return Err(HostError::Prefix {
                        bits: shown(bits),
                        max,
                    })
                }
            };
            Shape::Net {
                addr: mask(addr, prefix),
                prefix,
            }
        } else if let Ok(addr) = host.parse::<IpAddr>() {
            let addr = canonical_addr(addr);
            let prefix = if addr.is_ipv4() { 32 } else { 128 };
            Shape::Net { addr, prefix }
        } else if let Some(v4) = inet_aton(host.strip_suffix('.').unwrap_or(host)) {
            return Err(HostError::Ipv4Form(shown(host), v4));
        } else {
            Shape::Name(check_name(host)?)
        };
        Ok(HostPattern { shape, port })
    }

    fn port_matches(&self, port: u16) -> bool {
        !matches!(self.port, Some(p) if p != port)
    }

    /// Whether a connection to `target:port` matches.
    pub fn matches(&self, target: &Target, port: u16) -> bool {
        if !self.port_matches(port) {
            return false;
        }
        match (&self.shape, target) {
            (Shape::AnyName, Target::Name(_)) => true,
            (Shape::Name(n), Target::Name(t)) => n == t,
            (Shape::Domain(d), Target::Name(t)) => {
                t == d
                    || t.strip_suffix(d.as_str())
                        .is_some_and(|head| head.ends_with('.'))
            }
            (Shape::Net { .. }, Target::Addr(a)) => self.covers(*a, port),
            _ => false,
        }
    }

    /// Whether this is an address pattern that covers `addr:port`.
    pub fn covers(&self, addr: IpAddr, port: u16) -> bool {
        let Shape::Net { addr: net, prefix } = self.shape else {
            return false;
        };
        let addr = canonical_addr(addr);
        self.port_matches(port) && addr.is_ipv4() == net.is_ipv4() && mask(addr, prefix) == net
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = match &self.shape {
            Shape::AnyName => "*".to_owned(),
            Shape::Name(n) => n.clone(),
            Shape::Domain(d) => format!("*.{d}"),
            Shape::Net { addr, prefix } if *prefix == max_prefix(*addr) => addr.to_string(),
            Shape::Net { addr, prefix } => format!("{addr}/{prefix}"),
        };
        let v6 = matches!(
            self.shape,
            Shape::Net {
                addr: IpAddr::V6(_),
                ..
            }
        );
        match self.port {
            Some(p) if v6 => write!(f, "[{host}]:{p}"),
            Some(p) => write!(f, "{host}:{p}"),
            None => f.write_str(&host),
        }
    }
}

fn max_prefix(addr: IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

/// `addr` with every bit after the first `prefix` cleared.
fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// Why an address is refused unless written out, or `None` for an ordinary public address.
pub fn special_address(addr: IpAddr) -> Option<&'static str> {
    match canonical_addr(addr) {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_private() {
                Some("private")
            } else if o == [169, 254, 169, 254] {
                Some("the cloud metadata service")
            } else if a.is_link_local() {
                Some("link-local")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("shared (carrier-grade NAT)")
            } else if a.is_unspecified() || o[0] == 0 {
                Some("unspecified (\"this network\")")
            } else if a.is_multicast() || a.is_broadcast() || o[0] >= 240 {
                Some("multicast, broadcast or reserved")
            } else if a.is_documentation() || (o[0] == 198 && (o[1] & 0xfe) == 18) {
                Some("documentation or benchmarking")
            } else if o[0] == 192 && o[1] == 0 && o[2] == 0 {
                Some("IETF protocol assignments")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if (s[0] & 0xfe00) == 0xfc00 {
                Some("unique local (private)")
            } else if (s[0] & 0xffc0) == 0xfe80 {
                Some("link-local")
            } else if a.is_multicast() {
                Some("multicast")
            } else if s[0] == 0x2001 && s[1] == 0x0db8 {
                Some("documentation")
            } else if s[0] == 0x64 && s[1] == 0xff9b {
                // NAT64 carries an IPv4 address; its own check is the embedded one.
                let v4 =
                    Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
                special_address(IpAddr::V4(v4))
            } else if s[..6] == [0, 0, 0, 0, 0, 0] {
                Some("IPv4-compatible (deprecated)")
            } else {
                None
            }
        }
    }
}

/// Where an allow or deny pattern came from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// `network.egress.allow[i]` / `deny[i]`.
    List,
    /// `network.egress.presets[i]`: the preset's name.
    Preset(&'static str),
    /// `--allow-host` given to `agentdiff run`.
    Command,
}

#[derive(Debug, Clone)]
struct Entry {
    pattern: HostPattern,
    rule: String,
    origin: Origin,
}

/// A connection decision: allow or deny, with the rule and pattern that made it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EgressDecision {
    pub action: Action,
    /// The host as the client asked for it, normalised.
    pub host: String,
    pub port: u16,
    /// `network.egress.deny[0]`, `network.egress.allow[1]`, `network.egress.presets[0]`,
    /// `--allow-host[0]`, `network.egress.default`, `network.egress.invalid_host` or
    /// `network.egress.internal_address`.
    pub rule: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
    /// Why, in one sentence.
    pub reason: String,
}

/// What a refused connection is in the run's findings (`network.egress.on_denied`): a refusal
/// is never silent, so there is no `allow`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDenied {
    /// A `review` finding (the default): the run needs a look, `--fail-on deny` passes it.
    #[default]
    Review,
    /// A `deny` finding: the run's outcome is deny, `--fail-on deny` fails it.
    Deny,
}

impl OnDenied {
    /// The values a policy may write.
    pub const NAMES: [&'static str; 2] = ["review", "deny"];

    /// The value `text` names, if any.
    pub fn parse(text: &str) -> Option<OnDenied> {
        match text {
            "review" => Some(OnDenied::Review),
            "deny" => Some(OnDenied::Deny),
            _ => None,
        }
    }

    /// The finding's level.
    pub fn action(self) -> Action {
        match self {
            OnDenied::Review => Action::Review,
            OnDenied::Deny => Action::Deny,
        }
    }

    /// The word a policy writes.
    pub fn as_str(self) -> &'static str {
        self.action().as_str()
    }
}

/// The patterns as written, checked (`network.egress` of a document).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EgressSpec {
    pub(crate) allow: Vec<String>,
    pub(crate) deny: Vec<String>,
    pub(crate) presets: Vec<String>,
    pub(crate) on_denied: OnDenied,
}

/// The compiled `network.egress` section, plus hosts `agentdiff run --allow-host` added.
#[derive(Debug, Clone, Default)]
pub struct Egress {
    deny: Vec<Entry>,
    allow: Vec<Entry>,
    presets: Vec<String>,
    on_denied: OnDenied,
}

impl Egress {
    /// Compile a checked spec; a pattern that does not parse is a problem naming its key.
    pub(crate) fn compile(spec: &EgressSpec) -> Result<Egress, Vec<String>> {
        let mut problems = Vec::new();
        let mut egress = Egress {
            on_denied: spec.on_denied,
            ..Egress::default()
        };
        let mut add = |key: &str, list: &[String], out: &mut Vec<Entry>| {
            for (i, text) in list.iter().enumerate() {
                let rule = format!("network.egress.{key}[{i}]");
                match HostPattern::parse(text) {
                    Ok(pattern) => out.push(Entry {
                        pattern,
                        rule,
                        origin: Origin::List,
                    }),
                    Err(reason) => problems.push(format!("{rule}: {reason}")),
                }
            }
        };
        add("deny", &spec.deny, &mut egress.deny);
        add("allow", &spec.allow, &mut egress.allow);
        for (i, name) in spec.presets.iter().enumerate() {
            let rule = format!("network.egress.presets[{i}]");
            let Some((preset, patterns)) = PRESETS.iter().find(|(n, _)| n == name) else {
                problems.push(format!(
                    "{rule}: {name:?} is not a preset (known: {})",
                    PRESETS.map(|(n, _)| n).join(", ")
                ));
                continue;
            };
            for text in patterns.iter() {
                match HostPattern::parse(text) {
                    Ok(pattern) => egress.allow.push(Entry {
                        pattern,
                        rule: rule.clone(),
                        origin: Origin::Preset(preset),
                    }),
                    Err(reason) => problems.push(format!("{rule}: {reason}")),
                }
            }
            egress.presets.push(name.clone());
        }
        if problems.is_empty() {
            Ok(egress)
        } else {
            Err(problems)
        }
    }

    /// Add `--allow-host` patterns (after the policy's own, so the policy's rules are reported
    /// first when both match). A bad pattern is a problem naming its position.
    pub(crate) fn add_command_hosts(&mut self, hosts: &[String]) -> Result<(), Vec<String>> {
        let first = self.command_hosts().count();
        let mut problems = Vec::new();
        for (i, text) in hosts.iter().enumerate() {
            let rule = format!("--allow-host[{}]", first + i);
            match HostPattern::parse(text) {
                Ok(pattern) => self.allow.push(Entry {
                    pattern,
                    rule,
                    origin: Origin::Command,
                }),
                Err(reason) => problems.push(format!("--allow-host {text:?}: {reason}")),
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }

    fn command_hosts(&self) -> impl Iterator<Item = &Entry> {
        self.allow.iter().filter(|e| e.origin == Origin::Command)
    }

    /// Whether any connection can be allowed (an empty allow list denies everything).
    pub fn allows_anything(&self) -> bool {
        !self.allow.is_empty()
    }

    /// Whether the section is absent (nothing allowed or denied, no preset).
    pub fn is_empty(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty() && self.presets.is_empty()
    }

    /// `deny` as written (canonical form).
    pub fn deny_patterns(&self) -> Vec<String> {
        self.deny.iter().map(|e| e.pattern.to_string()).collect()
    }

    /// `allow` of the effective document: the policy's own patterns, then `--allow-host`'s
    /// (preset patterns stay behind their preset's name).
    pub fn allow_patterns(&self) -> Vec<String> {
        self.allow
            .iter()
            .filter(|e| !matches!(e.origin, Origin::Preset(_)))
            .map(|e| e.pattern.to_string())
            .collect()
    }

    /// The presets named, in order.
    pub fn presets(&self) -> &[String] {
        &self.presets
    }

    /// What a refused connection is in the run's findings (`network.egress.on_denied`).
    pub fn on_denied(&self) -> OnDenied {
        self.on_denied
    }

    /// Decide a connection to `host:port` as the client names it, before resolution.
    pub fn decide(&self, host: &str, port: u16) -> EgressDecision {
        let target = match Target::parse(host) {
            Ok(t) => t,
            Err(reason) => {
                return EgressDecision {
                    action: Action::Deny,
                    host: shown(host),
                    port,
                    rule: "network.egress.invalid_host".to_owned(),
                    pattern: None,
                    reason: reason.to_string(),
                }
            }
        };
        let mut decision = self.decide_target(&target, port);
        // Said so the record shows why a name-looking host was decided as an address.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let (Target::Addr(addr), Err(_)) = (&target, bare.parse::<IpAddr>()) {
            decision.reason = format!(
                "{} is the address {addr} to the resolver (inet_aton form), decided as that \
                 address: {}",
                shown(host),
                decision.reason
            );
        }
        decision
    }

    /// [`Egress::decide`] for a parsed target.
    fn decide_target(&self, target: &Target, port: u16) -> EgressDecision {
        let made = |action, entry: &Entry, why: &str| {
            let pattern = entry.pattern.to_string();
            let from = match entry.origin {
                Origin::Preset(name) => format!(" (preset {name})"),
                _ => String::new(),
            };
            EgressDecision {
                action,
                host: target.to_string(),
                port,
                rule: entry.rule.clone(),
                reason: format!(
                    "{} matches {} `{pattern}`{from}; {why}",
                    target.with_port(port),
                    entry.rule
                ),
                pattern: Some(pattern),
            }
        };
        if let Some(e) = self.deny.iter().find(|e| e.pattern.matches(target, port)) {
            return made(Action::Deny, e, "deny takes precedence over allow");
        }
        if let Some(e) = self.allow.iter().find(|e| e.pattern.matches(target, port)) {
            let allowed = made(Action::Allow, e, "no deny pattern matches");
            // An address needs no resolution: it is checked as a resolved one would be.
            return match target {
                Target::Addr(addr) => self.check_address(&allowed, *addr, port),
                Target::Name(_) => None,
            }
            .unwrap_or(allowed);
        }
        EgressDecision {
            action: Action::Deny,
            host: target.to_string(),
            port,
            rule: "network.egress.default".to_owned(),
            pattern: None,
            reason: format!(
                "no network.egress allow pattern matches {}",
                target.with_port(port)
            ),
        }
    }

    /// What a run decides for `host:port`, as far as is known without resolving (`policy
    /// explain`): [`Egress::decide`], then, for a name that is loopback by definition
    /// (`localhost` and names below it, RFC 6761), the address check a run applies to
    /// 127.0.0.1. Any other name's addresses are checked only when a run resolves it.
    pub fn explain(&self, host: &str, port: u16) -> EgressDecision {
        let decision = self.decide(host, port);
        if decision.action != Action::Allow {
            return decision;
        }
        match Target::parse(host) {
            Ok(Target::Name(name)) if name == "localhost" || name.ends_with(".localhost") => self
                .check_address(&decision, IpAddr::V4(Ipv4Addr::LOCALHOST), port)
                .unwrap_or(decision),
            _ => decision,
        }
    }

    /// Check an address a connection would reach (after `allowed` was decided for its host):
    /// `None` when it may be reached, else the denying decision. A deny address pattern always
    /// refuses; an internal address (see [`special_address`]) is refused unless an allow
    /// address pattern covers it.
    pub fn check_address(
        &self,
        allowed: &EgressDecision,
        addr: IpAddr,
        port: u16,
    ) -> Option<EgressDecision> {
        let deny = |rule: String, pattern: Option<String>, reason: String| EgressDecision {
            action: Action::Deny,
            host: allowed.host.clone(),
            port,
            rule,
            pattern,
            reason,
        };
        if let Some(e) = self.deny.iter().find(|e| e.pattern.covers(addr, port)) {
            let pattern = e.pattern.to_string();
            return Some(deny(
                e.rule.clone(),
                Some(pattern.clone()),
                format!(
                    "{} resolves to {addr}, which {} `{pattern}` denies",
                    allowed.host, e.rule
                ),
            ));
        }
        let kind = special_address(addr)?;
        if self.allow.iter().any(|e| e.pattern.covers(addr, port)) {
            return None;
        }
        Some(deny(
            "network.egress.internal_address".to_owned(),
            None,
            format!(
                "{} resolves to {addr}, a {kind} address, which is reached only when an allow \
                 pattern writes it out",
                allowed.host
            ),
        ))
    }
}

#[cfg(test)]
mod tests;
