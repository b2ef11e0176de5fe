//! Environment evidence: names and fingerprints, never values.

use std::ffi::OsString;

use agentdiff_backend_api::environment::{plan, EnvMode};

use super::common::*;

#[test]
fn child_gets_the_values_but_evidence_holds_only_fingerprints() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "raw-value-4f1c9e-do-not-store";
    let mut s = spec(dir.path(), &["sh", "-c", "printf %s \"$MY_SECRET_TOKEN\""]);
    s.env.push(("MY_SECRET_TOKEN".into(), secret.into()));
    let ev = run(s);
    assert_eq!(read(&dir.path().join("stdout.txt")), secret);
    let env = ev.environment.as_ref().unwrap();
    assert!(env.variables["MY_SECRET_TOKEN"].starts_with("sha256:"));
    let json = serde_json::to_string(&ev).unwrap();
    assert!(!json.contains(secret), "raw value in evidence");
}

#[test]
fn scrubbed_plan_reaches_the_child_and_the_evidence() {
    let dir = tempfile::tempdir().unwrap();
    let current: Vec<(OsString, OsString)> = vec![
        ("PATH".into(), std::env::var_os("PATH").unwrap_or_default()),
        ("API_TOKEN".into(), "tok-123456".into()),
        ("LD_PRELOAD".into(), "/tmp/x.so".into()),
    ];
    let p = plan(EnvMode::Scrub, &[], current.into_iter());
    let mut s = spec(dir.path(), &["sh", "-c", "env"]);
    s.env = p.env.clone();
    s.env_plan = agentdiff_backend_api::EnvironmentPlan {
        mode: EnvMode::Scrub,
        dropped: p.evidence.dropped.clone(),
    };
    let ev = run(s);
    let out = read(&dir.path().join("stdout.txt"));
    assert!(
        !out.contains("API_TOKEN") && !out.contains("LD_PRELOAD"),
        "{out}"
    );
    let env = ev.environment.unwrap();
    assert_eq!(env.mode, EnvMode::Scrub);
    assert_eq!(env.dropped, ["API_TOKEN", "LD_PRELOAD"]);
    assert_eq!(env.variables.keys().collect::<Vec<_>>(), ["PATH"]);
}
