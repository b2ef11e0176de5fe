//! Policy engine: the documented example policy, decision tables and properties.

use std::ffi::OsStr;

use agentdiff_policy::{load, normalize_path, Action, NetworkMode, Phase, Policy, PolicySource};
use proptest::prelude::*;

const SEED_POLICY: &str = include_str!("../fixtures/seed-policy.yaml");

fn seed() -> Policy {
    Policy::from_yaml_or_json(SEED_POLICY, "seed-policy.yaml")
        .expect("the documented example loads")
}

#[test]
fn documented_example_policy_settings() {
    let p = seed();
    assert_eq!(p.version(), 1);
    assert_eq!(p.network_mode(), NetworkMode::Observe);
    assert_eq!(p.limits().files_changed, Some(40));
    assert_eq!(p.limits().files_deleted, None);
    assert_eq!(p.limits().processes_spawned, Some(8));
    assert_eq!(p.limits().duration_seconds, Some(900));
    assert!(p.rollback().enabled);
    assert_eq!(p.rollback().max_backup_file_mb, 10);
    assert_eq!(p.weights().sensitive_path, 40);
    assert_eq!(p.weights().review_created, 8, "unset weights keep defaults");
    assert_eq!(
        p.deny_patterns(),
        [".env", ".env.*", ".git/**", "**/*.pem", "**/*.key"]
    );
}

#[test]
fn documented_example_path_decisions() {
    let p = seed();
    // (path, action, rule, pattern)
    let table: &[(&str, Action, &str, Option<&str>)] = &[
        (".env", Action::Deny, "filesystem.deny[0]", Some(".env")),
        (
            ".env.production",
            Action::Deny,
            "filesystem.deny[1]",
            Some(".env.*"),
        ),
        (".git", Action::Deny, "filesystem.deny[2]", Some(".git/**")),
        (
            ".git/HEAD",
            Action::Deny,
            "filesystem.deny[2]",
            Some(".git/**"),
        ),
        (
            "src/tls/server.pem",
            Action::Deny,
            "filesystem.deny[3]",
            Some("**/*.pem"),
        ),
        (
            "deploy.key",
            Action::Deny,
            "filesystem.deny[4]",
            Some("**/*.key"),
        ),
        (
            "docs/secret.key",
            Action::Deny,
            "filesystem.deny[4]",
            Some("**/*.key"),
        ),
        (
            "docs/guide.md",
            Action::Review,
            "filesystem.review[0]",
            Some("docs/**"),
        ),
        (
            "src/auth.py",
            Action::Allow,
            "filesystem.allow_write[0]",
            Some("src/**"),
        ),
        (
            "src/a/b/c.rs",
            Action::Allow,
            "filesystem.allow_write[0]",
            Some("src/**"),
        ),
        (
            "src",
            Action::Allow,
            "filesystem.allow_write[0]",
            Some("src/**"),
        ),
        (
            "tests/t.py",
            Action::Allow,
            "filesystem.allow_write[1]",
            Some("tests/**"),
        ),
        ("README.md", Action::Review, "filesystem.default", None),
        ("srcx/a.rs", Action::Review, "filesystem.default", None),
        ("lib/src/a.rs", Action::Review, "filesystem.default", None),
        ("sub/.env", Action::Review, "filesystem.default", None),
        (".envrc", Action::Review, "filesystem.default", None),
        // Read as `src/win.rs` it is allowed, but on Linux it is one name in the root, which
        // the default reviews: the stricter reading counts.
        ("src\\win.rs", Action::Review, "filesystem.default", None),
    ];
    for (path, action, rule, pattern) in table {
        let d = p.decide_path(path, Phase::PostRun).unwrap();
        assert_eq!(d.action, *action, "{path}");
        assert_eq!(d.rule, *rule, "{path}");
        assert_eq!(d.pattern.as_deref(), *pattern, "{path}");
        assert_eq!(d.policy_version, 1);
        assert_eq!(d.phase, Phase::PostRun);
        assert!(!d.reason.is_empty());
    }
}

#[test]
fn documented_example_command_decisions() {
    let p = seed();
    let table: &[(&str, Action, &str)] = &[
        ("python3", Action::Allow, "process.allow[0]"),
        ("/usr/bin/python3.12", Action::Allow, "process.allow[0]"),
        ("python", Action::Allow, "process.allow[0]"),
        ("node", Action::Review, "process.review[0]"),
        ("/usr/bin/node", Action::Review, "process.review[0]"),
        ("nodejs", Action::Review, "process.default"),
        ("curl", Action::Deny, "process.deny[0]"),
        ("/opt/bin/curl", Action::Deny, "process.deny[0]"),
        ("wget", Action::Review, "process.default"),
        ("bash -c curl", Action::Review, "process.default"),
    ];
    for (argv0, action, rule) in table {
        let d = p.decide_command(OsStr::new(argv0));
        assert_eq!((d.action, d.rule.as_str()), (*action, *rule), "{argv0}");
        assert_eq!(d.phase, Phase::Command);
    }
}

#[test]
fn decision_serialises_with_full_provenance() {
    let d = seed().decide_path(".env", Phase::PreToolUse).unwrap();
    let json = serde_json::to_value(&d).unwrap();
    assert_eq!(json["action"], "deny");
    assert_eq!(json["subject"], ".env");
    assert_eq!(json["rule"], "filesystem.deny[0]");
    assert_eq!(json["pattern"], ".env");
    assert_eq!(json["policy_version"], 1);
    assert_eq!(json["phase"], "pre_tool_use");
    let back: agentdiff_policy::Decision = serde_json::from_value(json).unwrap();
    assert_eq!(back, d);
}

#[test]
fn load_records_the_source() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        load(dir.path(), None).unwrap().source,
        PolicySource::BuiltIn
    );
    let file = dir.path().join("agentdiff.yaml");
    std::fs::write(&file, SEED_POLICY).unwrap();
    let loaded = load(dir.path(), None).unwrap();
    let PolicySource::File { path, sha256 } = &loaded.source else {
        panic!("expected a file source");
    };
    assert_eq!(path, &file);
    // sha256 of the exact bytes (checked against an independent implementation).
    use sha2::Digest;
    assert_eq!(
        *sha256,
        hex::encode(sha2::Sha256::digest(SEED_POLICY.as_bytes()))
    );
    let json = serde_json::to_value(&loaded.source).unwrap();
    assert_eq!(json["kind"], "file");
    assert_eq!(
        serde_json::to_value(PolicySource::BuiltIn).unwrap()["kind"],
        "built_in"
    );
}

#[test]
fn unquoted_and_quoted_off() {
    let unquoted = SEED_POLICY.replace("mode: observe", "mode: off");
    let quoted = SEED_POLICY.replace("mode: observe", "mode: \"off\"");
    for text in [unquoted, quoted] {
        let p = Policy::from_yaml_or_json(&text, "x.yaml").unwrap();
        assert_eq!(p.network_mode(), NetworkMode::Off);
    }
}

#[test]
fn invalid_policy_file_is_reported_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  alow_write: []\n",
    )
    .unwrap();
    let err = load(dir.path(), None).unwrap_err().to_string();
    assert!(err.contains("agentdiff.yaml"), "{err}");
    assert!(
        err.contains("unknown policy key: filesystem.alow_write"),
        "{err}"
    );
}

const PATTERN_POOL: &[&str] = &[
    "**",
    "src/**",
    "src/*.rs",
    "*.md",
    "**/*.pem",
    ".env",
    ".env.*",
    "docs/**",
    "a/?/b",
    "**/test/**",
    "src",
    "*",
    "**/x.rs",
    "docs/*/y.md",
];
const SEGMENTS: &[&str] = &[
    "src",
    "docs",
    "a",
    "b",
    "c",
    "x.rs",
    "y.md",
    "k.pem",
    ".env",
    ".env.local",
    "test",
];

fn yaml(sections: &[(&str, Vec<&str>)], default: &str) -> String {
    let mut text = String::from("version: 1\nfilesystem:\n");
    for (name, patterns) in sections {
        text.push_str(&format!("  {name}:\n"));
        if patterns.is_empty() {
            text.push_str("    []\n");
        }
        for p in patterns {
            text.push_str(&format!("    - \"{p}\"\n"));
        }
    }
    text.push_str(&format!("  default: {default}\n"));
    text
}

fn section_of(rule: &str) -> &str {
    rule.split('[').next().unwrap_or(rule)
}

fn patterns() -> impl Strategy<Value = Vec<&'static str>> {
    proptest::sample::subsequence(PATTERN_POOL, 0..=4)
}

fn path() -> impl Strategy<Value = String> {
    proptest::collection::vec(proptest::sample::select(SEGMENTS), 1..=4).prop_map(|s| s.join("/"))
}

proptest! {
    #[test]
    fn normalising_is_idempotent_and_safe(input in "[a-zA-Z./\\\\:\\x00 ~-]{0,24}") {
        if let Ok(norm) = normalize_path(&input) {
            prop_assert_eq!(normalize_path(&norm).unwrap(), norm.clone());
            prop_assert!(!norm.is_empty());
            prop_assert!(!norm.starts_with('/'));
            prop_assert!(!norm.contains('\0'));
            prop_assert!(!norm.contains('\\'));
            prop_assert!(norm.split('/').all(|s| !s.is_empty() && s != "." && s != ".."));
            let b = norm.as_bytes();
            prop_assert!(!(b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':'));
        }
    }

    #[test]
    fn normalising_arbitrary_text_never_panics(input in any::<String>()) {
        let _ = normalize_path(&input);
        let _ = Policy::builtin().decide_path(&input, Phase::PostRun);
    }

    #[test]
    fn action_does_not_depend_on_pattern_order(
        allow in patterns().prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
        review in patterns().prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
        deny in patterns().prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle())),
        order in Just(vec![0usize, 1, 2]).prop_shuffle(),
        default in proptest::sample::select(&["allow", "review", "deny"][..]),
        subject in path(),
    ) {
        let original = yaml(
            &[("allow_write", allow.0.clone()), ("review", review.0.clone()), ("deny", deny.0.clone())],
            default,
        );
        let shuffled_sections = [("allow_write", allow.1.clone()), ("review", review.1.clone()), ("deny", deny.1.clone())];
        let permuted: Vec<_> = order.iter().map(|&i| shuffled_sections[i].clone()).collect();
        let reordered = yaml(&permuted, default);
        let a = Policy::from_yaml_or_json(&original, "a.yaml").unwrap();
        let b = Policy::from_yaml_or_json(&reordered, "b.yaml").unwrap();
        let da = a.decide_path(&subject, Phase::PostRun).unwrap();
        let db = b.decide_path(&subject, Phase::PostRun).unwrap();
        prop_assert_eq!(da.action, db.action, "{}\n{}", original, reordered);
        prop_assert_eq!(section_of(&da.rule), section_of(&db.rule));
        // The fixed precedence, stated independently: the strictest section with a match wins.
        let matched = |set: &[&str]| set.iter().any(|p| {
            globset::GlobBuilder::new(p).literal_separator(true).build().unwrap()
                .compile_matcher().is_match(&subject)
                || p.strip_suffix("/**").is_some_and(|dir| globset::GlobBuilder::new(dir)
                    .literal_separator(true).build().unwrap().compile_matcher().is_match(&subject))
        });
        let expected = if matched(&deny.0) { Action::Deny }
            else if matched(&review.0) { Action::Review }
            else if matched(&allow.0) { Action::Allow }
            else { match default { "allow" => Action::Allow, "deny" => Action::Deny, _ => Action::Review } };
        prop_assert_eq!(da.action, expected);
    }

    #[test]
    fn loader_never_panics(text in any::<String>()) {
        let _ = Policy::from_yaml_or_json(&text, "fuzz.yaml");
        let _ = Policy::from_yaml_or_json(&text, "fuzz.json");
    }

    #[test]
    fn loader_never_panics_on_policy_shaped_text(
        lines in proptest::collection::vec("[a-z_ :\\-\\[\\]{}\"'*&!0-9.]{0,20}", 0..12)
    ) {
        let text = format!("version: 1\n{}", lines.join("\n"));
        let _ = Policy::from_yaml_or_json(&text, "fuzz.yaml");
    }
}
