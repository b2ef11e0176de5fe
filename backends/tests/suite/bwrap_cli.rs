//! `agentdiff run --runtime bwrap` end to end with the real bubblewrap: what the sandbox lets
//! through and what it refuses, the evidence, and the fail-closed paths.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// `true` (and the test returns) when bwrap is missing here and the skip rule allows it.
pub(super) fn no_bwrap() -> bool {
    let works = Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "--unshare-net", "--", "true"])
        .output()
        .is_ok_and(|o| o.status.success());
    !works && agentdiff_conformance::skip_unless_required("bwrap is not installed or cannot start")
}

/// A project in $TMPDIR and a home outside it (so `$HOME` is a real host location), with a key
/// in `~/.ssh`.
pub(super) struct Fixture {
    pub(super) project: tempfile::TempDir,
    pub(super) home: tempfile::TempDir,
}

impl Fixture {
    pub(super) fn new() -> Fixture {
        Fixture::new_in(&std::env::temp_dir())
    }

    /// The project in a new directory below `parent`.
    pub(super) fn new_in(parent: &Path) -> Fixture {
        let project = tempfile::tempdir_in(parent).unwrap();
        fs::write(project.path().join("a.txt"), "a\n").unwrap();
        fs::create_dir_all(project.path().join(".git")).unwrap();
        fs::write(project.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
        let home = tempfile::Builder::new()
            .prefix("agentdiff-bwrap-home-")
            .tempdir_in("/var/tmp")
            .unwrap();
        fs::create_dir_all(home.path().join(".ssh")).unwrap();
        fs::write(home.path().join(".ssh/id_test"), "PRIVATE-KEY-CANARY\n").unwrap();
        Fixture { project, home }
    }

    pub(super) fn root(&self) -> &Path {
        self.project.path()
    }

    /// Writes the project's `agentdiff.yaml`.
    pub(super) fn write_policy(&self, yaml: impl AsRef<str>) {
        fs::write(self.root().join("agentdiff.yaml"), yaml.as_ref()).unwrap();
    }

    pub(super) fn run(
        &self,
        extra: &[&str],
        argv: &[&str],
        env: &[(&str, &str)],
    ) -> (i32, Value, Output) {
        let mut cmd = super::cmd(
            self.root(),
            &["run", "--runtime", "bwrap", "--format", "json"],
        );
        cmd.args(extra)
            .arg("--")
            .args(argv)
            .env("HOME", self.home.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code().unwrap_or(-1), json, out)
    }

    pub(super) fn runtime_json(&self, result: &Value) -> Value {
        let id = result["run_id"].as_str().unwrap();
        let path = self
            .root()
            .join(".agentdiff/runs")
            .join(id)
            .join("runtime.json");
        serde_json::from_str(&fs::read_to_string(path).unwrap()).unwrap()
    }
}

/// A host loopback listener. A connection made during the run waits in its accept queue (the
/// kernel completes the handshake before the client's `connect` returns), so one non-blocking
/// accept after the run tells whether anything connected: no thread, no sleep, no race.
pub(super) struct Listener(TcpListener);

impl Listener {
    pub(super) fn new() -> Listener {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        Listener(l)
    }

    pub(super) fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }

    pub(super) fn was_connected(&self) -> bool {
        match self.0.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("accept: {e}"),
        }
    }
}

#[test]
fn bwrap_confines_writes_reads_and_network_and_records_the_change() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let token = format!("{}", std::process::id());
    let var_tmp = PathBuf::from(format!("/var/tmp/agentdiff-bwrap-probe-{token}"));
    let home_file = f.home.path().join("written-by-command");
    let listener = Listener::new();
    let port = listener.port();
    // Each attempt reports ok/fail into report.txt inside the root.
    let script = r#"
r=report.txt
try() { name=$1; shift; if "$@" 2>/dev/null; then echo "$name=ok" >> $r; else echo "$name=fail" >> $r; fi; }
try inside sh -c 'echo new > inside.txt'
try var_tmp sh -c "echo x > $VAR_TMP"
try home sh -c "echo x > $HOME_FILE"
try git sh -c 'echo x > .git/injected'
try store sh -c 'mkdir -p .agentdiff/x && echo x > .agentdiff/x/y'
try ssh_read sh -c 'cat "$HOME/.ssh/id_test" | grep -q PRIVATE-KEY-CANARY'
try loopback bash -c "echo hi > /dev/tcp/127.0.0.1/$PORT"
exit 0
"#;
    // The variables are not on the allowlist: name them so they pass the scrub.
    let (code, result, out) = f.run(
        &[
            "--pass-env",
            "VAR_TMP",
            "--pass-env",
            "HOME_FILE",
            "--pass-env",
            "PORT",
        ],
        &["sh", "-c", script],
        &[
            ("VAR_TMP", var_tmp.to_str().unwrap()),
            ("HOME_FILE", home_file.to_str().unwrap()),
            ("PORT", &port.to_string()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(code, 69, "{stderr}");
    let report = fs::read_to_string(f.root().join("report.txt"))
        .unwrap_or_else(|e| panic!("no report ({e}); code {code}; stderr {stderr}"));
    let _ = fs::remove_file(&var_tmp);
    for line in [
        "inside=ok",
        "var_tmp=fail",
        "home=fail",
        "git=fail",
        "store=fail",
        "ssh_read=fail",
        "loopback=fail",
    ] {
        assert!(
            report.contains(line),
            "{line} not in {report}; stderr {stderr}"
        );
    }
    assert!(
        !listener.was_connected(),
        "a connection reached the host listener"
    );
    assert!(!home_file.exists());
    assert!(!f.root().join(".git/injected").exists());
    // The change inside the root is recorded.
    let changes = result["changes"].as_array().unwrap();
    assert!(
        changes.iter().any(|c| c["path"] == "inside.txt"),
        "{result:#}"
    );
    let rt = f.runtime_json(&result);
    assert_eq!(rt["capabilities"]["sandboxed"], true, "{rt:#}");
    for (boundary, level) in [
        ("filesystem_writes", "enforced"),
        ("network", "enforced"),
        ("processes", "enforced"),
        ("privileges", "enforced"),
        ("environment", "enforced"),
        ("host_repository", "observed"),
        ("resources", "uncontrolled"),
    ] {
        assert_eq!(rt["capabilities"][boundary], level, "{boundary}: {rt:#}");
    }
    assert_eq!(rt["wrapper"]["command_started"], true);
    assert_eq!(
        rt["wrapper"]["controls"]["credentials"]["level"],
        "enforced"
    );
    // The recorded wrapper argv is the one that ran: no option of bwrap's own is redacted.
    let argv: Vec<&str> = rt["wrapper_argv"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let at = argv.iter().position(|w| *w == "--new-session").unwrap();
    assert_eq!(argv[at + 1..at + 3], ["--cap-drop", "ALL"], "{argv:?}");
    assert_eq!(rt["environment"]["mode"], "scrub");
}

#[test]
fn bwrap_scrubs_the_environment_and_passes_only_named_variables() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let script = "env > seen.txt";
    let env = [
        ("MY_API_TOKEN", "tok-secret"),
        ("OTHER_SETTING", "plain"),
        ("NODE_OPTIONS", "--require /x.js"),
    ];
    let (code, _, out) = f.run(
        &["--pass-env", "MY_API_TOKEN", "--pass-env", "NODE_OPTIONS"],
        &["sh", "-c", script],
        &env,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let seen = fs::read_to_string(f.root().join("seen.txt")).unwrap();
    assert!(seen.contains("MY_API_TOKEN=tok-secret"), "{seen}");
    assert!(!seen.contains("OTHER_SETTING"), "{seen}");
    // Runtime-injection variables are dropped even when named.
    assert!(!seen.contains("NODE_OPTIONS"), "{seen}");
    assert!(!seen.contains("ARGV_DIGEST"), "{seen}");
    let (_, _, _) = f.run(&[], &["sh", "-c", script], &env);
    let seen = fs::read_to_string(f.root().join("seen.txt")).unwrap();
    assert!(!seen.contains("MY_API_TOKEN"), "{seen}");
}

#[test]
fn bwrap_exit_1_of_the_command_is_the_commands_and_a_setup_failure_is_not() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let (code, result, _) = f.run(&[], &["sh", "-c", "exit 1"], &[]);
    assert_eq!(code, 1);
    assert_eq!(
        f.runtime_json(&result)["wrapper"]["exit_attribution"],
        "command"
    );

    // A bwrap whose setup fails: exits 1 without starting anything.
    let fake = f.home.path().join("fake-bwrap");
    agentdiff_test_support::write_executable(
        &fake,
        "#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n",
        0o755,
    );
    let opt = format!("bwrap-executable={}", fake.display());
    let (code, result, out) = f.run(
        &["--backend-option", &opt],
        &["sh", "-c", "echo ran > ran.txt"],
        &[],
    );
    assert_eq!(code, 69, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!f.root().join("ran.txt").exists());
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["exit_attribution"], "wrapper", "{rt:#}");
    assert_eq!(rt["capabilities"]["sandboxed"], false);
    let failure = rt["failure"].to_string();
    assert!(
        failure.contains("bwrap exited with code 1 before the command started"),
        "{failure}"
    );
}

/// bwrap's own pid-1 init outlives the outer bwrap by a moment; for a short command it is
/// usually first seen already re-parented to agentdiff. It is the sandbox's process: a run of
/// `true` leaves nothing behind and scores nothing for leftovers, however the race goes.
#[test]
fn the_sandbox_init_is_never_a_leftover_of_the_command() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    for round in 0..8 {
        let (code, result, out) = f.run(&[], &["true"], &[]);
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(
            result["summary"]["leftover_processes"], 0,
            "round {round}: {result:#}"
        );
        let rt = f.runtime_json(&result);
        let leftovers: Vec<&Value> = rt["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["alive_after_root_exit"] == true)
            .collect();
        assert!(leftovers.is_empty(), "round {round}: {rt:#}");
        // When the init was seen at all, the wrapper evidence says what became of it.
        let bwraps = rt["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["executable"] == "bwrap")
            .count();
        if bwraps > 1 {
            assert!(
                rt["wrapper"]["sandbox_init"].is_object(),
                "round {round}: {rt:#}"
            );
        }
    }
}

#[test]
fn without_bwrap_on_path_the_command_does_not_run_and_bubblewrap_is_named() {
    let f = Fixture::new();
    let empty = tempfile::tempdir().unwrap();
    let out = super::cmd(
        f.root(),
        &[
            "run",
            "--runtime",
            "bwrap",
            "--",
            "/bin/sh",
            "-c",
            "echo ran > ran.txt",
        ],
    )
    .env("PATH", empty.path())
    .env("HOME", f.home.path())
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("bubblewrap"), "{stderr}");
    assert!(stderr.contains("apt-get install -y bubblewrap"), "{stderr}");
    assert!(!f.root().join("ran.txt").exists());
}

#[test]
fn host_network_from_the_policy_is_labelled_uncontrolled() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    f.write_policy("version: 2\nruntime:\n  bwrap:\n    network: host\n");
    let listener = Listener::new();
    let port = listener.port();
    let script = format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}'");
    let (code, result, out) = f.run(&[], &["sh", "-c", &script], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(listener.was_connected(), "the host network was asked for");
    let rt = f.runtime_json(&result);
    assert_eq!(rt["capabilities"]["network"], "uncontrolled", "{rt:#}");
    assert_eq!(rt["capabilities"]["network_enforcement"], false);
    assert_eq!(rt["capabilities"]["filesystem_writes"], "enforced");
}

#[test]
fn listeners_are_observed_on_the_host_network_and_not_claimed_in_the_sandboxs_own() {
    if no_bwrap() {
        return;
    }
    let listen = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); \
                  s.listen(); print(s.getsockname()[1], flush=True); time.sleep(1.5)";
    let f = Fixture::new();
    // The network unshared (the default): the host's socket tables cannot show the command's
    // listener, so no snapshot is taken and the evidence says why instead of "none opened".
    let (code, result, out) = f.run(&[], &["python3", "-c", listen], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let ports = &f.runtime_json(&result)["ports"];
    assert_eq!(ports["mode"], "off", "{ports:#}");
    assert!(
        ports["note"]
            .as_str()
            .unwrap()
            .contains("own network namespace"),
        "{ports:#}"
    );
    assert_eq!(ports["opened"], serde_json::json!([]), "{ports:#}");

    // The host network: the listener is the host's, and observed as the run's.
    f.write_policy("version: 2\nruntime:\n  bwrap:\n    network: host\n");
    let (code, result, out) = f.run(&[], &["python3", "-c", listen], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let port: u64 = String::from_utf8_lossy(&out.stderr)
        .lines()
        .find_map(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no port printed: {}", String::from_utf8_lossy(&out.stderr)));
    let ports = &f.runtime_json(&result)["ports"];
    assert_eq!(ports["mode"], "observe", "{ports:#}");
    let opened = ports["opened"].as_array().unwrap();
    assert!(
        opened
            .iter()
            .any(|p| p["port"] == port && p["attributed"] == true),
        "port {port} not among {ports:#}"
    );
}

/// `dirs` directories `d0…` of `per_dir` small files `f0.txt…` each, below `root`.
fn many_files(root: &Path, dirs: usize, per_dir: usize) {
    for d in 0..dirs {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for i in 0..per_dir {
            fs::write(dir.join(format!("f{i}.txt")), format!("{d} {i}\n")).unwrap();
        }
    }
}

/// The FIFOs of the capsule (the start marker and gate are removed when the run ends).
fn fifos_in(dir: &Path) -> Vec<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_fifo()))
        .map(|e| e.path())
        .collect()
}

/// bwrap is started before the before-capture so that its setup overlaps it, with the command
/// held at the start gate: the command must find the before-state and the `launched` event
/// already recorded, however long the capture takes, or its first writes could hide in the
/// before-state.
#[test]
fn the_command_starts_only_after_the_before_state_is_recorded() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    // A tree whose capture takes far longer than bwrap's setup.
    many_files(f.root(), 30, 100);
    let script = "cat .agentdiff/runs/*/events.jsonl > seen.txt; echo x >> d0/f0.txt";
    let (code, result, out) = f.run(&[], &["sh", "-c", script], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let seen: Vec<Value> = fs::read_to_string(f.root().join("seen.txt"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = seen.iter().filter_map(|e| e["event"].as_str()).collect();
    assert!(
        events.contains(&"before_captured") && events.last() == Some(&"launched"),
        "the command started before agentdiff recorded the before-state: {events:?}"
    );
    // Its first write is a recorded change, not part of the before-state.
    let changed = super::changed_paths(&result);
    assert!(changed.iter().any(|p| p == "d0/f0.txt"), "{changed:?}");
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["command_started"], true, "{rt:#}");
    let capsule = f
        .root()
        .join(".agentdiff/runs")
        .join(result["run_id"].as_str().unwrap());
    assert_eq!(fifos_in(&capsule), Vec::<PathBuf>::new());
}

/// A run that stops after bwrap was started but before the release (here `capture.require_backups`
/// with a full object store) never lets the command start: the held sandbox is ended, nothing
/// of the command ran, and no `launched` event, FIFO or bwrap process is left.
#[test]
fn a_held_sandbox_of_a_run_that_stops_before_the_start_runs_nothing() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let root = f.root();
    fs::write(root.join("big.bin"), vec![7u8; 300_000]).unwrap();
    // A first run creates the store whose object directory the full tmpfs then covers.
    let (code, _, out) = f.run(&[], &["true"], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 1\ncapture:\n  require_backups: true\n",
    )
    .unwrap();
    let args = [
        "run",
        "--runtime",
        "bwrap",
        "--",
        "sh",
        "-c",
        "touch ran.txt; rm big.bin",
    ];
    let Some(out) = super::safe_defaults_cli::with_full_object_store(root, &args) else {
        agentdiff_conformance::skip_unless_required("a private tmpfs mount (unshare -m, root)");
        return;
    };
    super::assert_exit(&out, 70);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("capture.require_backups"), "{stderr}");
    assert!(!root.join("ran.txt").exists(), "the command ran");
    assert!(root.join("big.bin").exists(), "the command ran");
    let runs: Vec<PathBuf> = fs::read_dir(root.join(".agentdiff/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let refused = runs
        .iter()
        .find(|r| {
            fs::read_to_string(r.join("result.json")).is_ok_and(|t| t.contains("require_backups"))
        })
        .unwrap_or_else(|| panic!("no run refused for the backups: {runs:?}"));
    let events = fs::read_to_string(refused.join("events.jsonl")).unwrap();
    assert!(!events.contains("\"launched\""), "{events}");
    assert_eq!(fifos_in(refused), Vec::<PathBuf>::new());
    // The sandbox was ended before agentdiff exited: no process still names the run's capsule.
    let capsule = refused.display().to_string();
    let left: Vec<String> = fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&capsule))
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

/// agentdiff interrupted (SIGTERM) while it captures the tree, with bwrap already started and
/// held: the command is never released, and the run reads as interrupted before the start (exit
/// 143), not as bwrap's own failure.
#[test]
fn an_interruption_during_the_capture_never_releases_the_held_command() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    // A capture that takes a few hundred milliseconds: 20,000 files to hash.
    many_files(f.root(), 100, 200);
    let child = super::cmd(f.root(), &["run", "--runtime", "bwrap", "--format", "json"])
        .args(["--", "sh", "-c", "echo ran > ran.txt"])
        .env("HOME", f.home.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The capsule exists once the signal handlers are in place; the capture starts after it.
    let runs = f.root().join(".agentdiff/runs");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let capsule = loop {
        let found = fs::read_dir(&runs)
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
            .map(|e| e.path());
        if let Some(dir) = found.filter(|d| d.join("events.jsonl").exists()) {
            break dir;
        }
        assert!(std::time::Instant::now() < deadline, "no capsule appeared");
        std::thread::sleep(std::time::Duration::from_millis(2));
    };
    let events = fs::read_to_string(capsule.join("events.jsonl")).unwrap();
    assert!(
        !events.contains("before_captured"),
        "the capture ended before the signal could be sent; the test cannot tell anything"
    );
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{stderr}");
    assert!(!f.root().join("ran.txt").exists(), "the command ran");
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "terminated", "{result:#}");
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["start_state"], "not_started", "{rt:#}");
    assert_eq!(rt["exit"]["interrupted_by"], 15, "{rt:#}");
    let failure = rt["failure"].to_string();
    assert!(failure.contains("the command never ran"), "{failure}");
}
