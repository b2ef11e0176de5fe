//! Unit tests of loading, the schema and decisions.

use super::*;

fn parse(text: &str) -> Result<Policy, PolicyError> {
    Policy::from_yaml_or_json(text, "test.yaml")
}

fn problems(text: &str) -> Vec<String> {
    match parse(text) {
        Err(PolicyError::Invalid { problems, .. }) => problems,
        other => panic!("expected a schema error for {text:?}, got {other:?}"),
    }
}

fn error(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn minimal_document_gets_defaults() {
    let p = parse("version: 1\n").unwrap();
    assert_eq!(p.version(), 1);
    assert_eq!(p.network_mode(), NetworkMode::Observe);
    assert_eq!(*p.limits(), Limits::default());
    assert_eq!(*p.rollback(), RollbackSettings::default());
    assert_eq!(*p.weights(), Weights::default());
    let d = p.decide_path("anything", Phase::PostRun).unwrap();
    assert_eq!(d.action, Action::Review);
    assert_eq!(d.rule, "filesystem.default");
    let d = p.decide_command(OsStr::new("node"));
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Review, "process.default")
    );
}

#[test]
fn unknown_keys_carry_the_full_path() {
    assert!(problems("version: 1\nfilesystem:\n  alow_write: []\n")
        .contains(&"unknown policy key: filesystem.alow_write".to_owned()));
    assert!(problems("version: 1\nfilesytem: {}\n")
        .contains(&"unknown policy key: filesytem".to_owned()));
    assert!(problems("version: 1\nscoring:\n  weights:\n    blast: 3\n")
        .contains(&"unknown policy key: scoring.weights.blast".to_owned()));
    assert!(
        problems("version: 1\nnetwork:\n  mode: observe\n  block: true\n")
            .contains(&"unknown policy key: network.block".to_owned())
    );
}

#[test]
fn wrong_types_carry_the_full_path() {
    let p = problems("version: 1\nlimits:\n  files_changed: -1\n");
    assert!(
        p[0].starts_with("limits.files_changed must be a non-negative integer"),
        "{p:?}"
    );
    let p = problems("version: 1\nlimits:\n  files_changed: -1\n");
    assert!(p[0].contains("(got -1)"), "{p:?}");
    for big in ["18446744073709551616", "99999999999999999999999", "1e40"] {
        let p = problems(&format!("version: 1\nlimits:\n  files_changed: {big}\n"));
        assert!(
            p[0].starts_with("limits.files_changed is out of range")
                && p[0].contains("too large (the maximum is 18446744073709551615)"),
            "{big}: {p:?}"
        );
    }
    assert!(parse("version: 1\nlimits:\n  files_changed: 18446744073709551615\n").is_ok());
    let p = problems("version: 1\nlimits:\n  duration_seconds: 1.5\n");
    assert!(p[0].starts_with("limits.duration_seconds must be a non-negative integer"));
    let p = problems("version: 1\nlimits:\n  processes_spawned: \"8\"\n");
    assert!(p[0].contains("got a string"), "{p:?}");
    let p = problems("version: 1\nscoring:\n  weights:\n    sensitive_path: -3\n");
    assert!(p[0].starts_with("scoring.weights.sensitive_path must be a non-negative integer"));
    let p = problems("version: 1\nfilesystem:\n  deny: .env\n");
    assert!(
        p[0].starts_with("filesystem.deny must be a list of strings"),
        "{p:?}"
    );
    let p = problems("version: 1\nfilesystem:\n  deny: [1]\n");
    assert!(
        p[0].starts_with("filesystem.deny[0] must be a string"),
        "{p:?}"
    );
    let p = problems("version: 1\nfilesystem:\n  default: allow_write\n");
    assert!(p[0].starts_with("filesystem.default must be one of allow, review, deny"));
    let p = problems("version: 1\nrollback:\n  enabled: yes\n");
    assert!(
        p[0].starts_with("rollback.enabled must be true or false"),
        "{p:?}"
    );
    let p = problems("version: 1\nprocess: [node]\n");
    assert!(p[0].starts_with("process must be a mapping"), "{p:?}");
}

#[test]
fn all_problems_are_reported_together() {
    let p = problems("version: 1\nlimits:\n  files_changed: x\n  files_deleted: -2\nextra: 1\n");
    assert_eq!(p.len(), 3, "{p:?}");
}

#[test]
fn version_is_required_and_checked() {
    assert!(problems("filesystem: {}\n")[0].starts_with("missing required key: version"));
    assert!(problems("version: 3\n")[0].starts_with("unsupported policy version 3"));
    assert!(problems("version: \"1\"\n")[0].starts_with("version must be the integer 1 or 2"));
    assert!(problems("version: 1.0\n")[0].starts_with("version must be the integer 1 or 2"));
}

#[test]
fn network_mode_off_quoted_and_unquoted() {
    // serde_yaml reads YAML 1.2: an unquoted off is the string "off", as is a quoted one.
    for text in [
        "version: 1\nnetwork:\n  mode: off\n",
        "version: 1\nnetwork:\n  mode: \"off\"\n",
    ] {
        assert_eq!(
            parse(text).unwrap().network_mode(),
            NetworkMode::Off,
            "{text}"
        );
    }
    // A YAML 1.1 boolean written out explicitly is still rejected, with a hint.
    let p = problems("version: 1\nnetwork:\n  mode: false\n");
    assert!(
        p[0].contains("got a boolean") && p[0].contains("quotes"),
        "{p:?}"
    );
    let p = problems("version: 1\nnetwork:\n  mode: block\n");
    assert!(p[0].starts_with("network.mode must be"), "{p:?}");
}

#[test]
fn rollback_alias() {
    let p = parse("version: 1\nrollback:\n  backup_max_file_mb: 3\n").unwrap();
    assert_eq!(p.rollback().max_backup_file_mb, 3);
    let p = parse("version: 1\nrollback:\n  max_backup_file_mb: 4\n  enabled: false\n").unwrap();
    assert_eq!(
        *p.rollback(),
        RollbackSettings {
            enabled: false,
            max_backup_file_mb: 4
        }
    );
    let p = problems("version: 1\nrollback:\n  max_backup_file_mb: 4\n  backup_max_file_mb: 4\n");
    assert!(
        p[0].contains("give only rollback.max_backup_file_mb"),
        "{p:?}"
    );
}

#[test]
fn weights_override_individually() {
    let p = parse("version: 1\nscoring:\n  weights:\n    sensitive_path: 40\n    scope_drift: 0\n")
        .unwrap();
    let w = p.weights();
    assert_eq!(w.sensitive_path, 40);
    assert_eq!(w.scope_drift, 0);
    assert_eq!(w.denied_deletion, 40);
    assert_eq!(w.get("review_created"), Some(8));
    assert_eq!(w.get("nope"), None);
    let all = WEIGHT_NAMES
        .iter()
        .map(|n| format!("    {n}: 1\n"))
        .collect::<String>();
    let p = parse(&format!("version: 1\nscoring:\n  weights:\n{all}")).unwrap();
    assert!(WEIGHT_NAMES.iter().all(|n| p.weights().get(n) == Some(1)));
}

#[test]
fn structural_errors() {
    assert!(matches!(parse(""), Err(PolicyError::Empty { .. })));
    assert!(matches!(parse("  \n\t\n"), Err(PolicyError::Empty { .. })));
    assert!(matches!(
        parse("# only a comment\n"),
        Err(PolicyError::Empty { .. })
    ));
    assert!(matches!(parse("~\n"), Err(PolicyError::Empty { .. })));
    assert!(error("- version: 1\n").contains("the document root must be a mapping (got a list)"));
    assert!(error("just a string\n").contains("root must be a mapping (got a string)"));
    let e = error("version: 1\nversion: 1\n");
    assert!(e.contains("duplicate key: version"), "{e}");
    let e = error("version: 1\nfilesystem:\n  deny: []\n  deny: [x]\n");
    assert!(e.contains("duplicate key: filesystem.deny"), "{e}");
    let e = error("{\"version\": 1, \"version\": 1}");
    assert!(e.contains("duplicate key: version"), "{e}");
    let e = error("version: 1\n---\nversion: 1\n");
    assert!(e.contains("more than one document"), "{e}");
    let e = error("version: 1\nfilesystem: !custom {}\n");
    assert!(e.contains("tags"), "{e}");
    let e = error("version: 1\n1: x\n");
    assert!(e.contains("keys must be strings"), "{e}");
    let e = error("version: [1\n");
    assert!(e.contains("cannot be read"), "{e}");
}

#[test]
fn over_large_input_is_rejected() {
    let big = format!("version: 1\n#{}\n", "x".repeat(MAX_POLICY_BYTES));
    assert!(matches!(parse(&big), Err(PolicyError::TooLarge { .. })));
}

#[test]
fn alias_expansion_is_bounded() {
    // Nine levels of ten-fold aliases would expand to a billion values.
    let mut doc = String::from("version: 1\nx0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
    for i in 1..9 {
        let prev = format!("*a{}", i - 1);
        let items = [prev.as_str(); 10].join(",");
        doc.push_str(&format!("x{i}: &a{i} [{items}]\n"));
    }
    let e = error(&doc);
    assert!(e.contains("alias") || e.contains("repetition limit"), "{e}");
    // A small alias is fine (and then the key itself is unknown).
    let p = problems("version: 1\nlist: &l [a]\nfilesystem:\n  deny: *l\n");
    assert_eq!(p, vec!["unknown policy key: list".to_owned()]);
}

#[test]
fn deep_nesting_is_rejected() {
    let deep = format!("version: 1\nx: {}{}\n", "[".repeat(40), "]".repeat(40));
    assert!(error(&deep).contains("nests deeper"));
}

/// 200 KB of nesting in every shape YAML has is refused by the pre-scan, before a parser's
/// per-token work grows with the depth (nested flow sequences took a minute to reject this way).
#[test]
fn large_nested_documents_are_refused_before_parsing() {
    let n = 200 * 1024;
    let block_indent = {
        let mut s = String::from("version: 1\n");
        for i in 0..600 {
            s.push_str(&format!("{}a{i}:\n", " ".repeat(i)));
        }
        s
    };
    let shapes = [
        (
            "flow sequences",
            format!("version: 1\nx: {}", "[".repeat(n)),
            2,
        ),
        (
            "closed flow sequences",
            format!("version: 1\nx: {}{}", "[".repeat(n / 2), "]".repeat(n / 2)),
            2,
        ),
        (
            "flow mappings",
            format!("version: 1\nx: {}", "{a: ".repeat(n / 4)),
            2,
        ),
        ("JSON", "[".repeat(n), 1),
        (
            "compact block sequences",
            format!("version: 1\nx:\n{}", "- ".repeat(n / 2)),
            3,
        ),
        ("block mappings", block_indent, 19),
        (
            "anchored flow sequences",
            format!("version: 1\nx: &a {}", "[&b ".repeat(n / 4)),
            2,
        ),
    ];
    for (shape, doc, line) in shapes {
        let e = error(&doc);
        assert!(
            e.contains(&format!("line {line} nests deeper than 16 levels")),
            "{shape}: {e}"
        );
    }
}

/// A mapping with eighty thousand distinct keys is read in linear time (duplicates were looked
/// up by a linear search per key) and duplicates are still found.
#[test]
fn many_keys_are_checked_for_duplicates() {
    let mut doc = String::from("version: 1\nx: {");
    for i in 0..80_000 {
        doc.push_str(&format!("k{i}: 1, "));
    }
    doc.push_str("k7: 2}");
    let e = error(&doc);
    assert!(e.contains("duplicate key: x.k7"), "{e}");
}

#[test]
fn json_documents() {
    let p = Policy::from_yaml_or_json(
        r#"{"version": 1, "filesystem": {"deny": [".env"], "default": "allow"}}"#,
        "p.json",
    )
    .unwrap();
    assert_eq!(
        p.decide_path(".env", Phase::PostRun).unwrap().action,
        Action::Deny
    );
    assert_eq!(
        p.decide_path("a", Phase::PostRun).unwrap().action,
        Action::Allow
    );
    // A YAML flow mapping also starts with `{` and is read as YAML.
    let p = parse("{version: 1, network: {mode: off}}").unwrap();
    assert_eq!(p.network_mode(), NetworkMode::Off);
    // A `.json` origin is JSON only.
    assert!(Policy::from_yaml_or_json("version: 1\n", "p.json").is_err());
    // Trailing garbage after JSON is rejected.
    assert!(Policy::from_yaml_or_json("{\"version\": 1} x", "p.json").is_err());
}

#[test]
fn patterns_are_validated() {
    let p = problems("version: 1\nfilesystem:\n  deny: [/etc/passwd, ../x, \"a//b\", src/]\n");
    assert_eq!(p.len(), 4, "{p:?}");
    assert!(p[0].starts_with("filesystem.deny[0]"), "{p:?}");
    assert!(p[3].contains("dir/**"), "{p:?}");
    let p = problems("version: 1\nfilesystem:\n  review: [\"a[\"]\n");
    assert!(
        p[0].starts_with("filesystem.review[0]: invalid glob"),
        "{p:?}"
    );
    let p = problems("version: 1\nprocess:\n  deny: [/usr/bin/curl]\n");
    assert!(
        p[0].starts_with("process.deny[0]") && p[0].contains("basename"),
        "{p:?}"
    );
    // Backslashes in filesystem patterns are separators.
    let p = parse("version: 1\nfilesystem:\n  deny: ['secrets\\**']\n").unwrap();
    assert_eq!(p.deny_patterns(), vec!["secrets/**".to_owned()]);
    assert_eq!(
        p.decide_path("secrets/a", Phase::PostRun).unwrap().action,
        Action::Deny
    );
}

#[test]
fn precedence_is_fixed() {
    let text = "version: 1\nfilesystem:\n  allow_write: [\"**\"]\n  review: [docs/**, src/gen/**]\n  deny: [\"**/*.pem\"]\n  default: deny\n";
    let p = parse(text).unwrap();
    let d = p.decide_path("docs/a.pem", Phase::PostRun).unwrap();
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Deny, "filesystem.deny[0]")
    );
    assert_eq!(d.pattern.as_deref(), Some("**/*.pem"));
    let d = p.decide_path("src/gen/x.rs", Phase::PostRun).unwrap();
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Review, "filesystem.review[1]")
    );
    let d = p.decide_path("src/x.rs", Phase::PostRun).unwrap();
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Allow, "filesystem.allow_write[0]")
    );
    assert_eq!(d.policy_version, 1);
    assert_eq!(d.phase, Phase::PostRun);
}

#[test]
fn decide_path_normalises_and_rejects() {
    let p = Policy::builtin();
    let d = p.decide_path(".git\\config", Phase::PreToolUse).unwrap();
    assert_eq!(d.subject, ".git/config");
    assert_eq!(d.action, Action::Deny);
    assert!(p.decide_path("../.env", Phase::PostRun).is_err());
    assert!(p.decide_path("/abs", Phase::PostRun).is_err());
}

#[test]
fn builtin_policy() {
    let p = Policy::builtin();
    assert_eq!(p.version(), 1);
    for denied in [
        ".env",
        ".env.local",
        ".git/config",
        ".git",
        ".ssh/id_rsa",
        "a/b/c.key",
        "x.pem",
        "sub/.git/config",
        "a/b/.git/hooks/post-checkout",
    ] {
        let d = p.decide_path(denied, Phase::PostRun).unwrap();
        assert_eq!(d.action, Action::Deny, "{denied}");
    }
    for reviewed in [
        "src/main.rs",
        "sub/.env",
        ".envrc",
        ".github/workflows/ci.yml",
    ] {
        let d = p.decide_path(reviewed, Phase::PostRun).unwrap();
        assert_eq!(
            (d.action, d.rule.as_str()),
            (Action::Review, "filesystem.default"),
            "{reviewed}"
        );
    }
    let d = p.decide_command(OsStr::new("/usr/bin/curl"));
    assert_eq!((d.action, d.subject.as_str()), (Action::Allow, "curl"));
    assert_eq!(p.deny_patterns(), BUILTIN_DENY.map(str::to_owned).to_vec());
}

#[test]
fn nested_policy_files_and_stores_are_protected_configuration() {
    // A run started below a nested `agentdiff.yaml` or `.agentdiff/` takes that directory as its
    // root: planting one would choose the policy of later runs. Even a policy allowing all.
    let p = parse("version: 1\nfilesystem:\n  allow_write: [\"**\"]\n  default: allow\n").unwrap();
    for path in [
        "agentdiff.yaml",
        "sub/agentdiff.yaml",
        "a/b/agentdiff.yml",
        "sub/agentdiff.json",
        "sub/.agentdiff/runs/x/result.json",
        "sub/.agentdiff",
        "d/.agentdiffignore",
        ".claude/settings.json",
    ] {
        let d = p.decide_path(path, Phase::PostRun).unwrap();
        assert_eq!(
            (d.action, d.rule.as_str()),
            (Action::Deny, "builtin.protected_config"),
            "{path}"
        );
    }
    for path in [
        "sub/agentdiff.yaml.bak",
        "sub/my-agentdiff.yaml",
        "agentdiff/x",
        ".claude/commands/x.md",
        ".claude/settings.local.json",
        "sub/.claude/settings.json",
    ] {
        let d = p.decide_path(path, Phase::PostRun).unwrap();
        assert_eq!(d.action, Action::Allow, "{path}");
    }
}

#[test]
fn command_decisions_use_the_basename() {
    let p = parse("version: 1\nprocess:\n  allow: [\"python*\"]\n  review: [node]\n  deny: [curl]\n  default: review\n").unwrap();
    let d = p.decide_command(OsStr::new("/usr/local/bin/python3.12"));
    assert_eq!(
        (d.action, d.rule.as_str(), d.phase),
        (Action::Allow, "process.allow[0]", Phase::Command)
    );
    assert_eq!(p.decide_command(OsStr::new("curl")).action, Action::Deny);
    assert_eq!(
        p.decide_command(OsStr::new("./node")).action,
        Action::Review
    );
    // A shell string is one odd basename, not parsed into commands.
    let d = p.decide_command(OsStr::new("sh -c curl"));
    assert_eq!(d.rule, "process.default");
    let d = p.decide_command(OsStr::new(""));
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Deny, "process.invalid")
    );
}

#[test]
fn version_2_sections() {
    let text = "version: 2\nenvironment:\n  mode: scrub\n  pass: [PATH_EXTRA, LANG]\nruntime:\n  backend: container\n  options:\n    image: alpine:3\n    memory: 512\n    env: [A, B]\nobserve:\n  include: [node_modules/**]\n";
    let p = parse(text).unwrap();
    assert_eq!(p.version(), 2);
    assert_eq!(p.environment().mode, EnvMode::Scrub);
    assert_eq!(p.environment().pass, vec!["PATH_EXTRA", "LANG"]);
    assert_eq!(p.runtime().backend.as_deref(), Some("container"));
    assert_eq!(p.runtime().options["image"], vec!["alpine:3"]);
    assert_eq!(p.runtime().options["memory"], vec!["512"]);
    assert_eq!(p.runtime().options["env"], vec!["A", "B"]);
    assert_eq!(p.observe().include, vec!["node_modules/**"]);
    // The version-1 sections keep their meaning under version 2.
    assert_eq!(
        p.decide_path("x", Phase::PostRun).unwrap().rule,
        "filesystem.default"
    );
}

#[test]
fn version_2_sections_need_version_2() {
    for section in ["environment: {}", "runtime: {}", "observe: {}"] {
        let p = problems(&format!("version: 1\n{section}\n"));
        assert!(p[0].contains("requires `version: 2`"), "{p:?}");
    }
    let p = problems("version: 2\nenvironment:\n  mode: scrub\n  pass: [\"A=B\"]\n");
    assert!(p[0].starts_with("environment.pass[0]"), "{p:?}");
    let p = problems("version: 2\nruntime:\n  options:\n    privileged: true\n");
    assert!(
        p[0].starts_with("runtime.options.privileged must be a string"),
        "{p:?}"
    );
    let p = problems("version: 2\nruntime:\n  backend: \"a b\"\n");
    assert!(p[0].starts_with("runtime.backend"), "{p:?}");
}

#[test]
fn effective_json_round_trips() {
    for text in [
        "version: 1\n",
        "version: 1\nfilesystem:\n  allow_write: [src/**]\n  deny: [.env]\nlimits:\n  files_changed: 3\nscoring:\n  weights:\n    opened_port: 9\n",
        "version: 2\nenvironment:\n  mode: scrub\nruntime:\n  backend: local\n  options:\n    memory: 1\n",
    ] {
        let p = parse(text).unwrap();
        let json = p.to_json();
        let again = Policy::from_yaml_or_json(&json.to_string(), "effective.json").unwrap();
        assert_eq!(again.to_json(), json, "{text}");
        assert_eq!(again.effective_sha256(), p.effective_sha256());
    }
    let json = Policy::builtin().to_json();
    assert_eq!(json["process"]["default"], "allow");
    assert_eq!(json["scoring"]["weights"]["denied_deletion"], 40);
    assert_eq!(json["rollback"]["max_backup_file_mb"], 10);
    assert!(json.get("environment").is_none());
}

#[test]
fn starter_is_a_valid_policy() {
    let p = Policy::from_yaml_or_json(STARTER, "starter").unwrap();
    assert_eq!(
        p.decide_path(".env", Phase::PostRun).unwrap().action,
        Action::Deny
    );
    assert_eq!(
        p.decide_path("src/lib.rs", Phase::PostRun).unwrap().action,
        Action::Allow
    );
    assert_eq!(
        p.decide_path("docs/x.md", Phase::PostRun).unwrap().action,
        Action::Review
    );
}

#[test]
fn policy_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<Policy>();
    check::<LoadedPolicy>();
}

#[test]
fn load_discovers_the_project_file() {
    let dir = tempfile::tempdir().unwrap();
    let loaded = load(dir.path(), None).unwrap();
    assert_eq!(loaded.source, PolicySource::BuiltIn);
    std::fs::write(dir.path().join("agentdiff.yml"), "version: 1\n").unwrap();
    assert!(matches!(
        load(dir.path(), None),
        Err(PolicyError::Misnamed { .. })
    ));
    std::fs::write(dir.path().join(POLICY_FILE_NAME), "version: 1\n").unwrap();
    let loaded = load(dir.path(), None).unwrap();
    match &loaded.source {
        PolicySource::File { path, sha256 } => {
            assert_eq!(path, &dir.path().join(POLICY_FILE_NAME));
            assert_eq!(sha256.len(), 64);
        }
        other => panic!("{other:?}"),
    }
    let explicit = dir.path().join("other.json");
    std::fs::write(&explicit, "{\"version\": 2}").unwrap();
    assert_eq!(
        load(dir.path(), Some(&explicit)).unwrap().policy.version(),
        2
    );
    assert!(matches!(
        load(&dir.path().join("no-such-root"), None),
        Err(PolicyError::Root { .. })
    ));
    assert!(matches!(
        load(&dir.path().join(POLICY_FILE_NAME), None),
        Err(PolicyError::Root { .. })
    ));
    let missing = dir.path().join("missing.yaml");
    assert!(matches!(
        load(dir.path(), Some(&missing)),
        Err(PolicyError::Io { .. })
    ));
}

#[cfg(unix)]
#[test]
fn load_refuses_a_fifo() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(POLICY_FILE_NAME);
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    assert!(matches!(
        load(dir.path(), None),
        Err(PolicyError::NotAFile { .. })
    ));
}

#[test]
fn runtime_bwrap_section_is_checked_and_kept_apart_from_generic_options() {
    let p = parse(
        "version: 2\nruntime:\n  bwrap:\n    hide: [~/.secrets, /opt/keys]\n    writable: [~/.cache/cargo]\n    network: host\n",
    )
    .unwrap();
    let section = p.runtime().section_options("bwrap");
    assert_eq!(section["hide"], vec!["~/.secrets", "/opt/keys"]);
    assert_eq!(section["writable"], vec!["~/.cache/cargo"]);
    assert_eq!(section["network"], vec!["host"]);
    assert!(p.runtime().options.is_empty());
    // Another backend never sees the section's keys.
    assert!(p.runtime().section_options("local").is_empty());
    // The effective policy (stored in the capsule) parses back to the same section.
    let again = Policy::from_yaml_or_json(&p.to_json().to_string(), "effective.json").unwrap();
    assert_eq!(again.runtime().section_options("bwrap"), section);
    let p = problems("version: 2\nruntime:\n  bwrap:\n    network: bridge\n");
    assert!(p[0].starts_with("runtime.bwrap.network"), "{p:?}");
    let p = problems("version: 2\nruntime:\n  bwrap:\n    hide: [relative/path]\n");
    assert!(p[0].starts_with("runtime.bwrap.hide[0]"), "{p:?}");
    let p = problems("version: 2\nruntime:\n  bwrap:\n    mounts: [/x]\n");
    assert!(p[0].contains("mounts"), "{p:?}");
}

/// `runtime.bwrap.home` becomes the `home`, `home-read` and `home-write` options; a mode other
/// than the two, a path not below the home and an unknown key are refused.
#[test]
fn runtime_bwrap_home_is_checked_and_handed_to_bwrap() {
    let p = parse(
        "version: 2\nruntime:\n  bwrap:\n    home:\n      mode: denylist\n      read: [~/.config/tool]\n      write: [~/.cache/tool]\n",
    )
    .unwrap();
    let section = p.runtime().section_options("bwrap");
    assert_eq!(section["home"], vec!["denylist"]);
    assert_eq!(section["home-read"], vec!["~/.config/tool"]);
    assert_eq!(section["home-write"], vec!["~/.cache/tool"]);
    let again = Policy::from_yaml_or_json(&p.to_json().to_string(), "effective.json").unwrap();
    assert_eq!(again.runtime().section_options("bwrap"), section);
    for (yaml, key) in [
        ("mode: open", "runtime.bwrap.home.mode"),
        ("read: [/etc]", "runtime.bwrap.home.read[0]"),
        ("read: [\"~/../etc\"]", "runtime.bwrap.home.read[0]"),
        ("write: [\"~/\"]", "runtime.bwrap.home.write[0]"),
        ("sockets: maybe", "runtime.bwrap.home.sockets"),
        ("hide: [x]", "hide"),
    ] {
        let p = problems(&format!(
            "version: 2\nruntime:\n  bwrap:\n    home:\n      {yaml}\n"
        ));
        assert!(p.iter().any(|m| m.contains(key)), "{yaml}: {p:?}");
    }
}

#[test]
fn a_backslash_in_a_name_cannot_move_a_file_out_of_a_deny_pattern() {
    // On POSIX `a\b.pem` is one name in `secrets/`; reading `\` only as a separator would make it
    // `secrets/a/b.pem` and slip past `secrets/*.pem`.
    let text = "version: 1\nfilesystem:\n  deny: [\"secrets/*.pem\", \"*.key\"]\n  review: [\"docs/**\"]\n  default: allow\n";
    let p = parse(text).unwrap();
    for path in ["secrets/a\\b.pem", "id\\rsa.key"] {
        let d = p.decide_path(path, Phase::PostRun).unwrap();
        assert_eq!(d.action, Action::Deny, "{path}: {d:?}");
    }
    // A name whose separator reading leaves the tree is an error, which the run classifies as
    // denied (`path_validation`), never as allowed.
    for path in ["secrets/x\\..\\y.pem", "secrets/\\.pem", "a\\"] {
        assert!(p.decide_path(path, Phase::PostRun).is_err(), "{path}");
    }
    // The separator reading still counts where it is the stricter one.
    let d = p.decide_path("docs\\guide.md", Phase::PostRun).unwrap();
    assert_eq!(d.action, Action::Review, "{d:?}");
    let d = p.decide_path("secrets\\a.pem", Phase::PostRun).unwrap();
    assert_eq!(d.action, Action::Deny, "{d:?}");
    // Without a backslash nothing changes.
    let d = p.decide_path("src/a.rs", Phase::PostRun).unwrap();
    assert_eq!(d.action, Action::Allow, "{d:?}");
}

#[test]
fn network_egress_is_version_2_and_round_trips() {
    let v1 = problems("version: 1\nnetwork:\n  egress:\n    allow: [a.test]\n");
    assert!(
        v1.iter()
            .any(|p| p.contains("`network.egress` requires `version: 2`")),
        "{v1:?}"
    );
    let bad = problems(
        "version: 2\nnetwork:\n  egress:\n    allow: [\"a*.test\", ok.test]\n    deny: [\"x:0\"]\n    presets: [npm, nope]\n    extra: 1\n",
    );
    for needle in [
        "network.egress.allow[0]",
        "network.egress.deny[0]",
        "network.egress.presets[1]: \"nope\" is not a preset",
        "unknown policy key: network.egress.extra",
    ] {
        assert!(bad.iter().any(|p| p.contains(needle)), "{needle}: {bad:?}");
    }
    let p = parse(
        "version: 2\nnetwork:\n  egress:\n    allow: [\"*.Example.com\", \"10.0.0.0/8:443\"]\n    deny: [bad.example.com]\n    presets: [pypi]\n",
    )
    .unwrap();
    assert_eq!(
        p.decide_host("files.pythonhosted.org", 443).rule,
        "network.egress.presets[0]"
    );
    assert_eq!(p.decide_host("bad.example.com", 443).action, Action::Deny);
    let doc = p.to_json();
    assert_eq!(
        doc["network"]["egress"],
        json!({"allow": ["*.example.com", "10.0.0.0/8:443"], "deny": ["bad.example.com"], "presets": ["pypi"], "on_denied": "review"})
    );
    let again = parse(&doc.to_string()).unwrap();
    assert_eq!(again.to_json(), doc);
    // Without the section the effective document has no `egress` (digests unchanged).
    assert!(parse("version: 2\n").unwrap().to_json()["network"]
        .get("egress")
        .is_none());
}

#[test]
fn on_denied_is_review_by_default_deny_when_written_and_nothing_else() {
    let base = "version: 2\nnetwork:\n  egress:\n    allow: [a.test]\n";
    let p = parse(base).unwrap();
    assert_eq!(p.egress().on_denied(), crate::OnDenied::Review);
    let p = parse(&format!("{base}    on_denied: deny\n")).unwrap();
    assert_eq!(p.egress().on_denied(), crate::OnDenied::Deny);
    assert_eq!(p.egress().on_denied().action(), Action::Deny);
    // Recorded in the effective document, which reads back the same.
    let doc = p.to_json();
    assert_eq!(doc["network"]["egress"]["on_denied"], "deny");
    assert_eq!(parse(&doc.to_string()).unwrap().to_json(), doc);
    // A refusal is never silent: `allow` is refused like any other value, with the choices.
    for bad in ["allow", "Deny", "[deny]", "1"] {
        let found = problems(&format!("{base}    on_denied: {bad}\n"));
        assert!(
            found
                .iter()
                .any(|p| p.starts_with("network.egress.on_denied: ")
                    && p.contains("is not one of review, deny")),
            "{bad}: {found:?}"
        );
    }
}

#[test]
fn allowed_hosts_join_the_effective_policy() {
    let p = Policy::builtin()
        .with_allowed_hosts(&["api.anthropic.com:443".into()])
        .unwrap();
    assert_eq!(p.version(), 2);
    let d = p.decide_host("api.anthropic.com", 443);
    assert_eq!(
        (d.action, d.rule.as_str()),
        (Action::Allow, "--allow-host[0]")
    );
    let doc = p.to_json();
    assert_eq!(doc["version"], 2);
    assert_eq!(
        doc["network"]["egress"]["allow"],
        json!(["api.anthropic.com:443"])
    );
    // The recorded document loads to the same decisions.
    let again = parse(&doc.to_string()).unwrap();
    assert_eq!(
        again.decide_host("api.anthropic.com", 443).action,
        Action::Allow
    );
    assert_eq!(
        again.decide_host("api.anthropic.com", 80).action,
        Action::Deny
    );
    let err = Policy::builtin()
        .with_allowed_hosts(&["*.".into()])
        .unwrap_err();
    assert!(err.to_string().contains("--allow-host"), "{err}");
    // No hosts: the policy is unchanged (still version 1).
    assert_eq!(
        Policy::builtin().with_allowed_hosts(&[]).unwrap().version(),
        1
    );
}
