//! `agentdiff policy …` run as a user would (the hook's tests are in `hook_cli`).

use serde_json::Value;

use super::{agentdiff, text};

pub(super) const SEED_POLICY: &str =
    include_str!("../../../engine/policy/tests/fixtures/seed-policy.yaml");
const USAGE: i32 = 64;
const INVALID_CONFIG: i32 = 65;

pub(super) fn project_with_seed_policy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agentdiff.yaml"), SEED_POLICY).unwrap();
    std::fs::create_dir_all(dir.path().join("src")).unwrap();
    dir
}

#[test]
fn init_writes_a_valid_starter_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(dir.path(), &["policy", "init"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let file = dir.path().join("agentdiff.yaml");
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.starts_with("# agentdiff mutation policy"));
    assert!(written.contains("version: 1"));

    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("OK: "),
        "{}",
        text(&out.stdout)
    );

    std::fs::write(&file, "version: 1\n# edited\n").unwrap();
    let out = agentdiff(dir.path(), &["policy", "init"]);
    assert_eq!(out.status.code(), Some(USAGE));
    assert!(
        text(&out.stderr).contains("--force"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "version: 1\n# edited\n"
    );

    let out = agentdiff(dir.path(), &["policy", "init", "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), written);

    let out = agentdiff(dir.path(), &["policy", "init", "--output", "custom.yaml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("custom.yaml")).unwrap(),
        written
    );

    let out = agentdiff(dir.path(), &["policy", "init", "--output", "-"]);
    assert_eq!(text(&out.stdout), written);
}

#[test]
fn validate_reports_source_and_digest() {
    let dir = tempfile::tempdir().unwrap();
    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = text(&out.stdout);
    assert!(line.starts_with("OK: built-in policy"), "{line}");
    assert!(line.contains("sha256 "), "{line}");

    std::fs::write(dir.path().join("seed.yaml"), SEED_POLICY).unwrap();
    let out = agentdiff(
        dir.path(),
        &[
            "policy",
            "validate",
            "--policy",
            "seed.yaml",
            "--format",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["source"]["kind"], "file");
    assert_eq!(report["version"], 1);
    assert_eq!(report["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(
        report["effective"]["scoring"]["weights"]["sensitive_path"],
        40
    );
    assert_eq!(
        report["effective"]["scoring"]["weights"]["review_created"],
        8
    );
}

#[test]
fn validate_rejects_invalid_policies_with_key_paths() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  alow_write: []\nlimits:\n  files_changed: -1\n",
    )
    .unwrap();
    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    let err = text(&out.stderr);
    assert!(
        err.contains("unknown policy key: filesystem.alow_write"),
        "{err}"
    );
    assert!(
        err.contains("limits.files_changed must be a non-negative integer"),
        "{err}"
    );
    assert!(text(&out.stdout).is_empty());

    let out = agentdiff(
        dir.path(),
        &["policy", "validate", "--policy", "missing.yaml"],
    );
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(text(&out.stderr).contains("missing.yaml"));

    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("agentdiff.yml"), "version: 1\n").unwrap();
    let out = agentdiff(other.path(), &["policy", "validate"]);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(
        text(&out.stderr).contains("agentdiff.yaml"),
        "{}",
        text(&out.stderr)
    );

    std::fs::write(other.path().join("agentdiff.yaml"), "").unwrap();
    let out = agentdiff(other.path(), &["policy", "validate"]);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(text(&out.stderr).contains("empty"), "{}", text(&out.stderr));
}

#[test]
fn explain_path_summary_and_json() {
    let dir = project_with_seed_policy();
    let out = agentdiff(dir.path(), &["policy", "explain", ".env"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for line in [
        "action:  deny",
        "subject: .env",
        "rule:    filesystem.deny[0]",
        "pattern: .env",
        "reason:  ",
    ] {
        assert!(shown.contains(line), "missing {line:?} in\n{shown}");
    }

    let out = agentdiff(
        dir.path(),
        &["policy", "explain", "src/auth.py", "--format", "json"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let d: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(d["action"], "allow");
    assert_eq!(d["subject"], "src/auth.py");
    assert_eq!(d["rule"], "filesystem.allow_write[0]");
    assert_eq!(d["pattern"], "src/**");
    assert_eq!(d["policy_version"], 1);

    let out = agentdiff(dir.path(), &["policy", "explain", "README.md"]);
    assert!(
        text(&out.stdout).contains("pattern: -"),
        "{}",
        text(&out.stdout)
    );
    assert!(text(&out.stdout).contains("rule:    filesystem.default"));
}

#[test]
fn explain_command() {
    let dir = project_with_seed_policy();
    let out = agentdiff(
        dir.path(),
        &[
            "policy",
            "explain",
            "--command",
            "/usr/bin/curl",
            "--format",
            "json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let d: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(d["action"], "deny");
    assert_eq!(d["subject"], "curl");
    assert_eq!(d["rule"], "process.deny[0]");
    assert_eq!(d["phase"], "command");

    let out = agentdiff(dir.path(), &["policy", "explain", "--command", "python3"]);
    assert!(
        text(&out.stdout).contains("rule:    process.allow[0]"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn explain_usage_errors() {
    let dir = project_with_seed_policy();
    for args in [
        &["policy", "explain", "../etc/passwd"][..],
        &["policy", "explain", "/etc/passwd"][..],
        &["policy", "explain"][..],
        &["policy", "explain", ".env", "--command", "curl"][..],
        &["policy", "explain", ".env", "--format", "xml"][..],
    ] {
        let out = agentdiff(dir.path(), args);
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).is_empty(), "{args:?}");
    }
}

const EGRESS_POLICY: &str = "version: 2\nnetwork:\n  egress:\n    allow: [\"*.npmjs.org\", \"127.0.0.1:8080\"]\n    deny: [evil.npmjs.org]\n    presets: [pypi]\n";

#[test]
fn explain_host_gives_rule_and_pattern() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("agentdiff.yaml"), EGRESS_POLICY).unwrap();
    let explain = |host: &str| -> Value {
        let out = agentdiff(
            dir.path(),
            &["policy", "explain", "--host", host, "--format", "json"],
        );
        assert!(out.status.success(), "{host}: {}", text(&out.stderr));
        serde_json::from_str(&text(&out.stdout)).unwrap()
    };
    let d = explain("registry.npmjs.org");
    assert_eq!(
        (&d["action"], &d["rule"], &d["pattern"], &d["port"]),
        (
            &Value::from("allow"),
            &Value::from("network.egress.allow[0]"),
            &Value::from("*.npmjs.org"),
            &Value::from(443)
        )
    );
    assert_eq!(explain("npmjs.org")["action"], "allow");
    assert_eq!(explain("evil.npmjs.org")["rule"], "network.egress.deny[0]");
    assert_eq!(explain("pypi.org")["rule"], "network.egress.presets[0]");
    assert_eq!(explain("pypi.org:80")["rule"], "network.egress.default");
    assert_eq!(explain("127.0.0.1:8080")["action"], "allow");
    assert_eq!(explain("127.0.0.1:8081")["action"], "deny");
    assert_eq!(explain("localhost:8080")["action"], "deny");
    // An inet_aton spelling is decided as its address.
    let d = explain("0x7f.1:8080");
    assert_eq!(
        (&d["action"], &d["host"]),
        (&Value::from("allow"), &Value::from("127.0.0.1"))
    );
    assert_eq!(explain("0x7f000001:8081")["action"], "deny");

    let out = agentdiff(
        dir.path(),
        &["policy", "explain", "--host", "evil.npmjs.org"],
    );
    let shown = text(&out.stdout);
    assert!(shown.contains("action:  deny"), "{shown}");
    assert!(shown.contains("subject: evil.npmjs.org:443"), "{shown}");
    assert!(shown.contains("rule:    network.egress.deny[0]"), "{shown}");
    let out = agentdiff(
        dir.path(),
        &["policy", "explain", "--host", "registry.npmjs.org"],
    );
    let shown = text(&out.stdout);
    assert!(
        shown.contains("address: checked when a run resolves"),
        "{shown}"
    );

    // `localhost` is loopback: refused as a run would refuse it, unless the address is listed.
    let local = tempfile::tempdir().unwrap();
    std::fs::write(
        local.path().join("agentdiff.yaml"),
        "version: 2\nnetwork:\n  egress:\n    allow: [\"localhost:8080\"]\n",
    )
    .unwrap();
    let out = agentdiff(
        local.path(),
        &[
            "policy",
            "explain",
            "--host",
            "localhost:8080",
            "--format",
            "json",
        ],
    );
    let d: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(
        (&d["action"], &d["rule"]),
        (
            &Value::from("deny"),
            &Value::from("network.egress.internal_address")
        )
    );

    // No egress section: nothing is allowed.
    let empty = tempfile::tempdir().unwrap();
    let out = agentdiff(
        empty.path(),
        &["policy", "explain", "--host", "example.com"],
    );
    assert!(text(&out.stdout).contains("network.egress.default"));

    for args in [
        &["policy", "explain", "--host", "a.0x1"][..],
        &["policy", "explain", "--host", "a.test:0"][..],
        &["policy", "explain", "--host", "[::1"][..],
        &["policy", "explain", "--host", "a.test", ".env"][..],
        &["policy", "explain", "--host", "a.test", "--command", "curl"][..],
    ] {
        let out = agentdiff(dir.path(), args);
        assert_eq!(
            out.status.code(),
            Some(USAGE),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).is_empty(), "{args:?}");
    }
}

#[test]
fn egress_needs_version_2_and_checks_every_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agentdiff.yaml");
    std::fs::write(
        &file,
        "version: 1\nnetwork:\n  egress:\n    allow: [a.test]\n",
    )
    .unwrap();
    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    assert!(
        text(&out.stderr).contains("`network.egress` requires `version: 2`"),
        "{}",
        text(&out.stderr)
    );
    std::fs::write(
        &file,
        "version: 2\nnetwork:\n  egress:\n    allow: [\"a*.test\"]\n    presets: [nope]\n",
    )
    .unwrap();
    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert_eq!(out.status.code(), Some(INVALID_CONFIG));
    let err = text(&out.stderr);
    assert!(err.contains("network.egress.allow[0]"), "{err}");
    assert!(err.contains("network.egress.presets[0]"), "{err}");
}

#[test]
fn explain_host_says_what_a_refusal_becomes_and_a_bad_on_denied_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let write = |extra: &str| {
        std::fs::write(
            dir.path().join("agentdiff.yaml"),
            format!("version: 2\nnetwork:\n  egress:\n    allow: [a.test]\n{extra}"),
        )
        .unwrap()
    };
    let explain = |format: &str| {
        let out = agentdiff(
            dir.path(),
            &["policy", "explain", "--host", "b.test", "--format", format],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    write("");
    let json: Value = serde_json::from_str(&explain("json")).unwrap();
    assert_eq!(
        (&json["action"], &json["on_denied"]),
        (&Value::from("deny"), &Value::from("review"))
    );
    assert!(
        explain("summary").contains(
            "refused: a refused connection is a review finding (network.egress.on_denied: review \
             (the default))"
        ),
        "{}",
        explain("summary")
    );
    write("    on_denied: deny\n");
    let json: Value = serde_json::from_str(&explain("json")).unwrap();
    assert_eq!(json["on_denied"], "deny");
    assert!(
        explain("summary").contains("refused: a refused connection is a deny finding"),
        "{}",
        explain("summary")
    );

    write("    on_denied: allow\n");
    let out = agentdiff(dir.path(), &["policy", "validate"]);
    assert_eq!(
        out.status.code(),
        Some(INVALID_CONFIG),
        "{}",
        text(&out.stderr)
    );
    let said = text(&out.stderr);
    assert!(
        said.contains("network.egress.on_denied: \"allow\" is not one of review, deny"),
        "{said}"
    );
}
