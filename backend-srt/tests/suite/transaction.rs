//! The srt backend inside the full evidence transaction, with the real srt: the change inside the
//! root is recorded in the capsule, the write outside is refused, the stored wrapper argv is
//! redacted, and the labels stay `requested`.

use std::ffi::OsString;
use std::time::Duration;

use agentdiff_backend_api::{Level, StdioMode};
use agentdiff_backend_srt::{SrtBackend, OPT_SETTINGS};
use agentdiff_engine::transaction::{self, RunRequest};
use serde_json::json;

use super::common::*;

fn run_transaction(f: &Fixture, argv: Vec<OsString>) -> transaction::RunOutcome {
    let backend = SrtBackend::new();
    let policy = agentdiff_policy::load(&f.root, None).unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(None);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(transaction::run(RunRequest {
        root: f.root.clone(),
        policy,
        argv,
        task: None,
        timeout: Some(Duration::from_secs(60)),
        run_id: None,
        backend: &backend,
        options: f.options.clone(),
        stdio: StdioMode::Files {
            stdin: None,
            stdout: f.dir.path().join("stdout"),
            stderr: f.dir.path().join("stderr"),
        },
        interrupt: rx,
        env_mode: None,
        env_pass: Vec::new(),
        grace: Duration::from_millis(500),
        poll_interval: Duration::from_millis(10),
        progress: None,
        verified_controls: Vec::new(),
        state_dir: Some(agentdiff_store::seal::StateDir::at(f.dir.path().join("state")).unwrap()),
    }))
    .unwrap()
}

#[test]
fn real_srt_run_is_recorded_by_the_transaction() {
    let Some(_srt) = super::real::real_srt("real_srt_run_is_recorded_by_the_transaction") else {
        return;
    };
    let mut f = Fixture::bare();
    // The transaction creates its own private store.
    std::fs::remove_dir_all(f.root.join(".agentdiff")).unwrap();
    std::fs::write(f.root.join("a.txt"), "before\n").unwrap();
    let outside = tempfile::tempdir().unwrap();
    let sentinel = outside.path().join("sentinel.txt");
    std::fs::write(&sentinel, "untouched\n").unwrap();
    let sentinel_before = sha256_file(&sentinel);
    let settings = f.dir.path().join("settings.json");
    std::fs::write(
        &settings,
        json!({
            "filesystem": {"denyRead": [], "allowWrite": [f.root], "denyWrite": []},
            "network": {"allowedDomains": [], "deniedDomains": []}
        })
        .to_string(),
    )
    .unwrap();
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());

    let secret = "ghp_0123456789abcdefghijklmnopqrstuvwxyz";
    let argv: Vec<OsString> = [
        "/bin/sh",
        "-c",
        "echo after > a.txt; echo new > b.txt; echo pwned > \"$1\"; exit 0",
        "sh",
        sentinel.to_str().unwrap(),
        "--token",
        secret,
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let outcome = run_transaction(&f, argv);
    let stderr = stderr_of(&f);
    assert_eq!(outcome.refusal, None, "stderr: {stderr}");
    let result = &outcome.result;
    assert_eq!(result.exit_code, Some(0), "stderr: {stderr}");
    let paths: Vec<&str> = result.changes.iter().map(|c| c.path.as_str()).collect();
    assert!(paths.contains(&"a.txt"), "{paths:?}");
    assert!(paths.contains(&"b.txt"), "{paths:?}");
    assert_eq!(sha256_file(&sentinel), sentinel_before);

    let runtime = result.runtime.as_ref().unwrap();
    assert_eq!(runtime.backend, "srt");
    assert_eq!(runtime.enforcement.as_str(), "external_sandbox_requested");
    assert!(!runtime.sandboxed);
    assert_eq!(runtime.capabilities.filesystem_writes, Level::Requested);
    assert_eq!(runtime.failure, None);

    // What the capsule stores: the wrapper facts, and no secret anywhere in runtime.json.
    let stored = std::fs::read_to_string(outcome.capsule_dir.join("runtime.json")).unwrap();
    assert!(!stored.contains(secret), "secret stored in runtime.json");
    let doc: serde_json::Value = serde_json::from_str(&stored).unwrap();
    assert_eq!(doc["wrapper"]["settings"]["sha256"], sha256_file(&settings));
    assert_eq!(doc["wrapper"]["command_started"], true);
    let wrapper_argv = doc["wrapper_argv"].as_array().unwrap();
    assert!(wrapper_argv.iter().any(|a| a == "--"));
    assert!(wrapper_argv.iter().any(|a| a == "--token"));
    // The start-marker FIFO is gone before the capsule was sealed.
    assert!(!outcome.capsule_dir.join("srt-start-marker.fifo").exists());
}

#[test]
fn real_srt_with_no_options_derives_settings_and_the_capsule_seals() {
    if super::real::real_srt("real_srt_with_no_options_derives_settings").is_none() {
        return;
    }
    let f = Fixture::bare();
    std::fs::remove_dir_all(f.root.join(".agentdiff")).unwrap();
    std::fs::write(f.root.join(".env"), "SECRET=1\n").unwrap();
    let env_before = sha256_file(&f.root.join(".env"));
    // No settings option at all: derived from the (built-in) policy by default.
    let argv: Vec<OsString> = [
        "/bin/sh",
        "-c",
        "echo ok > ok.txt; (echo x > .env); (echo x > .agentdiff/forged); exit 0",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    // `run` returns an error when the seal finds an unknown file in the capsule.
    let outcome = run_transaction(&f, argv);
    assert_eq!(outcome.result.exit_code, Some(0), "{}", stderr_of(&f));
    // The built-in policy denies .env; the generated settings made srt refuse the write.
    assert_eq!(sha256_file(&f.root.join(".env")), env_before);
    assert!(f.root.join("ok.txt").exists());
    assert!(!f.root.join(".agentdiff/forged").exists());
    let paths: Vec<&str> = outcome
        .result
        .changes
        .iter()
        .map(|c| c.path.as_str())
        .collect();
    assert_eq!(paths, vec!["ok.txt"], "only the inside write is a change");
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(outcome.capsule_dir.join("runtime.json")).unwrap(),
    )
    .unwrap();
    let settings = &doc["wrapper"]["settings"];
    assert_eq!(settings["source"], "generated_from_policy");
    assert!(settings["bridge"]["content"]["filesystem"]["denyWrite"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p.as_str().unwrap().ends_with("/.env")));
    assert_eq!(
        outcome
            .result
            .runtime
            .as_ref()
            .unwrap()
            .capabilities
            .filesystem_writes,
        Level::Requested
    );
    assert!(!outcome.capsule_dir.join("srt-settings.json").exists());
}

#[test]
fn real_srt_proxy_listeners_are_infrastructure_not_the_commands() {
    if super::real::real_srt("real_srt_proxy_listeners_are_infrastructure").is_none() {
        return;
    }
    let f = Fixture::bare();
    std::fs::remove_dir_all(f.root.join(".agentdiff")).unwrap();
    // The command outlives a few 100 ms port samples, so srt's proxy is seen while srt holds
    // it (with `true` alone, a loaded host can end srt between two samples).
    let argv = ["sleep", "0.5"].map(OsString::from).to_vec();
    let outcome = run_transaction(&f, argv);
    assert_eq!(outcome.result.exit_code, Some(0), "{}", stderr_of(&f));
    let doc: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(outcome.capsule_dir.join("runtime.json")).unwrap(),
    )
    .unwrap();
    // Other tests run srt at the same time: their proxies may show up as machine-wide,
    // unattributed listeners. Nothing attributed to this run may remain in `opened`.
    let opened = doc["ports"]["opened"].as_array().unwrap();
    assert!(
        opened.iter().all(|l| l["attributed"] == false),
        "{:#}",
        doc["ports"]
    );
    assert!(
        !doc["ports"]["infrastructure"]
            .as_array()
            .map_or(true, Vec::is_empty),
        "srt's proxy was seen: {:#}",
        doc["ports"]
    );
    // srt's proxy, when a snapshot saw it, is recorded as srt's and held by the srt process.
    let root_pid = doc["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["relation"] == "root")
        .unwrap()["identity"]["pid"]
        .clone();
    for l in doc["ports"]["infrastructure"]
        .as_array()
        .into_iter()
        .flatten()
    {
        assert_eq!(l["component"], "srt");
        assert_eq!(l["owner"]["pid"], root_pid);
    }
}

/// The git directories the transaction finds in the tree (a nested repository, a bare one with
/// another name) reach the derived settings: a shell call cannot plant a hook in either, which
/// would run the next time the user works in that repository.
#[test]
fn real_srt_command_cannot_write_nested_git_directories() {
    if super::real::real_srt("real_srt_command_cannot_write_nested_git_directories").is_none() {
        return;
    }
    let f = Fixture::bare();
    std::fs::remove_dir_all(f.root.join(".agentdiff")).unwrap();
    for (dir, bare) in [("sub", false), ("vendor/thing.git", true)] {
        let mut git = std::process::Command::new("git");
        git.args(["init", "-q"]).arg(f.root.join(dir));
        if bare {
            git.arg("--bare");
        }
        assert!(git.status().unwrap().success());
    }
    let argv: Vec<OsString> = [
        "/bin/sh",
        "-c",
        "(echo x > sub/.git/hooks/post-checkout); \
         (echo x > vendor/thing.git/hooks/pre-receive); echo ok > ok.txt; exit 0",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let outcome = run_transaction(&f, argv);
    assert_eq!(outcome.result.exit_code, Some(0), "{}", stderr_of(&f));
    assert!(f.root.join("ok.txt").exists());
    assert!(!f.root.join("sub/.git/hooks/post-checkout").exists());
    assert!(!f.root.join("vendor/thing.git/hooks/pre-receive").exists());
}
