//! The backend against the real srt (installed by `.ci/run`). Without srt or bubblewrap these
//! tests print why they did not run; with `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` a missing component
//! fails them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use agentdiff_backend_api::{FailureKind, Level};
use agentdiff_backend_srt::shim::ExitBy;
use agentdiff_backend_srt::OPT_SETTINGS;
use serde_json::json;

use super::common::*;

/// The real srt on the host PATH, or `None` after printing why the test does not run.
pub fn real_srt(test: &str) -> Option<PathBuf> {
    let mut missing = Vec::new();
    let srt = which::which("srt").ok();
    if srt.is_none() {
        missing.push("srt (npm install -g @anthropic-ai/sandbox-runtime)");
    }
    for (program, install) in [
        ("bwrap", "apt-get install -y bubblewrap"),
        ("socat", "apt-get install -y socat"),
        ("rg", "apt-get install -y ripgrep"),
    ] {
        if which::which(program).is_err() {
            missing.push(install);
        }
    }
    if missing.is_empty() {
        return srt;
    }
    let message = format!(
        "{test}: real srt prerequisites missing: {}",
        missing.join(", ")
    );
    agentdiff_conformance::skip_unless_required(&message);
    None
}

fn settings_allowing_only(dir: &Path, allow_write: &Path) -> PathBuf {
    let path = dir.join("srt-settings.json");
    std::fs::write(
        &path,
        json!({
            "filesystem": {"denyRead": [], "allowWrite": [allow_write], "denyWrite": []},
            "network": {"allowedDomains": [], "deniedDomains": []}
        })
        .to_string(),
    )
    .unwrap();
    path
}

#[test]
fn real_srt_keeps_writes_inside_the_root_and_labels_stay_requested() {
    let Some(srt) = real_srt("real_srt_keeps_writes_inside_the_root") else {
        return;
    };
    let mut f = Fixture::bare();
    let outside = tempfile::tempdir().unwrap();
    let sentinel = outside.path().join("sentinel.txt");
    std::fs::write(&sentinel, "untouched\n").unwrap();
    let before = sha256_file(&sentinel);
    let created_outside = outside.path().join("created.txt");
    let settings = settings_allowing_only(f.dir.path(), &f.root);
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());

    let script = "echo inside > inside.txt; echo pwned > \"$1\"; echo new > \"$2\"; exit 0";
    let argv: Vec<OsString> = [
        "/bin/sh",
        "-c",
        script,
        "sh",
        sentinel.to_str().unwrap(),
        created_outside.to_str().unwrap(),
    ]
    .iter()
    .map(OsString::from)
    .collect();
    let ev = run(&f, f.spec_os(argv, true));
    let stderr = stderr_of(&f);
    assert_eq!(ev.exit.code, Some(0), "stderr: {stderr}");
    assert_eq!(ev.failure, None, "stderr: {stderr}");
    // Inside the root: written. Outside: refused by srt, the sentinel is unchanged.
    assert_eq!(
        std::fs::read_to_string(f.root.join("inside.txt")).unwrap(),
        "inside\n"
    );
    assert_eq!(
        sha256_file(&sentinel),
        before,
        "srt let the command write outside the root"
    );
    assert!(
        !created_outside.exists(),
        "srt let the command create a file outside the root"
    );
    assert!(stderr.contains("Read-only file system"), "stderr: {stderr}");

    // Labels: requested, never enforced, even though the write was refused here.
    assert_eq!(ev.backend, "srt");
    assert_eq!(ev.enforcement.as_str(), "external_sandbox_requested");
    assert_eq!(ev.capabilities.filesystem_writes, Level::Requested);
    assert_eq!(ev.capabilities.network, Level::Requested);
    assert!(!ev.capabilities.sandboxed);
    let w = ev.wrapper.as_ref().unwrap();
    assert_eq!(w["command_started"], true);
    assert_eq!(w["settings"]["sha256"], sha256_file(&settings));
    let version = std::process::Command::new(&srt)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        w["version"],
        String::from_utf8_lossy(&version.stdout).trim()
    );
    // The host-side tree holds more than the wrapper (srt starts bwrap and the command).
    assert!(ev.processes.len() >= 2, "{:?}", ev.processes);
}

#[test]
fn real_srt_preserves_argv_boundaries() {
    if real_srt("real_srt_preserves_argv_boundaries").is_none() {
        return;
    }
    let mut f = Fixture::bare();
    let settings = settings_allowing_only(f.dir.path(), &f.root);
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());
    let out = f.root.join("argv.out");
    let args = [
        "a b", "", "x\ny", "it's", "\"q\"", "-c", "-s", "-d", "--", "$HOME", "*", "\\", "`id`",
    ];
    let mut argv: Vec<OsString> = vec![
        "/bin/sh".into(),
        "-c".into(),
        format!("printf '%s\\0' \"$@\" > '{}'", out.display()).into(),
        "sh".into(),
    ];
    argv.extend(args.iter().map(OsString::from));
    let ev = run(&f, f.spec_os(argv, true));
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    let text = String::from_utf8(std::fs::read(&out).unwrap()).unwrap();
    let got: Vec<&str> = text.trim_end_matches('\0').split('\0').collect();
    assert_eq!(got, args);
}

/// Python that tries, from inside the sandbox, the kernel interfaces the exec shim's seccomp
/// filter refuses (argv: the output file, then the numbers of `io_uring_setup` and `keyctl`).
const PAST_THE_SANDBOX: &str = r#"
import ctypes, os, socket, sys
out = open(sys.argv[1], "w")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
libc.ptrace.restype = ctypes.c_long
try:
    socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    out.write("vsock created\n")
except OSError as e:
    out.write("vsock %d\n" % e.errno)
params = ctypes.create_string_buffer(120)
r = libc.syscall(int(sys.argv[2]), 1, params)
out.write("uring created\n" if r >= 0 else "uring %d\n" % ctypes.get_errno())
r = libc.syscall(int(sys.argv[3]), 0, -4, 0)  # KEYCTL_GET_KEYRING_ID of the user keyring
out.write("keyctl answered\n" if r >= 0 else "keyctl %d\n" % ctypes.get_errno())
r = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH to srt's bwrap init
out.write("ptrace attached\n" if r == 0 else "ptrace %d\n" % ctypes.get_errno())
try:
    os.close(os.open("/proc/1/mem", os.O_RDWR))
    out.write("mem opened\n")
except OSError as e:
    out.write("mem %d\n" % e.errno)
out.close()
"#;

/// srt's own filter covers Unix sockets only: the exec shim installs agentdiff's seccomp guard
/// under srt as under bwrap, so vsock (which no network namespace separates), io_uring, the
/// kernel keyrings and srt's bwrap init (pid 1, outside the filter) stay out of reach.
#[test]
fn real_srt_command_runs_under_the_exec_shims_seccomp_guard() {
    if real_srt("real_srt_command_runs_under_the_exec_shims_seccomp_guard").is_none() {
        return;
    }
    let mut f = Fixture::bare();
    let settings = settings_allowing_only(f.dir.path(), &f.root);
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());
    let out = f.root.join("probe.out");
    let argv: Vec<OsString> = vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        PAST_THE_SANDBOX.into(),
        out.clone().into_os_string(),
        libc::SYS_io_uring_setup.to_string().into(),
        libc::SYS_keyctl.to_string().into(),
    ];
    let ev = run(&f, f.spec_os(argv, true));
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    let seen = std::fs::read_to_string(&out).unwrap();
    for expected in [
        format!("vsock {}", libc::EAFNOSUPPORT),
        format!("uring {}", libc::ENOSYS),
        format!("keyctl {}", libc::ENOSYS),
        format!("ptrace {}", libc::EPERM),
    ] {
        assert!(
            seen.lines().any(|l| l == expected),
            "{expected:?} not in {seen:?}"
        );
    }
    // Its memory file is out of reach too (the shim drops every capability first).
    assert!(seen.lines().any(|l| l.starts_with("mem ")), "{seen:?}");
}

/// srt run by root leaves its command a full capability set; the exec shim drops every one
/// before `exec`, so the command can neither read the start line out of the marker nor forge the
/// shim's `exec_failed` with the token it carries, and its exit stays its own.
#[test]
fn real_srt_command_starts_without_capabilities_and_cannot_read_the_marker() {
    if real_srt("real_srt_command_starts_without_capabilities").is_none() {
        return;
    }
    let mut f = Fixture::bare();
    let settings = settings_allowing_only(f.dir.path(), &f.root);
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());
    let marker = f.capsule.join("srt-start-marker.fifo");
    let script = r#"
import os, sys
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
open("caps.out", "w").write(caps)
try:
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_NONBLOCK)
    line = os.read(fd, 4096)
    open("stolen.out", "wb").write(line)
    token = line.split(b"token=")[1].split()[0]
    os.write(fd, b"exec_failed token=" + token + b" errno=2\n")
except OSError as e:
    open("denied.out", "w").write(str(e.errno))
"#;
    let argv: Vec<OsString> = vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        script.into(),
        marker.into_os_string(),
    ];
    let ev = run(&f, f.spec_os(argv, true));
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    let read = |name: &str| std::fs::read_to_string(f.root.join(name)).ok();
    assert_eq!(read("caps.out").as_deref(), Some("0000000000000000"));
    assert_eq!(read("stolen.out"), None, "the command read the start line");
    assert_eq!(read("denied.out").as_deref(), Some("13"));
    let facts: agentdiff_backend_srt::SrtFacts = ev.wrapper.unwrap().decode().unwrap();
    let start = facts.start.unwrap();
    assert!(start.command_started && start.argv_verified, "{start:?}");
    assert_eq!(start.exit_attribution, ExitBy::Command, "{start:?}");
}

#[test]
fn real_srt_setup_failure_and_command_exit_1_are_told_apart() {
    if real_srt("real_srt_setup_failure_and_command_exit_1_are_told_apart").is_none() {
        return;
    }
    // The command's own exit 1.
    let mut f = Fixture::bare();
    let settings = settings_allowing_only(f.dir.path(), &f.root);
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());
    let ev = run(
        &f,
        f.spec_os(vec!["/bin/sh".into(), "-c".into(), "exit 1".into()], true),
    );
    assert_eq!(ev.exit.code, Some(1));
    assert_eq!(ev.failure, None);
    assert_eq!(ev.wrapper.unwrap()["exit_attribution"], "command");

    // srt's own exit 1: settings it refuses to load.
    let mut f = Fixture::bare();
    let bad = f.dir.path().join("bad.json");
    std::fs::write(&bad, "{ not json").unwrap();
    f.options.push(OPT_SETTINGS, bad.to_str().unwrap());
    let witness = f.root.join("ran");
    let ev = run(
        &f,
        f.spec_os(
            vec!["/usr/bin/touch".into(), witness.clone().into_os_string()],
            true,
        ),
    );
    assert_eq!(ev.exit.code, Some(1), "stderr: {}", stderr_of(&f));
    assert!(
        matches!(ev.failure, Some(FailureKind::WrapperSetupFailed { .. })),
        "{:?}",
        ev.failure
    );
    assert!(!witness.exists());
    assert_eq!(ev.wrapper.unwrap()["exit_attribution"], "wrapper");
}

#[test]
fn real_srt_with_no_options_protects_denied_paths_the_store_and_the_outside() {
    if real_srt("real_srt_with_no_options").is_none() {
        return;
    }
    let f = Fixture::bare();
    std::fs::write(f.root.join(".env"), "SECRET=1\n").unwrap();
    let env_before = sha256_file(&f.root.join(".env"));
    let outside = f.dir.path().join("outside.txt");
    // Each attempt in its own `sh -c` so one refusal does not stop the others.
    let script = format!(
        "echo ok > allowed.txt; (echo x > .env); (mkdir -p secrets && echo x > secrets/k); \
         (echo x > .agentdiff/forged); (echo x > '{}'); (mkdir -p .git/hooks && echo x > \
         .git/hooks/pre-commit); exit 0",
        outside.display()
    );
    let mut spec = f.spec_os(vec!["/bin/sh".into(), "-c".into(), script.into()], true);
    spec.deny_patterns = vec![".env".into(), "secrets/**".into()];
    let ev = run(&f, spec);
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    assert!(f.root.join("allowed.txt").exists(), "inside write");
    assert_eq!(sha256_file(&f.root.join(".env")), env_before, ".env");
    assert!(
        !f.root.join("secrets/k").exists(),
        "denied path not yet existing"
    );
    assert!(!f.root.join(".agentdiff/forged").exists(), "evidence store");
    assert!(!outside.exists(), "outside the root");
    assert!(!f.root.join(".git/hooks/pre-commit").exists(), ".git");
    let w = ev.wrapper.unwrap();
    assert_eq!(w["settings"]["source"], "generated_from_policy");
    assert_eq!(w["settings"]["bridge"]["policy_source"], "run_policy");
    assert_eq!(w["settings"]["bridge"]["controls"], "requested");
    assert_eq!(ev.capabilities.filesystem_writes, Level::Requested);
}

/// A shell call under srt cannot rewrite the configuration later runs read: the policy, or
/// Claude Code's project settings (where `disableAllHooks` would switch agentdiff's hooks off).
#[test]
fn real_srt_command_cannot_change_the_configuration_later_runs_read() {
    if real_srt("real_srt_command_cannot_change_the_configuration").is_none() {
        return;
    }
    let f = Fixture::bare();
    std::fs::write(f.root.join("agentdiff.yaml"), "version: 2\n").unwrap();
    std::fs::create_dir(f.root.join(".claude")).unwrap();
    std::fs::write(f.root.join(".claude/settings.json"), "{}\n").unwrap();
    let script = "(echo '{\"disableAllHooks\": true}' > .claude/settings.local.json); \
                  (echo 'x: 1' >> agentdiff.yaml); (echo '{}' > .claude/settings.json); \
                  echo ok > allowed.txt; exit 0";
    let spec = f.spec_os(vec!["/bin/sh".into(), "-c".into(), script.into()], true);
    let ev = run(&f, spec);
    assert_eq!(ev.exit.code, Some(0), "stderr: {}", stderr_of(&f));
    assert!(f.root.join("allowed.txt").exists(), "inside write");
    assert!(!f.root.join(".claude/settings.local.json").exists());
    assert_eq!(
        std::fs::read_to_string(f.root.join("agentdiff.yaml")).unwrap(),
        "version: 2\n"
    );
    assert_eq!(
        std::fs::read_to_string(f.root.join(".claude/settings.json")).unwrap(),
        "{}\n"
    );
}

#[test]
fn real_srt_timeout_ends_the_whole_tree() {
    if real_srt("real_srt_timeout_ends_the_whole_tree").is_none() {
        return;
    }
    let mut f = Fixture::bare();
    let settings = settings_allowing_only(f.dir.path(), &f.root);
    f.options.push(OPT_SETTINGS, settings.to_str().unwrap());
    // A distinctive sleep so that a leftover can be searched for afterwards.
    let marker = format!(
        "{}.{}",
        3000 + std::process::id() % 1000,
        std::process::id()
    );
    let mut spec = f.spec_os(
        vec!["/bin/sleep".into(), OsString::from(marker.clone())],
        true,
    );
    spec.timeout = Some(std::time::Duration::from_secs(3));
    let ev = run(&f, spec);
    assert!(ev.exit.timed_out, "{:?}", ev.exit);
    assert_eq!(ev.wrapper.unwrap()["command_started"], true);
    let leftovers = std::process::Command::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .unwrap();
    assert!(
        leftovers.stdout.is_empty(),
        "a sandboxed process outlived the run: {}",
        String::from_utf8_lossy(&leftovers.stdout)
    );
}

#[test]
fn doctor_reports_the_real_srt_and_its_prerequisites() {
    let Some(srt) = real_srt("doctor_reports_the_real_srt") else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = rt.block_on(agentdiff_backend_srt::doctor_report(None));
    assert!(report.sandbox_runtime_cli_detected);
    assert_eq!(report.srt.path.as_deref(), Some(srt.as_path()));
    assert!(report.srt.version.is_some(), "{:?}", report.srt);
    assert!(report.prerequisites.iter().all(|p| p.found()));
    assert!(!report.sandboxed && !report.network_enforcement);
    assert_eq!(report.enforcement.as_str(), "external_sandbox_requested");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["capabilities"]["filesystem_writes"], "requested");
    if report.ready {
        let avail = report.availability();
        let agentdiff_backend_api::Availability::Ready { detail } = avail else {
            panic!("{avail:?}")
        };
        assert!(detail.contains("not verified"), "{detail}");
    } else {
        // Namespaces refused here: the report must say so and what to do.
        assert!(!report.remedies.is_empty(), "{json}");
    }
}
