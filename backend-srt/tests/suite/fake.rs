//! The backend against a fake srt that records what it receives and runs the command unsandboxed.

use std::ffi::OsString;

use agentdiff_backend_api::{BackendError, FailureKind, Level, RuntimeBackend};
use agentdiff_backend_srt::{
    SrtBackend, ENFORCEMENT, OPT_ALLOW_DOMAIN, OPT_EXECUTABLE, OPT_EXEC_SHIM, OPT_SETTINGS,
    OPT_SETTINGS_FROM_POLICY,
};
use serde_json::json;

use super::common::*;

/// Arguments that a shell, a naive join or srt's own option parser would change.
fn tricky_args() -> Vec<&'static str> {
    vec![
        "a b",
        "",
        "x\ny",
        "it's",
        "\"q\"",
        "-c",
        "echo pwned",
        "-s",
        "/etc/passwd",
        "-d",
        "--",
        "--settings",
        "$HOME",
        "*",
        "\\",
        "-",
        "  lead and trail  ",
        "tab\there",
        ";|&<>`",
    ]
}

/// `sh -c 'printf "%s\0" "$@" > FILE' sh ARGS…`: the command writes back each argument it got.
fn echo_argv(out: &std::path::Path, args: &[&str]) -> Vec<OsString> {
    let mut argv: Vec<OsString> = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("printf '%s\\0' \"$@\" > '{}'", out.display()).into(),
        "sh".into(),
    ];
    argv.extend(args.iter().map(OsString::from));
    argv
}

fn read_nul_separated(path: &std::path::Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let mut parts: Vec<String> = text.split('\0').map(str::to_string).collect();
    assert_eq!(parts.pop().as_deref(), Some(""), "NUL-terminated");
    parts
}

#[test]
fn argv_boundaries_reach_the_command_unchanged() {
    let f = Fixture::fake();
    let out = f.root.join("argv.out");
    let args = tricky_args();
    let argv = echo_argv(&out, &args);
    let ev = run(&f, f.spec_os(argv.clone(), false));
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    assert_eq!(read_nul_separated(&out), args);

    // What srt received: its own options, then `--`, then the shim and the argv verbatim.
    let rec = f.run_record();
    let got: Vec<String> = rec["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let sep = got.iter().position(|a| a == "--").unwrap();
    assert_eq!(
        got[1..sep],
        [
            "--settings".to_string(),
            f.capsule
                .join("srt-settings.json")
                .to_string_lossy()
                .into_owned()
        ],
        "only the derived settings before `--`: {got:?}"
    );
    assert!(!got[..sep].iter().any(|a| a == "-c"), "{got:?}");
    assert_eq!(got[sep + 1], SHIM);
    assert_eq!(got[sep + 2], "__exec-shim");
    assert_eq!(got[sep + 3], agentdiff_backend_srt::shim::SHIM_PROTOCOL);
    assert_eq!(got[sep + 5], argv.len().to_string());
    let tail: Vec<OsString> = got[sep + 6..].iter().map(OsString::from).collect();
    assert_eq!(tail, argv);
    // The prepared wrapper argv is exactly what srt got.
    let wrapper: Vec<String> = ev
        .wrapper_argv
        .clone()
        .unwrap()
        .into_iter()
        .skip(1)
        .collect();
    assert_eq!(wrapper, got[1..].to_vec());
    assert_eq!(rec["cwd"], f.root.to_string_lossy().as_ref());
    let w = ev.wrapper.unwrap();
    assert_eq!(w["command_started"], true);
    assert_eq!(w["exit_attribution"], "command");
}

#[test]
fn settings_go_before_the_separator_and_are_digested() {
    let mut f = Fixture::fake();
    let settings = f.dir.path().join("settings.json");
    std::fs::write(&settings, br#"{"filesystem":{"allowWrite":["."]}}"#).unwrap();
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());
    let ev = run(&f, f.spec(&["/bin/true"]));
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    let rec = f.run_record();
    let argv = rec["argv"].as_array().unwrap();
    assert_eq!(argv[1], "--settings");
    assert_eq!(argv[2], settings.to_str().unwrap());
    assert_eq!(argv[3], "--");
    let s = &ev.wrapper.as_ref().unwrap()["settings"];
    assert_eq!(s["source"], "file");
    assert_eq!(s["path"], settings.to_str().unwrap());
    assert_eq!(s["sha256"], sha256_file(&settings));
}

#[test]
fn no_settings_means_settings_derived_from_the_launch_specs_policy() {
    // The spec carries the built-in policy's deny patterns (what a transaction without a project
    // policy hands over): they apply, and the evidence says where they came from.
    let f = Fixture::fake();
    let ev = run(&f, f.spec(&["/bin/true"]));
    let w = ev.wrapper.unwrap();
    assert_eq!(w["settings"]["source"], "generated_from_policy");
    assert_eq!(w["settings"]["bridge"]["policy_source"], "run_policy");
    let content = &w["settings"]["bridge"]["content"];
    let root = f.root.to_string_lossy().into_owned();
    assert_eq!(content["filesystem"]["allowWrite"], json!([root]));
    let deny_write = content["filesystem"]["denyWrite"].as_array().unwrap();
    for p in [".agentdiff", ".git", ".env", ".ssh"] {
        assert!(
            deny_write.contains(&json!(format!("{root}/{p}"))),
            "{p}: {deny_write:?}"
        );
    }
    let deny_read = content["filesystem"]["denyRead"].as_array().unwrap();
    let home = f.home.to_string_lossy().into_owned();
    assert!(
        deny_read.contains(&json!(format!("{home}/.ssh"))),
        "{deny_read:?}"
    );
    assert!(
        deny_read.contains(&json!(format!("{home}/.aws"))),
        "{deny_read:?}"
    );
    assert_eq!(content["network"]["allowedDomains"], json!([]));
    // The digest is of the exact bytes srt read.
    {
        use sha2::Digest;
        let read_by_srt = f.settings_record().unwrap();
        assert_eq!(
            w["settings"]["sha256"],
            hex::encode(sha2::Sha256::digest(read_by_srt.as_bytes()))
        );
    }
    assert_eq!(w["version"], "0.0.0-fake");
    assert_eq!(w["version_source"], "probed");
    assert_eq!(w["sandbox"], "requested_not_verified");
}

#[test]
fn the_srt_version_is_probed_once_per_binary_identity() {
    let f = Fixture::fake();
    run(&f, f.spec(&["/bin/true"]));
    let ev = run(&f, f.spec(&["/bin/true"]));
    assert_eq!(ev.wrapper.unwrap()["version_source"], "cached");
    let versions = f
        .records()
        .iter()
        .filter(|r| {
            r["argv"]
                .as_array()
                .is_some_and(|a| a.iter().any(|a| a == "--version"))
        })
        .count();
    assert_eq!(versions, 1, "`srt --version` ran once for two runs");
}

#[test]
fn evidence_labels_say_requested_never_enforced() {
    let mut f = Fixture::fake();
    f.extra_env
        .push((OsString::from("FAKE_SRT_VERSION"), OsString::from("9.8.7")));
    let ev = run(&f, f.spec(&["/bin/true"]));
    assert_eq!(ev.backend, "srt");
    assert_eq!(ev.enforcement, ENFORCEMENT);
    assert_eq!(ev.capabilities.filesystem_writes, Level::Requested);
    assert_eq!(ev.capabilities.network, Level::Requested);
    assert!(ev
        .capabilities
        .matrix()
        .values()
        .all(|l| *l < Level::Enforced));
    assert!(!ev.capabilities.sandboxed);
    assert!(!ev.capabilities.network_enforcement);
    assert_eq!(ev.wrapper.unwrap()["version"], "9.8.7");
    // The host-side process tree includes the wrapper.
    assert!(!ev.processes.is_empty());
    // The marker FIFO does not outlive the run.
    assert!(!f.capsule.join("srt-start-marker.fifo").exists());
}

#[test]
fn secrets_in_the_command_are_redacted_from_the_recorded_wrapper_argv() {
    let f = Fixture::fake();
    let out = f.root.join("argv.out");
    let args = [
        "--token",
        "s3cr3t-token-value",
        "--password=hunter2hunter2",
        "API_KEY=abcdef123456",
        "https://user:pa55word@example.com/repo.git",
    ];
    let ev = run(&f, f.spec_os(echo_argv(&out, &args), false));
    // The command got the real values (redaction is for evidence, not for the run)...
    assert_eq!(read_nul_separated(&out), args);
    // ...and the wrapper argv as the transaction stores it has none of them.
    let raw: Vec<OsString> = ev
        .wrapper_argv
        .unwrap()
        .into_iter()
        .map(OsString::from)
        .collect();
    let stored = agentdiff_host::redact::redact_os_argv(&raw).join("\u{1}");
    for secret in [
        "s3cr3t-token-value",
        "hunter2hunter2",
        "abcdef123456",
        "pa55word",
    ] {
        assert!(!stored.contains(secret), "{secret} in {stored}");
    }
    assert!(stored.contains("__exec-shim"));
    assert!(!ev.wrapper.unwrap().to_string().contains("s3cr3t"));
}

#[test]
fn the_commands_exit_code_propagates() {
    let f = Fixture::fake();
    for code in [0, 1, 7, 42] {
        let ev = run(&f, f.spec(&["/bin/sh", "-c", &format!("exit {code}")]));
        assert_eq!(ev.exit.code, Some(code));
        assert_eq!(ev.failure, None, "exit {code}");
        let w = ev.wrapper.unwrap();
        assert_eq!(w["command_started"], true);
        assert_eq!(w["exit_attribution"], "command");
    }
}

#[test]
fn srt_setup_failure_is_not_the_commands_exit_1() {
    let mut f = Fixture::fake();
    f.extra_env
        .push((OsString::from("FAKE_SRT_MODE"), OsString::from("refuse")));
    let witness = f.root.join("ran");
    let ev = run(
        &f,
        f.spec(&[
            "/bin/sh",
            "-c",
            &format!("touch '{}'; exit 1", witness.display()),
        ]),
    );
    // Same exit code as a command exiting 1, told apart by the missing start mark.
    assert_eq!(ev.exit.code, Some(1));
    let Some(FailureKind::WrapperSetupFailed { message }) = &ev.failure else {
        panic!("{:?}", ev.failure);
    };
    assert!(message.contains("before the command started"), "{message}");
    assert!(!witness.exists(), "the command must not have run");
    let w = ev.wrapper.unwrap();
    assert_eq!(w["command_started"], false);
    assert_eq!(w["exit_attribution"], "wrapper");
    assert_eq!(w["start_state"], "not_started");
}

#[test]
fn a_command_that_cannot_be_executed_is_a_launch_failure_inside_srt() {
    let f = Fixture::fake();
    let ev = run(&f, f.spec(&["/nonexistent/agentdiff-test-program", "x"]));
    assert_eq!(ev.exit.code, Some(127));
    assert!(
        matches!(&ev.failure, Some(FailureKind::LaunchFailed { .. })),
        "{:?}",
        ev.failure
    );
    assert_eq!(ev.wrapper.unwrap()["start_state"], "exec_failed");
}

fn prepare_err(f: &Fixture, argv: &[&str]) -> BackendError {
    SrtBackend::new().prepare(&f.spec(argv)).unwrap_err()
}

#[test]
fn missing_or_unusable_srt_is_unavailable_with_a_remedy() {
    // Not on PATH.
    let f = Fixture::bare();
    for p in ["bwrap", "socat", "rg"] {
        write_exec(&f.bin.join(p), "#!/bin/sh\nexit 0\n");
    }
    let mut spec = f.spec(&["/bin/true"]);
    spec.env.retain(|(k, _)| k != "PATH");
    spec.env
        .push(("PATH".into(), f.bin.clone().into_os_string()));
    let err = SrtBackend::new().prepare(&spec).unwrap_err();
    let BackendError::Unavailable { reason, remedy, .. } = &err else {
        panic!("{err}")
    };
    assert!(reason.contains("srt"), "{reason}");
    assert!(
        remedy.contains("npm install -g @anthropic-ai/sandbox-runtime"),
        "{remedy}"
    );

    // Named but missing, and named but not executable.
    let mut f = Fixture::fake();
    f.options.push(OPT_EXECUTABLE, "/nonexistent/srt");
    assert!(matches!(
        prepare_err(&f, &["/bin/true"]),
        BackendError::Unavailable { .. }
    ));
    let plain = f.dir.path().join("srt-plain");
    std::fs::write(&plain, "not a program").unwrap();
    let mut f2 = Fixture::fake();
    f2.options.push(OPT_EXECUTABLE, plain.to_str().unwrap());
    let err = prepare_err(&f2, &["/bin/true"]);
    assert!(err.to_string().contains("not executable"), "{err}");
    assert!(f2.records().is_empty(), "nothing was launched");
}

#[test]
fn missing_linux_prerequisites_are_unavailable_and_named() {
    let f = Fixture::fake();
    std::fs::remove_file(f.bin.join("socat")).unwrap();
    // PATH with only the fixture's bin directory, so the host's socat is not found.
    let mut spec = f.spec(&["/bin/true"]);
    spec.env.retain(|(k, _)| k != "PATH");
    spec.env
        .push(("PATH".into(), f.bin.clone().into_os_string()));
    let err = SrtBackend::new().prepare(&spec).unwrap_err();
    let BackendError::Unavailable { reason, remedy, .. } = &err else {
        panic!("{err}")
    };
    assert!(reason.contains("socat"), "{reason}");
    assert!(!reason.contains("bubblewrap"), "{reason}");
    assert!(remedy.contains("apt-get install -y socat"), "{remedy}");
}

#[test]
fn bad_settings_paths_are_invalid_requests() {
    let mut f = Fixture::fake();
    f.options.push(OPT_SETTINGS, "/nonexistent/settings.json");
    let err = prepare_err(&f, &["/bin/true"]);
    assert!(matches!(err, BackendError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("does not exist"), "{err}");

    let mut f = Fixture::fake();
    f.options.push(OPT_SETTINGS, f.dir.path().to_str().unwrap());
    let err = prepare_err(&f, &["/bin/true"]);
    assert!(err.to_string().contains("not a regular file"), "{err}");

    let mut f = Fixture::fake();
    f.options.push(OPT_SETTINGS, "/etc/hostname");
    f.options.push(OPT_SETTINGS_FROM_POLICY, "true");
    assert!(matches!(
        prepare_err(&f, &["/bin/true"]),
        BackendError::InvalidRequest { .. }
    ));

    // Domains go into derived settings only, not into the user's own file.
    let mut f = Fixture::fake();
    f.options.push(OPT_ALLOW_DOMAIN, "example.com");
    f.options.push(OPT_SETTINGS, "/etc/hostname");
    assert!(matches!(
        prepare_err(&f, &["/bin/true"]),
        BackendError::InvalidRequest { .. }
    ));

    // `false` without a file to take the derived settings' place.
    let mut f = Fixture::fake();
    f.options.push(OPT_SETTINGS_FROM_POLICY, "false");
    let err = prepare_err(&f, &["/bin/true"]);
    assert!(err.to_string().contains("--srt-settings"), "{err}");
}

#[test]
fn prepare_is_pure() {
    let f = Fixture::fake();
    let mut f2 = f;
    f2.options.push(OPT_SETTINGS_FROM_POLICY, "true");
    let before: Vec<_> = std::fs::read_dir(&f2.capsule).unwrap().collect();
    let prepared = SrtBackend::new().prepare(&f2.spec(&["/bin/true"])).unwrap();
    assert_eq!(
        std::fs::read_dir(&f2.capsule).unwrap().count(),
        before.len()
    );
    assert!(f2.records().is_empty(), "prepare ran srt");
    assert_eq!(prepared.enforcement(), ENFORCEMENT);
    assert_eq!(prepared.cwd(), &f2.root);
}

/// The shim is asked for its seccomp guard, and the runtime configuration says what it refuses.
#[test]
fn the_exec_shim_is_asked_for_its_seccomp_guard() {
    let f = Fixture::fake();
    let prepared = SrtBackend::new().prepare(&f.spec(&["/bin/true"])).unwrap();
    let guard: Vec<_> = prepared
        .command()
        .env
        .iter()
        .filter(|(k, _)| k == agentdiff_process::exec_shim::ENV_SECCOMP_GUARD)
        .map(|(_, v)| v.clone())
        .collect();
    assert_eq!(guard, ["1"]);
    assert_eq!(
        prepared.runtime_config()["seccomp_guard"],
        agentdiff_process::seccomp_guard::SUMMARY
    );
}

#[test]
fn the_exec_shim_must_be_located() {
    if std::env::var_os(agentdiff_backend_srt::ENV_EXEC_SHIM).is_some() {
        agentdiff_conformance::print_skip("AGENTDIFF_SRT_EXEC_SHIM is set in this environment");
        return;
    }
    let mut f = Fixture::fake();
    f.options = agentdiff_backend_api::BackendOptions::new();
    // This test binary is not `agentdiff`, so there is no shim to fall back on.
    let err = prepare_err(&f, &["/bin/true"]);
    let BackendError::Unavailable { reason, remedy, .. } = &err else {
        panic!("{err}")
    };
    assert!(reason.contains("agentdiff"), "{reason}");
    assert!(remedy.contains("AGENTDIFF_SRT_EXEC_SHIM"), "{remedy}");
    f.options.push(OPT_EXEC_SHIM, "/nonexistent/agentdiff");
    assert!(matches!(
        prepare_err(&f, &["/bin/true"]),
        BackendError::Unavailable { .. }
    ));
}

#[test]
fn a_broken_srt_version_refuses_the_launch() {
    let mut f = Fixture::fake();
    f.extra_env.push((
        OsString::from("FAKE_SRT_MODE"),
        OsString::from("broken-version"),
    ));
    let witness = f.root.join("ran");
    let spec = f.spec(&["/usr/bin/touch", witness.to_str().unwrap()]);
    let prepared = SrtBackend::new().prepare(&spec).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let err = rt
        .block_on(SrtBackend::new().launch(
            prepared,
            agentdiff_backend_api::LaunchContext::new(Default::default()),
        ))
        .err()
        .unwrap();
    assert!(matches!(err, BackendError::Unavailable { .. }), "{err}");
    assert!(!witness.exists());
    assert_eq!(f.records().len(), 1, "only `srt --version` ran");
}

#[test]
fn settings_from_policy_are_generated_in_the_capsule() {
    let mut f = Fixture::fake();
    // A policy.json planted in the capsule says something else: the launch spec is what counts.
    std::fs::write(
        f.capsule.join("policy.json"),
        json!({"effective": {"version": 1, "filesystem": {"deny": [".ssh", "planted/**"]}}})
            .to_string(),
    )
    .unwrap();
    f.options.push(OPT_SETTINGS_FROM_POLICY, "true");
    f.options.push(OPT_ALLOW_DOMAIN, "example.com");
    let mut spec = f.spec(&["/bin/true"]);
    spec.deny_patterns = vec![".env".into(), ".git/**".into(), "**/*.pem".into()];
    let ev = run(&f, spec);
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    let generated = f.capsule.join("srt-settings.json");
    // srt read the generated file from the capsule...
    let rec = f.run_record();
    assert_eq!(rec["argv"][1], "--settings");
    assert_eq!(rec["argv"][2], generated.to_str().unwrap());
    let read_by_srt = f.settings_record().unwrap();
    let settings: serde_json::Value = serde_json::from_str(&read_by_srt).unwrap();
    let root = f.root.to_string_lossy().into_owned();
    assert_eq!(settings["filesystem"]["allowWrite"], json!([root]));
    let deny_write = settings["filesystem"]["denyWrite"].as_array().unwrap();
    for p in [".agentdiff", ".env", ".git"] {
        assert!(
            deny_write.contains(&json!(format!("{root}/{p}"))),
            "{p}: {deny_write:?}"
        );
    }
    // The spec's patterns, not the built-in policy's nor the planted file's.
    assert!(!deny_write.contains(&json!(format!("{root}/.ssh"))));
    assert!(!deny_write.contains(&json!(format!("{root}/planted"))));
    assert_eq!(
        settings["network"]["allowedDomains"],
        json!(["example.com"])
    );
    // ...which is gone after the run (the capsule seals known artifacts only), while the
    // evidence holds its exact content and digest.
    assert!(!generated.exists());
    let s = &ev.wrapper.as_ref().unwrap()["settings"];
    assert_eq!(s["source"], "generated_from_policy");
    assert_eq!(s["bridge"]["content"], settings);
    {
        use sha2::Digest;
        assert_eq!(
            s["sha256"],
            hex::encode(sha2::Sha256::digest(read_by_srt.as_bytes()))
        );
    }
    assert_eq!(s["bridge"]["not_expressed_denies"], json!(["**/*.pem"]));
    assert_eq!(s["bridge"]["controls"], "requested");
    assert_eq!(ev.capabilities.filesystem_writes, Level::Requested);
}

#[test]
fn a_spec_without_deny_patterns_derives_no_policy_denies_and_says_so() {
    // A direct call outside a transaction: nothing from a policy, whatever the capsule holds.
    let mut f = Fixture::fake();
    std::fs::write(
        f.capsule.join("policy.json"),
        json!({"effective": {"version": 1, "filesystem": {"deny": [".env"]}}}).to_string(),
    )
    .unwrap();
    f.options.push(OPT_SETTINGS_FROM_POLICY, "true");
    let mut spec = f.spec(&["/bin/true"]);
    spec.deny_patterns.clear();
    let ev = run(&f, spec);
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    let bridge = &ev.wrapper.as_ref().unwrap()["settings"]["bridge"];
    assert_eq!(bridge["policy_source"], "none");
    let root = f.root.to_string_lossy().into_owned();
    let deny_write = bridge["content"]["filesystem"]["denyWrite"]
        .as_array()
        .unwrap();
    assert!(
        !deny_write.contains(&json!(format!("{root}/.env"))),
        "{deny_write:?}"
    );
    // agentdiff's own store is protected whatever the policy says.
    assert!(
        deny_write.contains(&json!(format!("{root}/.agentdiff"))),
        "{deny_write:?}"
    );
}

#[test]
fn registered_as_srt() {
    let registry = agentdiff_plugins::Registry::from_inventory().unwrap();
    assert!(registry.ids().contains(&"srt"));
    assert_eq!(registry.create("srt").unwrap().id(), "srt");
}

#[test]
fn non_utf8_arguments_are_refused_rather_than_altered() {
    use std::os::unix::ffi::OsStringExt;
    let f = Fixture::fake();
    let spec = f.spec_os(
        vec![
            OsString::from("/bin/echo"),
            OsString::from_vec(vec![b'a', 0xff, b'b']),
        ],
        false,
    );
    let err = SrtBackend::new().prepare(&spec).unwrap_err();
    assert!(matches!(err, BackendError::InvalidRequest { .. }), "{err}");
    assert!(err.to_string().contains("UTF-8"), "{err}");
}

#[test]
fn a_wrapper_that_alters_an_argument_never_starts_the_command() {
    let mut f = Fixture::fake();
    f.extra_env
        .push((OsString::from("FAKE_SRT_MODE"), OsString::from("alter")));
    let witness = f.root.join("ran");
    let ev = run(&f, f.spec(&["/usr/bin/touch", witness.to_str().unwrap()]));
    assert!(!witness.exists(), "the command ran with an altered argv");
    let Some(FailureKind::WrapperSetupFailed { message }) = &ev.failure else {
        panic!("{:?}", ev.failure);
    };
    assert!(message.contains("digest_mismatch"), "{message}");
    let w = ev.wrapper.unwrap();
    assert_eq!(w["start_state"], "argv_altered");
    assert_eq!(w["argv_verified"], false);
}

#[test]
fn the_argv_digest_stays_out_of_the_command_and_the_evidence() {
    let f = Fixture::fake();
    let out = f.root.join("env.out");
    let ev = run(
        &f,
        f.spec(&["/bin/sh", "-c", &format!("env > '{}'", out.display())]),
    );
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    // srt never receives it (it reaches the shim through the secret FIFO, read once), yet the
    // shim verified the argv; the command's environment and the evidence do not have it either.
    let rec = f.run_record();
    assert!(
        rec["env"][agentdiff_backend_srt::shim::ENV_ARGV_DIGEST].is_null(),
        "{rec:#}"
    );
    let env = std::fs::read_to_string(&out).unwrap();
    assert!(
        !env.contains(agentdiff_backend_srt::shim::ENV_ARGV_DIGEST),
        "{env}"
    );
    assert!(env.contains("FAKE_SRT_RECORD="), "{env}");
    let recorded = ev.environment.unwrap();
    assert!(!recorded
        .variables
        .contains_key(agentdiff_backend_srt::shim::ENV_ARGV_DIGEST));
    assert!(recorded.variables.contains_key("PATH"));
    assert_eq!(ev.wrapper.unwrap()["argv_verified"], true);
}

#[test]
fn launch_facts_carry_the_wrappers_identity_for_cleanup() {
    // `agentdiff cleanup` of a run whose monitor died finds its processes from these facts:
    // a bare pid (the trait's default) could name a reused process.
    let f = Fixture::fake();
    let prepared = SrtBackend::new()
        .prepare(&f.spec(&["/bin/sh", "-c", "exit 0"]))
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx =
            agentdiff_backend_api::LaunchContext::new(agentdiff_backend_api::StdioMode::Files {
                stdin: None,
                stdout: f.dir.path().join("stdout"),
                stderr: f.dir.path().join("stderr"),
            });
        let running = SrtBackend::new().launch(prepared, ctx).await.unwrap();
        let facts = running.launch_facts();
        let root = facts.root.expect("the root identity is recorded at launch");
        assert_eq!(Some(root.pid), running.pid());
        assert_eq!(facts.pid, running.pid());
        running.wait().await.unwrap();
    });
}
