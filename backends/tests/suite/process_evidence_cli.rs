//! Process evidence through the real binary: a process that leaves the run cgroup, an exec after
//! a process was first seen, and a container started through an engine during the run. Each
//! attack must yield a recorded finding and leave no process running.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use agentdiff_conformance::skip_unless_required;
use serde_json::Value;

use super::{agentdiff, cmd, run_json, text};

/// `agentdiff run --format json [extra…] -- argv…` → (exit code, result, runtime.json).
fn run(root: &Path, extra: &[&str], argv: &[&str]) -> (i32, Value, Value) {
    let mut args = vec!["--fail-on", "never"];
    args.extend_from_slice(extra);
    let (code, r, _) = run_json(root, &args, argv);
    let id = r["run_id"].as_str().unwrap();
    let rt: Value = serde_json::from_slice(
        &fs::read(root.join(".agentdiff/runs").join(id).join("runtime.json")).unwrap(),
    )
    .unwrap();
    (code, r, rt)
}

fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("a.txt"), "a\n").unwrap();
    d
}

/// A sleep duration nothing else on the machine uses.
fn unique_secs() -> u32 {
    static N: AtomicU32 = AtomicU32::new(0);
    300_000 + (std::process::id() % 1000) * 50 + N.fetch_add(1, Ordering::Relaxed)
}

/// Processes whose command line is exactly `words`.
fn running(words: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args == words {
            out.push(pid);
        }
    }
    out
}

fn assert_gone(words: &[&str]) {
    // Cleanup has finished when agentdiff exits; allow the kernel a moment to reap.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !running(words).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = running(words);
    for pid in &left {
        // SAFETY: test cleanup of a process this test started.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert!(left.is_empty(), "{words:?} survived the run: {left:?}");
}

/// Where cgroup v2 is mounted, when a run cgroup can be created here.
fn cgroup2_mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next() == Some("cgroup2"))
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

fn cgroup_tracking_missing() -> Option<String> {
    let p = project();
    let (_, _, rt) = run(p.path(), &[], &["true"]);
    (rt["tracking"] != "cgroup").then(|| {
        format!(
            "no run cgroup can be created here (tracking {}); needs root and cgroup v2",
            rt["tracking"]
        )
    })
}

fn findings<'a>(r: &'a Value, kind: &str) -> Vec<&'a Value> {
    r["evidence_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .collect()
}

/// The root waits (at most 10 s) until the escapee says it has moved (`moved`), so the escape
/// happens while the run is live whatever the host's load.
const WAIT_MOVED: &str =
    "i=0; while [ ! -e moved ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done";

fn escape_case(tracking: &str, script: impl Fn(&str, &str) -> String) {
    if let Some(reason) = cgroup_tracking_missing() {
        if skip_unless_required(&reason) {
            return;
        }
    }
    let mount = cgroup2_mount().unwrap();
    let secs = unique_secs().to_string();
    let procs = mount.join("cgroup.procs").display().to_string();
    let p = project();
    let (code, r, rt) = run(
        p.path(),
        &["--backend-option", &format!("tracking={tracking}")],
        &["sh", "-c", &script(&procs, &secs)],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(r["status"], "denied", "{r:#}");
    let f = findings(&r, "left_run_cgroup");
    assert!(!f.is_empty(), "{r:#}");
    assert!(f.iter().all(|f| f["action"] == "deny"), "{r:#}");
    let pid = f[0]["process"]["pid"].as_u64().unwrap();
    let rec = rt["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["identity"]["pid"] == pid)
        .unwrap();
    assert!(rec["left_run_cgroup"].is_string(), "{rec:#}");
    assert!(r["summary"]["leftover_processes"].as_u64().unwrap() >= 1);
    assert_gone(&["sleep", &secs]);
}

#[test]
fn a_process_that_leaves_the_run_cgroup_is_denied_and_ended() {
    // The attack as reported: a background shell moves itself out, then execs.
    escape_case("cgroup", |procs, secs| {
        format!("sh -c \"echo \\$\\$ > {procs}; touch moved; exec sleep {secs}\" & {WAIT_MOVED}")
    });
}

#[test]
fn an_escape_whose_parent_exits_at_once_is_still_caught() {
    // The escaping process's parent exits at once: it is only ever an orphan of agentdiff.
    escape_case("cgroup", |procs, secs| {
        format!("(sh -c \"echo \\$\\$ > {procs}; touch moved; exec sleep {secs}\" &); {WAIT_MOVED}")
    });
}

#[test]
fn polling_without_a_cgroup_ends_the_same_escapee() {
    // No run cgroup to leave: nothing to record, but the process is a descendant and is ended.
    let p = project();
    let secs = unique_secs().to_string();
    let procs = cgroup2_mount()
        .map(|m| m.join("cgroup.procs").display().to_string())
        .unwrap_or_else(|| "/dev/null".into());
    let script =
        format!("sh -c \"echo \\$\\$ > {procs}; touch moved; exec sleep {secs}\" & {WAIT_MOVED}");
    let (code, r, rt) = run(
        p.path(),
        &["--backend-option", "tracking=proc_poll"],
        &["sh", "-c", &script],
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(rt["tracking"], "subreaper_proc_poll");
    assert!(findings(&r, "left_run_cgroup").is_empty(), "{r:#}");
    assert!(r["summary"]["leftover_processes"].as_u64().unwrap() >= 1);
    assert_gone(&["sleep", &secs]);
}

#[test]
fn an_escape_that_also_daemonises_is_still_caught() {
    escape_case("cgroup", |procs, secs| {
        format!(
            "sh -c \"echo \\$\\$ > {procs}; setsid sleep {secs} & touch moved; sleep 0.2\" & \
             {WAIT_MOVED}; sleep 0.3"
        )
    });
}

/// A cgroup beside the run cgroup, made by the test and removed when dropped.
struct SiblingCgroup(PathBuf);

impl Drop for SiblingCgroup {
    fn drop(&mut self) {
        // Empty once the run's cleanup ended its member; retried briefly while it exits.
        for _ in 0..100 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

#[test]
fn an_escape_into_another_cgroup_is_caught() {
    // Not only the root cgroup: any cgroup outside the run's is an escape.
    let Some(mount) = cgroup2_mount() else {
        skip_unless_required("cgroup v2 is not mounted here");
        return;
    };
    let sibling =
        SiblingCgroup(mount.join(format!("agentdiff-test-escape-{}", std::process::id())));
    if fs::create_dir(&sibling.0).is_err()
        && skip_unless_required("a cgroup cannot be created here (needs root and cgroup v2)")
    {
        return;
    }
    let target = sibling.0.join("cgroup.procs").display().to_string();
    escape_case("cgroup", |_, secs| {
        format!("sh -c \"echo \\$\\$ > {target}; touch moved; exec sleep {secs}\" & {WAIT_MOVED}")
    });
}

/// Moving into a cgroup the command creates inside the run cgroup, or writing a thread id to the
/// root's `cgroup.threads`, leaves nothing running and no run cgroup behind.
#[test]
fn a_nested_cgroup_or_a_thread_move_leaves_nothing_behind() {
    if let Some(reason) = cgroup_tracking_missing() {
        if skip_unless_required(&reason) {
            return;
        }
    }
    let mount = cgroup2_mount().unwrap();
    let m = mount.display();
    for (name, mv) in [
        (
            "nested",
            "mkdir $cg/inner && echo \\$\\$ > $cg/inner/cgroup.procs".to_owned(),
        ),
        ("threads", format!("echo \\$\\$ > {m}/cgroup.threads")),
    ] {
        let p = project();
        let secs = unique_secs().to_string();
        let script = format!(
            "cg={m}$(sed -n 's/^0:://p' /proc/self/cgroup); echo \"$cg\" > cg.txt; \
             sh -c \"{mv}; touch moved; exec sleep {secs}\" & {WAIT_MOVED}"
        );
        let (code, r, _) = run(p.path(), &[], &["sh", "-c", &script]);
        assert_eq!(code, 0, "{name}: {r:#}");
        assert!(
            r["summary"]["leftover_processes"].as_u64().unwrap() >= 1,
            "{name}: {r:#}"
        );
        assert_gone(&["sleep", &secs]);
        let run_cgroup = fs::read_to_string(p.path().join("cg.txt")).unwrap();
        assert!(
            !Path::new(run_cgroup.trim()).exists(),
            "{name}: the run cgroup {run_cgroup} was left behind"
        );
    }
}

/// A program run through its `#!` interpreter after first sight is recorded with the script
/// in its argv (the executable alone is the shell again).
#[test]
fn an_exec_of_a_script_through_its_interpreter_is_recorded() {
    let probe = project();
    let (_, _, rt) = run(probe.path(), &[], &["true"]);
    let mut mechanisms = vec!["proc_poll"];
    if rt["execs"]["mechanism"] == "cn_proc" {
        mechanisms.push("auto");
    } else {
        skip_unless_required("the kernel process events connector is unavailable here");
    }
    for mechanism in mechanisms {
        let p = project();
        agentdiff_test_support::write_executable(
            &p.path().join("tool.sh"),
            "#!/bin/sh\nsleep 0.4\n",
            0o755,
        );
        let (code, r, rt) = run(
            p.path(),
            &["--backend-option", &format!("exec-events={mechanism}")],
            &["sh", "-c", "sleep .2; exec ./tool.sh arg1"],
        );
        assert_eq!(code, 0, "{r:#}");
        let root = rt["processes"][0]["identity"]["pid"].as_u64().unwrap();
        let argvs: Vec<&Value> = rt["execs"]["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["pid"] == root)
            .map(|e| &e["argv"])
            .collect();
        assert!(
            argvs.iter().any(|a| a[1] == "./tool.sh" && a[2] == "arg1"),
            "{mechanism}: the script's exec is missing: {argvs:?}"
        );
    }
}

fn exec_case(mechanism: &str) {
    let p = project();
    let (code, r, rt) = run(
        p.path(),
        &["--backend-option", &format!("exec-events={mechanism}")],
        &[
            "sh",
            "-c",
            "sleep .2; exec python3 -c 'import time; time.sleep(.3)'",
        ],
    );
    assert_eq!(code, 0, "{r:#}");
    let execs = &rt["execs"];
    let expected = if mechanism == "auto" {
        "cn_proc"
    } else {
        mechanism
    };
    assert_eq!(execs["mechanism"], expected, "{execs:#}");
    assert!(!execs["note"].as_str().unwrap().is_empty());
    let root = rt["processes"][0]["identity"]["pid"].as_u64().unwrap();
    assert_eq!(rt["processes"][0]["relation"], "root");
    let programs: Vec<String> = execs["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["pid"] == root)
        .map(|e| {
            Path::new(e["executable"].as_str().unwrap())
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(
        programs.first().map(String::as_str),
        Some("dash"),
        "{programs:?}"
    );
    assert!(
        programs.last().is_some_and(|p| p.starts_with("python3")),
        "the root's exec of python3 is missing: {programs:?}"
    );
    let last = execs["events"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|e| e["pid"] == root)
        .unwrap();
    assert_eq!(last["argv"][1], "-c", "{last:#}");
}

#[test]
fn an_exec_after_first_sight_is_recorded_by_the_process_events_connector() {
    let probe = project();
    let (_, _, rt) = run(probe.path(), &[], &["true"]);
    if rt["execs"]["mechanism"] != "cn_proc"
        && skip_unless_required(&format!(
            "the kernel process events connector is unavailable here (needs CAP_NET_ADMIN in the \
             initial namespaces): {:?}",
            rt["warnings"]
        ))
    {
        return;
    }
    exec_case("auto");
}

#[test]
fn an_exec_after_first_sight_is_recorded_by_polling() {
    exec_case("proc_poll");
}

/// A leftover that execs another program when cleanup signals it is recorded, in the process
/// list and in the cleanup record, under the program it ran when it was ended, not the shell it
/// was first seen (and verified) as.
#[test]
fn a_leftover_is_named_after_the_program_it_ran_when_cleaned_up() {
    let probe = project();
    let (_, _, rt) = run(probe.path(), &[], &["true"]);
    if rt["execs"]["mechanism"] != "cn_proc"
        && skip_unless_required(&format!(
            "the kernel process events connector is unavailable here: {:?}",
            rt["warnings"]
        ))
    {
        return;
    }
    let p = project();
    let secs = unique_secs();
    let inner = format!("trap 'exec sleep {secs}' TERM; while :; do sleep 0.05; done");
    let script = format!("sh -c \"{inner}\" & sleep 0.3");
    let (code, r, rt) = run(p.path(), &["--grace-period", "1"], &["sh", "-c", &script]);
    assert_eq!(code, 0, "{r:#}");
    let leftover = rt["cleanup"]["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            rt["execs"]["events"].as_array().unwrap().iter().any(|e| {
                e["pid"] == c["identity"]["pid"]
                    && e["argv"] == serde_json::json!(["sleep", secs.to_string()])
            })
        })
        .unwrap_or_else(|| panic!("no leftover exec'd sleep: {:#}", rt["cleanup"]));
    assert_eq!(leftover["executable"], "sleep", "{leftover:#}");
    let pid = &leftover["identity"]["pid"];
    let record = rt["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| &p["identity"]["pid"] == pid)
        .unwrap();
    assert_eq!(record["executable"], "sleep", "{record:#}");
    assert_gone(&["sleep", &secs.to_string()]);
}

#[test]
fn an_unknown_exec_mechanism_is_refused_before_anything_runs() {
    let p = project();
    let out = agentdiff(
        p.path(),
        &[
            "run",
            "--backend-option",
            "exec-events=ptrace",
            "--",
            "sh",
            "-c",
            "echo x > b.txt",
        ],
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("exec-events"),
        "{}",
        text(&out.stderr)
    );
    assert!(!p.path().join("b.txt").exists());
}

// ---- containers ----

const PODMAN_SOCKET: &str = "/run/podman/podman.sock";

pub(super) fn podman_missing() -> Option<String> {
    let Ok(podman) = which_podman() else {
        return Some("podman is not installed (apt-get install -y podman runc)".into());
    };
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox is missing (apt-get install -y busybox-static)".into());
    }
    if !Path::new(PODMAN_SOCKET).exists() {
        return Some(format!(
            "the podman API service is not listening on {PODMAN_SOCKET} (podman system service)"
        ));
    }
    let ok = Command::new(podman)
        .args(["info", "--format", "{{.Host.OCIRuntime.Name}}"])
        .output()
        .is_ok_and(|o| o.status.success());
    (!ok).then(|| "`podman info` fails; see ENVIRONMENT.md for the containers.conf drop-in".into())
}

fn which_podman() -> Result<PathBuf, ()> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("podman"))
        .find(|p| p.exists())
        .ok_or(())
}

pub(super) use agentdiff_test_support::rootfs::busybox_rootfs;

/// Removes a container by id when the test ends, whatever happened.
struct RemoveContainer(String);
impl Drop for RemoveContainer {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = Command::new("podman")
                .args(["rm", "-f", "-t", "0", &self.0])
                .output();
        }
    }
}

fn container_state(id: &str) -> String {
    let out = Command::new("podman")
        .args(["inspect", "--format", "{{.State.Status}}", id])
        .output()
        .unwrap();
    text(&out.stdout).trim().to_string()
}

#[test]
fn a_container_started_during_the_run_is_recorded_and_stopped_on_request() {
    if let Some(reason) = podman_missing() {
        if skip_unless_required(&reason) {
            return;
        }
    }
    let rootfs = busybox_rootfs();
    let secs = unique_secs().to_string();
    let p = project();
    let rootfs_arg = rootfs.path().display().to_string();
    let (code, r, rt) = run(
        p.path(),
        &["--timeout", "120"],
        &[
            "podman",
            "run",
            "-d",
            "--rootfs",
            &rootfs_arg,
            "sleep",
            &secs,
        ],
    );
    let containers = rt["containers"]["containers"].as_array().unwrap().clone();
    let ours: Vec<&Value> = containers
        .iter()
        .filter(|c| c["command"] == serde_json::json!(["sleep", secs]))
        .collect();
    let _guard = RemoveContainer(
        ours.first()
            .and_then(|c| c["id"].as_str())
            .unwrap_or_default()
            .to_string(),
    );
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(ours.len(), 1, "{:#}", rt["containers"]);
    let c = ours[0];
    let id = c["id"].as_str().unwrap().to_string();
    assert_eq!(c["attributed"], true, "{c:#}");
    assert_eq!(c["running_at_end"], true, "{c:#}");
    assert_eq!(c["socket"], PODMAN_SOCKET);
    assert!(rt["containers"]["engines"]
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["kind"] == "podman"));
    // Reported: not passed, a container finding, counted in the summary.
    assert_ne!(r["status"], "passed", "{r:#}");
    let f = findings(&r, "container_started");
    assert!(f.iter().any(|f| f["container"] == id.as_str()), "{r:#}");
    assert!(r["summary"]["containers_started"].as_u64().unwrap() >= 1);
    // The container's process is the engine's: its monitor was ours and was ended, and the
    // process itself was tracked as a descendant, so nothing of it survives the run.
    assert_gone(&["sleep", &secs]);

    // The summary format says so too.
    let run_id = r["run_id"].as_str().unwrap();
    let out = agentdiff(
        p.path(),
        &[
            "cleanup",
            run_id,
            "--containers",
            "--grace-period",
            "1",
            "--format",
            "json",
        ],
    );
    super::assert_exit(&out, 0);
    let res: Value = serde_json::from_slice(&out.stdout).unwrap();
    let stops = res["containers"].as_array().unwrap();
    let stop = stops.iter().find(|s| s["id"] == id.as_str()).unwrap();
    assert!(
        ["stopped", "already_stopped"].contains(&stop["outcome"].as_str().unwrap()),
        "{stop:#}"
    );
    let state = container_state(&id);
    assert_ne!(
        state, "running",
        "the container still runs after cleanup --containers"
    );
}

#[test]
fn cleanup_containers_refuses_a_container_created_outside_the_run_window() {
    if let Some(reason) = podman_missing() {
        if skip_unless_required(&reason) {
            return;
        }
    }
    let rootfs = busybox_rootfs();
    let secs = unique_secs().to_string();
    // Created before the run: a recorded id that names it must not be stopped.
    let out = Command::new("podman")
        .args(["run", "-d", "--rootfs"])
        .arg(rootfs.path())
        .args(["sleep", &secs])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_string();
    let _guard = RemoveContainer(id.clone());
    let p = project();
    let (_, r, _) = run(p.path(), &[], &["true"]);
    let run_id = r["run_id"].as_str().unwrap();
    // Forge the run's evidence to name the older container (as a tampered capsule could).
    let dir = p.path().join(".agentdiff/runs").join(run_id);
    let rt_path = dir.join("runtime.json");
    let mut rt: Value = serde_json::from_slice(&fs::read(&rt_path).unwrap()).unwrap();
    rt["containers"]["containers"] = serde_json::json!([{
        "id": id, "socket": PODMAN_SOCKET, "name": "x", "image": "", "command": ["sleep", secs],
        "created": "", "attributed": true, "main_pid": 0, "running_at_end": true,
        "running_after_cleanup": true, "removed": false
    }]);
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&rt_path, fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(&rt_path, serde_json::to_vec(&rt).unwrap()).unwrap();
    // The forged capsule no longer authenticates, so cleanup refuses it outright (exit 67)...
    let out = agentdiff(
        p.path(),
        &["cleanup", run_id, "--containers", "--format", "json"],
    );
    super::assert_exit(&out, 67);
    // ...and even when forced to act on it, the engine's creation time, not the recorded id,
    // decides: refused, exit 68.
    let out = agentdiff(
        p.path(),
        &[
            "cleanup",
            run_id,
            "--containers",
            "--force",
            "--format",
            "json",
        ],
    );
    super::assert_exit(&out, 68);
    let res: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        res["containers"][0]["outcome"], "refused_outside_window",
        "{res:#}"
    );
    assert_eq!(container_state(&id), "running");
}

/// A fake engine on a Unix socket: every connection is accepted and then, per `mode`, never
/// answered or answered one byte every 200 ms (a well-formed response that never ends).
fn fake_engine(path: &Path, mode: &'static str) {
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                use std::io::Write;
                if mode == "silent" {
                    std::thread::sleep(Duration::from_secs(120));
                    return;
                }
                let head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
                for b in head.iter().chain(std::iter::repeat(&b'1')) {
                    if conn.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            });
        }
    });
}

/// An engine socket that accepts and never answers (or answers a byte at a time) does not hold a
/// run: each observation phase gives up at its deadline and the evidence says the engine did not
/// answer.
#[test]
fn a_hung_engine_socket_does_not_block_the_run() {
    for mode in ["silent", "trickle"] {
        let sockets = tempfile::tempdir().unwrap();
        let sock = sockets.path().join("engine.sock");
        fake_engine(&sock, mode);
        let p = project();
        let started = Instant::now();
        let out = cmd(
            p.path(),
            &[
                "run",
                "--format",
                "json",
                "--fail-on",
                "never",
                "--",
                "true",
            ],
        )
        .env("DOCKER_HOST", format!("unix://{}", sock.display()))
        .output()
        .unwrap();
        let took = started.elapsed();
        assert_eq!(out.status.code(), Some(0), "{mode}: {}", text(&out.stderr));
        // Discovery overlaps the command; the end-of-command phase waits at most 2 s.
        assert!(
            took < Duration::from_secs(8),
            "{mode}: the run took {took:?}"
        );
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        let rt: Value = serde_json::from_slice(
            &fs::read(
                p.path()
                    .join(".agentdiff/runs")
                    .join(r["run_id"].as_str().unwrap())
                    .join("runtime.json"),
            )
            .unwrap(),
        )
        .unwrap();
        let errors = rt["containers"]["errors"].to_string();
        assert!(
            errors.contains(&sock.display().to_string()) && errors.contains("did not answer"),
            "{mode}: {:#}",
            rt["containers"]
        );
        assert!(!rt["containers"]["engines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["socket"] == sock.display().to_string().as_str()));
    }
}

// ---- ports ----

/// The summary counts a listener the command opened apart from one another program opened on the
/// machine during the run: the second is a machine-wide observation, not the command's socket.
#[test]
fn the_summary_tells_the_runs_listeners_from_machine_wide_ones() {
    // Files order the two listeners however slow the machine: the outside one opens once the
    // run's command has started (after the run's port baseline) and the command ends only once
    // it is open.
    let p = project();
    let signals = tempfile::tempdir().unwrap();
    let (started, bound) = (signals.path().join("started"), signals.path().join("bound"));
    let wait_for = |f: &Path| {
        format!(
            "d = time.time() + 10\nwhile not os.path.exists('{}') and time.time() < d: \
             time.sleep(0.01)",
            f.display()
        )
    };
    let listen = |then: &str| {
        format!(
            "import os, socket, time\ns = socket.socket(); s.bind(('127.0.0.1', 0)); \
             s.listen()\n{then}"
        )
    };
    // Outside the run: starts listening while the run is going on.
    let outside_script = listen(&format!(
        "open('{}', 'w').close()\ntime.sleep(30)",
        bound.display()
    ));
    let mut outside = Command::new("python3")
        .arg("-c")
        .arg(format!(
            "import os, time\n{}\n{outside_script}",
            wait_for(&started)
        ))
        .spawn()
        .unwrap();
    let inside = listen(&format!(
        "open('{}', 'w').close()\n{}\ntime.sleep(0.2)",
        started.display(),
        wait_for(&bound)
    ));
    let out = agentdiff(
        p.path(),
        &["run", "--fail-on", "never", "--", "python3", "-c", &inside],
    );
    let _ = outside.kill();
    let _ = outside.wait();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("new listening sockets"))
        .unwrap_or_else(|| panic!("no listening-socket line: {text}"));
    assert!(
        line.contains("1 held by the run's processes")
            && line.contains("elsewhere on the machine")
            && !line.contains("0 elsewhere"),
        "{line}"
    );
}

// ---- a killed monitor ----

/// agentdiff SIGKILLed mid-run: the command keeps writing into the tree. The next agentdiff
/// command in that root prints one line pointing to `agentdiff cleanup RUN`; after the cleanup
/// nothing of the run survives and the line is gone.
#[test]
fn the_next_command_points_to_cleanup_after_the_monitor_was_killed() {
    let p = project();
    let secs = unique_secs().to_string();
    let script = format!("while :; do echo x >> log.txt; sleep 0.05; done & sleep {secs}");
    let mut child = cmd(p.path(), &[])
        .args([
            "run",
            "--run-id",
            "orphaned",
            "--fail-on",
            "never",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let events = p.path().join(".agentdiff/runs/orphaned/events.jsonl");
    let started = Instant::now();
    let launched = || fs::read_to_string(&events).is_ok_and(|e| e.contains("\"launched\""));
    while !launched() || running(&["sleep", &secs]).is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the run did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let size = || fs::metadata(p.path().join("log.txt")).map_or(0, |m| m.len());
    let before = size();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        size() > before,
        "the command should keep writing after its monitor died"
    );

    let notice = |args: &[&str]| -> Vec<String> {
        let out = agentdiff(p.path(), args);
        text(&out.stderr)
            .lines()
            .filter(|l| l.contains("agentdiff cleanup orphaned"))
            .map(String::from)
            .collect()
    };
    assert_eq!(notice(&["runs"]).len(), 1, "one line from `runs`");
    assert_eq!(
        notice(&["inspect", "orphaned"]).len(),
        1,
        "one line from `inspect`"
    );
    // A run started now in the same root gets the line too, before anything else.
    let (_, out_line) = {
        let out = agentdiff(p.path(), &["run", "--fail-on", "never", "--", "true"]);
        (out.status, text(&out.stderr))
    };
    assert!(
        out_line.contains("agentdiff cleanup orphaned"),
        "{out_line}"
    );

    let out = agentdiff(p.path(), &["cleanup", "orphaned"]);
    super::assert_exit(&out, 0);
    assert_gone(&["sleep", &secs]);
    let after = size();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(size(), after, "the writer survived cleanup");
    assert!(
        notice(&["runs"]).is_empty(),
        "the line outlived the cleanup"
    );
}
