//! The client against recording fake plugins (POSIX shell scripts speaking the protocol on fds
//! 3 and 4): each misbehaviour is a clear error and a run fails closed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use agentdiff_backend_api::{
    BackendError, BackendOptions, EnvironmentPlan, LaunchContext, LaunchSpec, RuntimeBackend,
    StdioMode,
};

const CAPS: &str = r#"{"filesystem_writes":"uncontrolled","host_repository":"observed","network":"uncontrolled","processes":"observed","resources":"uncontrolled","privileges":"uncontrolled","environment":"observed","sandboxed":false,"network_enforcement":false,"workspace":"in_place"}"#;

/// A fake plugin whose behaviour is chosen by `mode`; every request line is appended to
/// `record`. Settings are written into the script, so no test changes its own environment.
fn fake_script(mode: &str, record: &Path, extra: &[(&str, String)]) -> String {
    let mut prelude = format!("mode={mode}\nFAKE_RECORD='{}'\n", record.display());
    for (k, v) in extra {
        prelude.push_str(&format!("{k}='{v}'\n"));
    }
    let caps_filtered = CAPS.replace(r#""network":"uncontrolled""#, r#""network":"filtered""#);
    let caps_enforced = CAPS.replace(
        r#""filesystem_writes":"uncontrolled""#,
        r#""filesystem_writes":"enforced""#,
    );
    format!(
        r#"#!/bin/sh
{prelude}
say() {{ printf '%s\n' "$1" >&4; }}
start_of() {{ cut -d' ' -f22 "/proc/$1/stat"; }}
while IFS= read -r line <&3; do
  printf '%s\n' "$line" >> "$FAKE_RECORD"
  case "$line" in
  *'"type":"hello"'*)
    case "$mode" in
    version) say '{{"type":"hello","protocol":99,"id":"fake"}}' ;;
    unknown) say '{{"type":"telemetry","data":1}}' ;;
    silent) sleep 5 ;;
    gone)
      # Ends its request channel before answering: the next request meets a closed pipe.
      exec 3<&-
      say '{{"type":"hello","protocol":1,"id":"fake"}}'
      sleep 0.2; exit 3 ;;
    oversized) head -c 5000000 /dev/zero | tr '\0' x >&4; say '' ;;
    v2*) say '{{"type":"hello","protocol":2,"id":"fake"}}' ;;
    *) say '{{"type":"hello","protocol":1,"id":"fake"}}' ;;
    esac ;;
  *'"type":"describe"'*)
    say '{{"type":"descriptor","id":"fake","summary":"a fake","options":[{{"name":"level","type":"choice","choices":["a","b"],"help":"h"}}],"fail_closed":[{{"name":"broken","set":[["level","b"]]}}]}}' ;;
  *'"type":"capabilities"'*) say '{{"type":"capabilities","capabilities":{CAPS}}}' ;;
  *'"type":"prepare"'*)
    case "$mode" in
    *routed) say '{{"type":"prepared","command":{{"program":"/bin/sh","args":["-c","exit 7"],"env":[],"cwd":"/"}},"wrapped":true,"egress_routed":true}}' ;;
    *) say '{{"type":"prepared","command":{{"program":"/bin/sh","args":["-c","exit 7"],"env":[],"cwd":"/"}},"wrapped":true}}' ;;
    esac ;;
  *'"type":"launch"'*)
    case "$mode" in
    stranger)
      say "{{\"type\":\"launched\",\"pid\":$FAKE_PID,\"start_time_ticks\":$FAKE_START}}"
      read -r ack <&3; sleep 5 ;;
    hasty)
      # Reaps its command and ends its request channel before answering, as a plugin may that
      # does not wait for `ack`: the ack meets a closed pipe, and `exited` is already written.
      sleep 0.1 & pid=$!; start=$(start_of $pid); wait $pid
      exec 3<&-
      say "{{\"type\":\"launched\",\"pid\":$pid,\"start_time_ticks\":$start}}"
      say '{{"type":"exited","report":{{"exit":{{"code":7,"signal":null,"timed_out":false,"interrupted_by":null,"duration_ms":5}},"capabilities":{CAPS}}}}}'
      exit 0 ;;
    vanish)
      # Starts the command, then ends before it says so.
      sleep 30 & echo $! > "$FAKE_RECORD.pid"; exit 9 ;;
    die)
      sleep 30 & pid=$!
      say "{{\"type\":\"launched\",\"pid\":$pid,\"start_time_ticks\":$(start_of $pid)}}"
      echo "$pid" > "$FAKE_RECORD.pid"
      read -r ack <&3; exit 9 ;;
    *)
      sleep 1 & pid=$!
      say "{{\"type\":\"launched\",\"pid\":$pid,\"start_time_ticks\":$(start_of $pid)}}"
      read -r ack <&3; printf '%s\n' "$ack" >> "$FAKE_RECORD"
      wait $pid
      case "$mode" in
      overclaim) caps='{caps_enforced}' ;;
      v2routed) caps='{caps_filtered}' ;;
      *) caps='{CAPS}' ;;
      esac
      say "{{\"type\":\"exited\",\"report\":{{\"exit\":{{\"code\":7,\"signal\":null,\"timed_out\":false,\"interrupted_by\":null,\"duration_ms\":5}},\"capabilities\":$caps,\"facts\":{{\"tool\":\"fake\"}}}}}}" ;;
    esac ;;
  *) say '{{"type":"error","kind":"protocol","message":"unknown request"}}' ;;
  esac
done
"#
    )
}

struct Fake {
    dir: tempfile::TempDir,
    plugin: Plugin,
}

impl Fake {
    fn new(mode: &str) -> Self {
        Self::with(mode, &[])
    }

    fn with(mode: &str, extra: &[(&str, String)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentdiff-backend-fake");
        let record = dir.path().join("record");
        agentdiff_test_support::write_executable(&path, &fake_script(mode, &record, extra), 0o755);
        // The default timeouts: a shell plugin's start on a loaded machine is part of the first
        // request's time. The one test about a timeout sets its own.
        let plugin = Plugin {
            id: "fake".into(),
            path,
            timeouts: Timeouts::default(),
        };
        Self { dir, plugin }
    }

    fn record(&self) -> PathBuf {
        self.dir.path().join("record")
    }

    fn recorded(&self) -> Vec<String> {
        std::fs::read_to_string(self.record())
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn backend(&self) -> ExternalBackend {
        ExternalBackend::new("fake", self.plugin.clone(), false)
    }
}

fn spec(dir: &Path) -> LaunchSpec {
    LaunchSpec {
        run_id: "r1".into(),
        root: dir.to_path_buf(),
        workdir: dir.to_path_buf(),
        capsule_dir: dir.join("capsule"),
        argv: vec!["true".into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        env_plan: EnvironmentPlan::default(),
        timeout: Some(Duration::from_secs(20)),
        grace: Duration::from_millis(200),
        poll_interval: Duration::from_millis(10),
        observe_ports: false,
        options: BackendOptions::new(),
        deny_patterns: Vec::new(),
        git_dirs: Vec::new(),
        egress_proxy: None,
    }
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Launch through the fake and wait, all under one environment.
fn launch_and_wait(
    fake: &Fake,
) -> agentdiff_backend_api::Result<agentdiff_backend_api::RunEvidence> {
    launch_spec_and_wait(fake, &spec(fake.dir.path()))
}

fn launch_spec_and_wait(
    fake: &Fake,
    spec: &LaunchSpec,
) -> agentdiff_backend_api::Result<agentdiff_backend_api::RunEvidence> {
    let backend = fake.backend();
    let prepared = backend.prepare(spec)?;
    block(async {
        let running = backend
            .launch(prepared, LaunchContext::new(StdioMode::Inherit))
            .await?;
        running.wait().await
    })
}

#[test]
fn describe_builds_a_descriptor_and_records_the_exchange() {
    let fake = Fake::new("ok");
    let ext = describe(&fake.plugin).unwrap();
    assert_eq!(ext.descriptor.id, "fake");
    assert_eq!(ext.descriptor.summary, "a fake");
    let level = ext.descriptor.option("level").unwrap();
    assert!(level.rejects("c").is_some());
    assert!(level.rejects("a").is_none());
    assert_eq!(ext.descriptor.fail_closed[0].set, &[("level", "b")]);
    let rec = fake.recorded();
    assert_eq!(
        rec,
        [
            r#"{"type":"hello","protocol":1,"protocols":[1,2]}"#,
            r#"{"type":"describe"}"#
        ]
    );
}

#[test]
fn a_version_mismatch_names_both_versions() {
    let fake = Fake::new("version");
    let err = describe(&fake.plugin).unwrap_err();
    assert!(matches!(err, ExternalError::Version { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("[1, 2]") && text.contains("99"), "{text}");
    assert!(text.contains("agentdiff-backend-fake"), "{text}");
}

#[test]
fn an_unknown_message_type_ends_the_exchange() {
    let fake = Fake::new("unknown");
    let err = describe(&fake.plugin).unwrap_err();
    assert!(matches!(err, ExternalError::Protocol { .. }), "{err}");
    assert!(err.to_string().contains("telemetry"), "{err}");
}

#[test]
fn an_oversized_message_is_refused() {
    let mut fake = Fake::new("oversized");
    // Producing 5 MB through `tr` is slow on a loaded machine; the limit is what is tested.
    fake.plugin.timeouts.request = Duration::from_secs(30);
    let err = describe(&fake.plugin).unwrap_err();
    assert!(err.to_string().contains("larger than"), "{err}");
}

#[test]
fn a_silent_plugin_times_out() {
    let mut fake = Fake::new("silent");
    fake.plugin.timeouts.request = Duration::from_millis(300);
    let t = std::time::Instant::now();
    let err = describe(&fake.plugin).unwrap_err();
    assert!(matches!(err, ExternalError::Timeout { .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
}

#[test]
fn a_run_passes_the_exit_code_and_labels_the_evidence_as_external() {
    let fake = Fake::new("ok");
    let ev = launch_and_wait(&fake).unwrap();
    assert_eq!(ev.exit.code, Some(7));
    assert_eq!(ev.backend, "fake");
    let wrapper = ev.wrapper.unwrap();
    let origin = &wrapper["external_backend"];
    assert_eq!(origin["protocol"], 1);
    assert_eq!(origin["facts"]["tool"], "fake");
    assert!(origin["path"]
        .as_str()
        .unwrap()
        .ends_with("agentdiff-backend-fake"));
    assert_eq!(ev.wrapper_argv.unwrap()[0], "/bin/sh");
    // The launch was acknowledged only after the identity check.
    let rec = fake.recorded();
    assert!(rec.iter().any(|l| l == r#"{"type":"ack"}"#), "{rec:?}");
}

#[test]
fn a_plugin_that_exits_before_the_ack_still_has_its_exit_report_read() {
    let fake = Fake::new("hasty");
    let ev = launch_and_wait(&fake).unwrap();
    assert_eq!(ev.exit.code, Some(7));
    let wrapper = ev.wrapper.unwrap();
    // Reaped before agentdiff looked: the evidence says the check could not be made.
    assert_eq!(
        wrapper["external_backend"]["launched_process"], "ended_before_check",
        "{wrapper:?}"
    );
}

#[test]
fn a_plugin_that_ends_between_the_launch_request_and_its_answer_may_have_run_the_command() {
    let fake = Fake::new("vanish");
    let err = launch_and_wait(&fake).unwrap_err();
    // Not a refusal: the transaction captures and classifies what the command may have done.
    assert!(matches!(err, BackendError::Runtime { .. }), "{err}");
    assert!(err.to_string().contains("may have run"), "{err}");
    let pid: u32 = std::fs::read_to_string(fake.record().with_extension("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A plugin that ended on its own left its command to init before agentdiff could see it:
    // that process is not found here (docs/backend-protocol.md says so); the test ends it.
    if agentdiff_process::read_stat(pid).is_ok_and(|s| s.comm == "sleep") {
        // SAFETY: kill(2) on the test's own leftover `sleep`, checked by name just above.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

#[test]
fn a_request_to_a_plugin_that_closed_its_channel_names_its_exit() {
    let fake = Fake::new("gone");
    let err = fake.backend().prepare(&spec(fake.dir.path())).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("exit status: 3"), "{text}");
    assert!(!text.contains("Broken pipe"), "{text}");
}

#[test]
fn a_pid_that_is_not_the_plugins_child_is_a_lost_launch_and_unsignalled() {
    // Our own parent: alive, and certainly not launched by the plugin.
    let me = agentdiff_process::read_stat(std::process::id()).unwrap();
    let victim = agentdiff_process::read_stat(me.ppid).unwrap();
    let fake = Fake::with(
        "stranger",
        &[
            ("FAKE_PID", victim.pid.to_string()),
            ("FAKE_START", victim.start_time_ticks.to_string()),
        ],
    );
    let err = launch_and_wait(&fake).unwrap_err();
    // A lost launch (the command may have run), not a refusal: the engine captures the after-state.
    assert!(matches!(err, BackendError::Runtime { .. }), "{err}");
    assert!(err.to_string().contains("not a descendant"), "{err}");
    assert!(err.to_string().contains("may have run"), "{err}");
    assert!(err.to_string().contains("was not signalled"), "{err}");
    assert!(agentdiff_process::read_stat(victim.pid).is_ok());
}

#[test]
fn a_plugin_dying_mid_run_fails_closed_and_its_command_is_ended() {
    let fake = Fake::new("die");
    let err = launch_and_wait(&fake).unwrap_err();
    assert!(matches!(err, BackendError::Runtime { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("exited") && text.contains("fails closed"),
        "{text}"
    );
    let pid: u32 = std::fs::read_to_string(fake.record().with_extension("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The orphaned `sleep 30` was ended (gone, or a zombie awaiting its new parent).
    if let Ok(s) = agentdiff_process::read_stat(pid) {
        assert!(s.is_zombie() || s.comm != "sleep", "{s:?}");
    }
}

#[test]
fn an_exit_report_claiming_more_than_declared_fails_the_run() {
    let fake = Fake::new("overclaim");
    let err = launch_and_wait(&fake).unwrap_err();
    assert!(
        err.to_string().contains("filesystem_writes `enforced`"),
        "{err}"
    );
}

#[test]
fn queries_of_one_backend_share_one_plugin_process() {
    let fake = Fake::new("ok");
    let backend = fake.backend();
    backend.prepare(&spec(fake.dir.path())).unwrap();
    let _ = backend.capabilities(&BackendOptions::new());
    let rec = fake.recorded();
    let hellos = rec
        .iter()
        .filter(|l| l.contains(r#""type":"hello""#))
        .count();
    assert_eq!(hellos, 1, "{rec:?}");
    assert!(
        rec.iter().any(|l| l.contains(r#""type":"prepare""#)),
        "{rec:?}"
    );
    // An unknown request type gets an error answer: the process stays usable.
    drop(backend);
}

fn with_proxy(dir: &Path) -> LaunchSpec {
    let mut s = spec(dir);
    s.egress_proxy = Some(dir.join("egress.sock"));
    s
}

#[test]
fn a_protocol_2_plugin_given_the_proxy_that_routes_through_it_is_labelled_filtered() {
    let fake = Fake::new("v2routed");
    let ev = launch_spec_and_wait(&fake, &with_proxy(fake.dir.path())).unwrap();
    assert_eq!(
        ev.capabilities.network,
        agentdiff_backend_api::Level::Filtered
    );
    let facts: ExternalFacts = ev.wrapper.unwrap().decode().unwrap();
    assert_eq!(facts.external_backend.protocol, 2);
    // Both the prepare and the launch carried the socket.
    let sent = fake.recorded();
    let with_socket = sent
        .iter()
        .filter(|l| l.contains(r#""egress_proxy":""#) && l.contains("egress.sock"))
        .count();
    assert_eq!(with_socket, 2, "{sent:#?}");
}

#[test]
fn a_routed_claim_without_the_socket_or_from_protocol_1_is_refused() {
    // Protocol 2, but the run has no proxy.
    let fake = Fake::new("v2routed");
    let err = fake.backend().prepare(&spec(fake.dir.path())).unwrap_err();
    assert!(err.to_string().contains("given none"), "{err}");
    // Protocol 1: never given the socket (not even in the message), so it cannot route.
    let fake = Fake::new("v1routed");
    let err = fake
        .backend()
        .prepare(&with_proxy(fake.dir.path()))
        .unwrap_err();
    assert!(err.to_string().contains("protocol 1"), "{err}");
    assert!(
        !fake.recorded().iter().any(|l| l.contains("egress_proxy")),
        "{:#?}",
        fake.recorded()
    );
}

#[test]
fn a_protocol_1_plugin_works_as_before_with_the_proxy_in_the_run() {
    let fake = Fake::new("ok");
    let ev = launch_spec_and_wait(&fake, &with_proxy(fake.dir.path())).unwrap();
    assert_eq!(ev.exit.code, Some(7));
    assert_ne!(
        ev.capabilities.network,
        agentdiff_backend_api::Level::Filtered
    );
    let facts: ExternalFacts = ev.wrapper.unwrap().decode().unwrap();
    assert_eq!(facts.external_backend.protocol, 1);
    assert!(!fake.recorded().iter().any(|l| l.contains("egress_proxy")));
}
