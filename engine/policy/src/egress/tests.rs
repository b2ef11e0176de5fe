//! The host matcher: patterns, targets, precedence, internal addresses; properties over
//! generated names and addresses.

use super::*;
use proptest::prelude::*;

fn egress(allow: &[&str], deny: &[&str], presets: &[&str]) -> Egress {
    let own = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect();
    Egress::compile(&EgressSpec {
        allow: own(allow),
        deny: own(deny),
        presets: own(presets),
        on_denied: OnDenied::default(),
    })
    .unwrap()
}

fn verdict(e: &Egress, host: &str, port: u16) -> (Action, String) {
    let d = e.decide(host, port);
    (d.action, d.rule)
}

#[test]
fn wildcard_matches_apex_and_below_label_aligned() {
    let e = egress(&["*.npmjs.org"], &[], &[]);
    for host in ["npmjs.org", "registry.npmjs.org", "a.b.NPMJS.org."] {
        assert_eq!(e.decide(host, 443).action, Action::Allow, "{host}");
    }
    for host in ["evilnpmjs.org", "npmjs.org.evil.com", "npmjs.orgx", "org"] {
        assert_eq!(e.decide(host, 443).action, Action::Deny, "{host}");
    }
}

#[test]
fn exact_names_and_ports() {
    let e = egress(&["api.anthropic.com:443", "example.com"], &[], &[]);
    assert_eq!(
        verdict(&e, "api.anthropic.com", 443),
        (Action::Allow, "network.egress.allow[0]".into())
    );
    assert_eq!(
        verdict(&e, "api.anthropic.com", 80),
        (Action::Deny, "network.egress.default".into())
    );
    assert_eq!(e.decide("example.com", 8080).action, Action::Allow);
    assert_eq!(e.decide("www.example.com", 443).action, Action::Deny);
}

#[test]
fn deny_comes_before_allow_whatever_the_order() {
    let e = egress(&["*.example.com", "*"], &["secret.example.com"], &[]);
    let d = e.decide("secret.example.com", 443);
    assert_eq!(
        (d.action, d.rule.as_str(), d.pattern.as_deref()),
        (
            Action::Deny,
            "network.egress.deny[0]",
            Some("secret.example.com")
        )
    );
    assert!(d.reason.contains("deny takes precedence"), "{}", d.reason);
    assert_eq!(e.decide("www.example.com", 443).action, Action::Allow);
}

#[test]
fn names_never_match_addresses_and_back() {
    let e = egress(&["*"], &[], &[]);
    assert_eq!(e.decide("anything.test", 1).action, Action::Allow);
    for host in ["127.0.0.1", "[::1]", "::1", "10.1.2.3", "::ffff:127.0.0.1"] {
        assert_eq!(
            verdict(&e, host, 80),
            (Action::Deny, "network.egress.default".into()),
            "{host}"
        );
    }
    let e = egress(&["10.0.0.0/8", "[::1]:8080", "192.0.2.7"], &[], &[]);
    assert_eq!(e.decide("10.200.0.1", 22).action, Action::Allow);
    assert_eq!(e.decide("[::1]", 8080).action, Action::Allow);
    assert_eq!(e.decide("::1", 8081).action, Action::Deny);
    assert_eq!(e.decide("192.0.2.7", 1).action, Action::Allow);
    assert_eq!(e.decide("192.0.2.8", 1).action, Action::Deny);
    assert_eq!(e.decide("ten.example", 1).action, Action::Deny);
}

#[test]
fn malformed_hosts_and_names_ending_in_a_number_are_invalid() {
    let e = egress(&["*"], &[], &[]);
    for host in [
        "",
        "a..b",
        "-a.com",
        "bad host",
        "é.com",
        // Not addresses to inet_aton, but ending in a number in some base.
        "a.0x1",
        "a.b.017",
        "host.0x",
        "1.2.3.4.5",
        "256.1.1.1.1",
        "08.1",
    ] {
        let d = e.decide(host, 80);
        assert_eq!(
            (d.action, d.rule.as_str()),
            (Action::Deny, "network.egress.invalid_host"),
            "{host}"
        );
    }
}

/// What glibc's inet_aton reads, checked against glibc itself in `inet_aton_agrees_with_glibc`.
#[test]
fn inet_aton_forms_are_read_as_the_c_resolver_reads_them() {
    let v4 = |s: &str| s.parse::<Ipv4Addr>().unwrap();
    for (text, addr) in [
        ("0x2c000001", Some(v4("44.0.0.1"))),
        ("44.0.0.0x1", Some(v4("44.0.0.1"))),
        ("0x2c.0x1", Some(v4("44.0.0.1"))),
        ("0X2C.0X000001", Some(v4("44.0.0.1"))),
        ("127.1", Some(v4("127.0.0.1"))),
        ("0177.0.0.1", Some(v4("127.0.0.1"))),
        ("127.0.0.01", Some(v4("127.0.0.1"))),
        ("2130706433", Some(v4("127.0.0.1"))),
        ("0", Some(v4("0.0.0.0"))),
        ("1.2.65535", Some(v4("1.2.255.255"))),
        ("1.16777215", Some(v4("1.255.255.255"))),
        ("4294967295", Some(v4("255.255.255.255"))),
        ("4294967296", None),
        ("0x100000000", None),
        ("1.2.65536", None),
        ("1.16777216", None),
        ("256.1", None),
        ("1.2.3.256", None),
        ("1.2.3.4.5", None),
        ("08", None),
        ("0x", None),
        ("0xg", None),
        ("1..2", None),
        ("1.2.3.4.", None),
        (".1", None),
        ("", None),
        ("+1", None),
        ("0x+1", None),
        ("a.1", None),
    ] {
        assert_eq!(inet_aton(text), addr, "{text:?}");
    }
}

#[test]
fn inet_aton_hosts_are_decided_as_their_address() {
    // `*` is names only: an inet_aton host is an address and needs an address pattern.
    let e = egress(&["*"], &[], &[]);
    for host in ["0x2c000001", "44.0.0.0x1", "0x2c.0x1", "0x2c000001."] {
        let d = e.decide(host, 80);
        assert_eq!(
            (d.action, d.rule.as_str(), d.host.as_str()),
            (Action::Deny, "network.egress.default", "44.0.0.1"),
            "{host}"
        );
        assert!(d.reason.contains("inet_aton"), "{}", d.reason);
    }
    let e = egress(&["*", "44.0.0.1:80"], &["10.0.0.0/8"], &[]);
    assert_eq!(verdict(&e, "0x2c.1", 80).0, Action::Allow);
    assert_eq!(verdict(&e, "0x2c.1", 81).0, Action::Deny);
    assert_eq!(
        verdict(&e, "012.1", 80),
        (Action::Deny, "network.egress.deny[0]".to_owned())
    );
    // Loopback is still internal whatever its spelling.
    let e = egress(&["*", "10.0.0.0/8"], &[], &[]);
    assert_eq!(
        verdict(&e, "0x7f.1", 80),
        (Action::Deny, "network.egress.default".to_owned())
    );
    // A bracket is for IPv6 only, whatever is inside.
    assert_eq!(
        verdict(&e, "[0x7f.1]", 80).1,
        "network.egress.invalid_host".to_owned()
    );
}

#[test]
fn a_huge_refused_host_is_shown_cut() {
    let e = egress(&["*"], &[], &[]);
    let huge = format!("{}!", "a".repeat(60_000));
    let d = e.decide(&huge, 443);
    assert_eq!(d.rule, "network.egress.invalid_host");
    assert!(d.host.chars().count() <= 129, "{}", d.host.len());
    assert!(d.reason.len() < 300, "{}", d.reason.len());
}

#[test]
fn bad_patterns_are_refused_with_a_reason() {
    for text in [
        "",
        "*.",
        "a*.com",
        "*.*.com",
        "host:0",
        "host:70000",
        "host:x",
        "[::1",
        "[::1]x",
        "[example.com]:80",
        "[10.0.0.1]",
        "10.0.0.0/33",
        "::/129",
        "nope/8",
        "127.1",
        "0x2c000001",
        "44.0.0.0x1",
        "0x2c.0x1",
        "0177.0.0.1",
        "0x7f.1:80",
        "*.0x1",
        "a.0x1",
        "exa mple.com",
    ] {
        assert!(HostPattern::parse(text).is_err(), "{text:?} parsed");
    }
    let err = HostPattern::parse("0x2c.0x1").unwrap_err().to_string();
    assert!(err.contains("44.0.0.1"), "{err}");
}

#[test]
fn patterns_print_canonically() {
    for (text, shown) in [
        ("API.Example.COM.", "api.example.com"),
        ("*.Example.com:443", "*.example.com:443"),
        ("10.9.8.7/8", "10.0.0.0/8"),
        ("[::1]:80", "[::1]:80"),
        ("[fd00::/8]:443", "[fd00::/8]:443"),
        ("::ffff:10.0.0.1", "10.0.0.1"),
        ("fd00::1/8", "fd00::/8"),
        ("*", "*"),
        ("*:22", "*:22"),
    ] {
        assert_eq!(HostPattern::parse(text).unwrap().to_string(), shown);
    }
}

#[test]
fn internal_addresses_need_an_address_pattern() {
    let e = egress(&["*.test", "127.0.0.2"], &["203.0.113.0/24"], &[]);
    let allowed = e.decide("svc.test", 443);
    assert_eq!(allowed.action, Action::Allow);
    for addr in [
        "127.0.0.1",
        "10.0.0.1",
        "172.16.5.5",
        "192.168.1.1",
        "169.254.169.254",
        "169.254.1.1",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
        "255.255.255.255",
        "::1",
        "::",
        "fd12::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
    ] {
        let d = e.check_address(&allowed, addr.parse().unwrap(), 443);
        let d = d.unwrap_or_else(|| panic!("{addr} passed"));
        assert_eq!(d.rule, "network.egress.internal_address", "{addr}");
        assert_eq!(d.action, Action::Deny);
    }
    let meta = e
        .check_address(&allowed, "169.254.169.254".parse().unwrap(), 80)
        .unwrap();
    assert!(meta.reason.contains("metadata"), "{}", meta.reason);
    // Listed: reachable.
    assert!(e
        .check_address(&allowed, "127.0.0.2".parse().unwrap(), 443)
        .is_none());
    // Public: reachable, unless a deny address pattern covers it.
    assert!(e
        .check_address(&allowed, "93.184.216.34".parse().unwrap(), 443)
        .is_none());
    let d = e
        .check_address(&allowed, "203.0.113.9".parse().unwrap(), 443)
        .unwrap();
    assert_eq!(d.rule, "network.egress.deny[0]");
}

#[test]
fn presets_expand_with_their_rule() {
    let e = egress(&[], &[], &["npm", "github"]);
    let d = e.decide("registry.npmjs.org", 443);
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Allow, "network.egress.presets[0]")
    );
    assert!(d.reason.contains("preset npm"), "{}", d.reason);
    assert_eq!(e.decide("registry.npmjs.org", 80).action, Action::Deny);
    assert_eq!(
        e.decide("codeload.github.com", 443).rule,
        "network.egress.presets[1]"
    );
    assert!(e.allow_patterns().is_empty());
    assert_eq!(e.presets(), ["npm", "github"]);
    // Every preset's patterns parse.
    for (name, patterns) in PRESETS {
        for p in patterns {
            assert!(HostPattern::parse(p).is_ok(), "{name}: {p}");
        }
    }
    assert!(Egress::compile(&EgressSpec {
        presets: vec!["nope".into()],
        ..EgressSpec::default()
    })
    .is_err());
}

#[test]
fn command_hosts_come_after_the_policy() {
    let mut e = egress(&["a.test"], &["b.test"], &[]);
    e.add_command_hosts(&["a.test".into(), "*.b.test".into(), "c.test:8080".into()])
        .unwrap();
    assert_eq!(e.decide("a.test", 1).rule, "network.egress.allow[0]");
    assert_eq!(e.decide("b.test", 1).rule, "network.egress.deny[0]");
    assert_eq!(e.decide("x.b.test", 1).rule, "--allow-host[1]");
    assert_eq!(e.decide("c.test", 8080).rule, "--allow-host[2]");
    assert_eq!(
        e.allow_patterns(),
        ["a.test", "a.test", "*.b.test", "c.test:8080"]
    );
    let err = e.add_command_hosts(&["bad host".into()]).unwrap_err();
    assert!(err[0].contains("--allow-host \"bad host\""), "{err:?}");
}

fn label() -> impl Strategy<Value = String> {
    "[a-z][a-z0-9-]{0,8}[a-z0-9]"
}

fn name() -> impl Strategy<Value = String> {
    prop::collection::vec(label(), 1..5).prop_map(|l| l.join("."))
}

proptest! {
    /// `*.d` matches exactly the names equal to `d` or ending in `.d`.
    #[test]
    fn domain_wildcard_is_label_aligned(d in name(), host in name(), prefix in name()) {
        let e = egress(&[&format!("*.{d}")], &[], &[]);
        let below = format!("{prefix}.{d}");
        prop_assert_eq!(e.decide(&below, 443).action, Action::Allow);
        prop_assert_eq!(e.decide(&d, 443).action, Action::Allow);
        let expected = host == d || host.ends_with(&format!(".{d}"));
        prop_assert_eq!(e.decide(&host, 443).action == Action::Allow, expected);
        // Glued on without a dot: never.
        let glued = format!("x{d}");
        prop_assert_eq!(e.decide(&glued, 443).action, Action::Deny);
    }

    /// A deny pattern that matches wins over any allow pattern.
    #[test]
    fn deny_wins(host in name(), port in 1u16..) {
        let e = egress(&["*", &host, &format!("{host}:{port}")], &[&host], &[]);
        let d = e.decide(&host, port);
        prop_assert_eq!(d.action, Action::Deny);
        prop_assert_eq!(d.rule, "network.egress.deny[0]");
    }

    /// A CIDR covers exactly the addresses sharing its first `prefix` bits.
    #[test]
    fn cidr_covers_by_prefix(net in any::<u32>(), addr in any::<u32>(), prefix in 0u8..=32) {
        let net = Ipv4Addr::from(net);
        let pattern = HostPattern::parse(&format!("{net}/{prefix}")).unwrap();
        let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
        let expected = (addr & m) == (u32::from(net) & m);
        prop_assert_eq!(pattern.covers(IpAddr::V4(Ipv4Addr::from(addr)), 1), expected);
    }

    /// Whatever is allowed by name, a name that resolves to loopback or a private address
    /// reaches it only when an address pattern lists it.
    #[test]
    fn internal_addresses_are_refused_unless_listed(host in name(), last in 1u8..255) {
        let e = egress(&["*"], &[], &[]);
        let allowed = e.decide(&host, 443);
        prop_assert_eq!(allowed.action, Action::Allow);
        for addr in [Ipv4Addr::new(127, 0, 0, last), Ipv4Addr::new(10, last, 0, 1),
                     Ipv4Addr::new(192, 168, last, 1), Ipv4Addr::new(169, 254, last, 254)] {
            prop_assert!(e.check_address(&allowed, IpAddr::V4(addr), 443).is_some());
        }
        let listed = egress(&["*", &format!("127.0.0.{last}")], &[], &[]);
        let allowed = listed.decide(&host, 443);
        let addr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, last));
        prop_assert!(listed.check_address(&allowed, addr, 443).is_none());
    }

    /// Parsing never panics, and a pattern's canonical form parses to the same pattern.
    #[test]
    fn canonical_form_round_trips(text in "[a-z0-9*.:/\\[\\]-]{0,30}") {
        if let Ok(p) = HostPattern::parse(&text) {
            let again = HostPattern::parse(&p.to_string()).unwrap();
            prop_assert_eq!(again, p);
        }
    }
}

extern "C" {
    // glibc's own reader, the oracle for ours.
    #[link_name = "inet_aton"]
    fn c_inet_aton(cp: *const libc::c_char, inp: *mut libc::in_addr) -> libc::c_int;
}

fn glibc_inet_aton(text: &str) -> Option<Ipv4Addr> {
    let c = std::ffi::CString::new(text).ok()?;
    let mut out = libc::in_addr { s_addr: 0 };
    // SAFETY: a NUL-terminated string and an in_addr we own.
    let ok = unsafe { c_inet_aton(c.as_ptr(), &mut out) };
    (ok != 0).then(|| Ipv4Addr::from(u32::from_be(out.s_addr)))
}

/// `addr` written as inet_aton reads it: `parts` parts, each in a base chosen by `bases`, with
/// up to `zeros` leading zeros.
fn inet_form(addr: u32, parts: usize, bases: [u8; 4], zeros: [usize; 4]) -> String {
    let b = addr.to_be_bytes();
    let values: Vec<u32> = match parts {
        1 => vec![addr],
        2 => vec![b[0].into(), addr & 0xff_ffff],
        3 => vec![b[0].into(), b[1].into(), addr & 0xffff],
        _ => b.iter().map(|x| u32::from(*x)).collect(),
    };
    values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let z = "0".repeat(zeros[i]);
            match bases[i] % 3 {
                0 => format!("{v}"),
                1 => format!("0{z}{v:o}"),
                _ if bases[i] % 2 == 0 => format!("0x{z}{v:x}"),
                _ => format!("0X{z}{v:X}"),
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

proptest! {
    /// Ours and glibc's inet_aton agree on strings made of number characters and dots.
    #[test]
    fn inet_aton_agrees_with_glibc(text in "[0-9a-fA-FxX.]{0,24}") {
        prop_assert_eq!(inet_aton(&text), glibc_inet_aton(&text), "{:?}", text);
    }

    /// Every inet_aton spelling of an address is decided exactly as the address written out,
    /// and refused as a pattern.
    #[test]
    fn every_inet_aton_form_is_its_address(
        addr in any::<u32>(),
        parts in 1usize..=4,
        bases in any::<[u8; 4]>(),
        zeros in prop::array::uniform4(0usize..3),
        port in 1u16..,
    ) {
        let form = inet_form(addr, parts, bases, zeros);
        let literal = Ipv4Addr::from(addr).to_string();
        prop_assert_eq!(glibc_inet_aton(&form), Some(Ipv4Addr::from(addr)), "{}", &form);
        prop_assert_eq!(inet_aton(&form), Some(Ipv4Addr::from(addr)), "{}", &form);
        for e in [
            egress(&["*"], &[], &[]),
            egress(&["*", &literal], &[], &[]),
            egress(&["0.0.0.0/0"], &[&format!("{literal}:{port}")], &[]),
            egress(&["*.example", "0.0.0.0/1"], &[], &[]),
        ] {
            let (a, b) = (e.decide(&form, port), e.decide(&literal, port));
            prop_assert_eq!((a.action, &a.rule, &a.host), (b.action, &b.rule, &b.host), "{}", &form);
        }
        if form != literal {
            prop_assert!(HostPattern::parse(&form).is_err(), "{}", &form);
        }
    }
}

/// `localhost` is loopback by definition: explain refuses it as a run would, unless the
/// loopback address is written out; other names are decided by name only.
#[test]
fn explain_applies_the_address_check_to_localhost() {
    let e = egress(&["*.localhost:8080", "*.example"], &[], &[]);
    for host in ["localhost", "LOCALHOST.", "app.localhost"] {
        let d = e.explain(host, 8080);
        assert_eq!(
            (d.action, d.rule.as_str()),
            (Action::Deny, "network.egress.internal_address"),
            "{host}"
        );
        assert!(d.reason.contains("loopback"), "{}", d.reason);
    }
    assert_eq!(e.explain("a.example", 443).action, Action::Allow);
    let e = egress(&["localhost", "127.0.0.1:8080"], &[], &[]);
    assert_eq!(e.explain("localhost", 8080).action, Action::Allow);
    assert_eq!(e.explain("localhost", 8081).action, Action::Deny);
}
