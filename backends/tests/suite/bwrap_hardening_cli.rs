//! `agentdiff run --runtime bwrap` against a command that attacks the sandbox's own plumbing:
//! a planted `bwrap`, descriptors inherited from agentdiff's caller, and writes into the start
//! marker. Real bubblewrap, as in `bwrap_cli`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use super::bwrap_cli::{no_bwrap, Fixture};

/// A `bwrap` that drops its options and execs the rest: no sandbox at all.
const EXEC_ONLY_BWRAP: &str = "#!/bin/sh\nwhile [ \"$#\" -gt 0 ] && [ \"$1\" != \"--\" ]; do \
                               shift; done\nshift\nexec \"$@\"\n";

fn install_fake(path: &Path) {
    install_script(path, EXEC_ONLY_BWRAP);
}

fn install_script(path: &Path, script: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    agentdiff_test_support::write_executable(path, script, 0o755);
}

/// Installs, below the fixture's home, a `bwrap` that removes `path` and then execs the real
/// bwrap: a path that goes away between the plan and the sandbox's mount setup.
fn install_removing_bwrap(f: &Fixture, path: &Path) -> std::path::PathBuf {
    let real = Command::new("sh")
        .args(["-c", "command -v bwrap"])
        .output()
        .unwrap();
    let real = String::from_utf8(real.stdout).unwrap();
    let wrapper = f.home.path().join("bin/bwrap");
    install_script(
        &wrapper,
        &format!(
            "#!/bin/sh\nrm -rf '{}'\nexec '{}' \"$@\"\n",
            path.display(),
            real.trim()
        ),
    );
    wrapper
}

const CANARY_COMMAND: &str = "echo COMMAND-RAN-CANARY; echo ran > ran.txt";

/// Runs the canary under the bwrap executable `wrapper` (plus `extra` arguments) and checks it
/// failed closed (exit 69, nothing ran); `None` when, not as root, the ownership rule refused the
/// wrapper first (also fail closed), else bwrap's stderr and the run's JSON result.
fn refused_under_wrapper(f: &Fixture, wrapper: &Path, extra: &[&str]) -> Option<(String, Value)> {
    let opt = format!("bwrap-executable={}", wrapper.display());
    let mut args = vec!["--backend-option", opt.as_str()];
    args.extend_from_slice(extra);
    let (code, result, out) = f.run(&args, &["sh", "-c", CANARY_COMMAND], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_nothing_ran(f, &out);
    assert_eq!(code, 69, "{stderr}");
    let error = result["execution_error"].as_str().unwrap_or_default();
    (!error.contains("refusing the bwrap executable")).then_some((stderr, result))
}

fn assert_nothing_ran(f: &Fixture, out: &std::process::Output) {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("COMMAND-RAN-CANARY"), "{all}");
    assert!(!f.root().join("ran.txt").exists());
}

#[test]
fn a_fake_bwrap_that_only_execs_its_argument_fails_closed() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    // Outside the project and owned by this user's root-owned temp tree: the executable checks
    // pass (as root), so only the exec shim's namespace proof stands between it and the command.
    let fake = f.home.path().join("bin/bwrap");
    install_fake(&fake);
    let Some((stderr, result)) = refused_under_wrapper(&f, &fake, &[]) else {
        return;
    };
    assert!(stderr.contains("no sandbox around the command"), "{stderr}");
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["start_state"], "not_sandboxed", "{rt:#}");
    assert_eq!(rt["wrapper"]["exit_attribution"], "wrapper");
    assert_eq!(rt["capabilities"]["sandboxed"], false);
    let failure = rt["failure"].to_string();
    assert!(failure.contains("built no sandbox"), "{failure}");
}

/// A path the plan mounts over, removed before bwrap mounts (a hidden path that came and went):
/// bwrap cannot make the mount point on the read-only host tree, nothing runs, and the error
/// names the path and says to run again. (Below `/run` this cannot happen: see
/// `host_daemon_sockets_in_a_private_run`.)
#[test]
fn a_mount_point_removed_after_the_plan_fails_closed_and_is_named() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    // Not below /tmp (a tmpfs in the sandbox, where the mount point could be made).
    let gone = tempfile::tempdir_in("/var/tmp").unwrap();
    let hidden = gone.path().join("daemon.sock");
    fs::write(&hidden, "").unwrap();
    let fake = install_removing_bwrap(&f, gone.path());
    let hide = format!("hide={}", hidden.display());
    let Some((_, result)) = refused_under_wrapper(&f, &fake, &["--backend-option", &hide]) else {
        return;
    };
    let error = result["execution_error"].as_str().unwrap_or_default();
    let named = format!(
        "{} was removed after the plan and before bwrap mounted over it",
        hidden.display()
    );
    assert!(error.contains(&named), "{error}");
    assert!(error.contains("run the command again"), "{error}");
    assert_eq!(
        f.runtime_json(&result)["wrapper"]["start_state"],
        "not_started"
    );
}

#[test]
fn a_bwrap_planted_in_the_project_on_path_is_refused() {
    let f = Fixture::new();
    for dir in ["node_modules/.bin", ".venv/bin"] {
        let bin = f.root().join(dir);
        install_fake(&bin.join("bwrap"));
        let path = format!("{}:/usr/bin:/bin", bin.display());
        let (code, result, out) = f.run(&[], &["sh", "-c", CANARY_COMMAND], &[("PATH", &path)]);
        let error = result["execution_error"].as_str().unwrap_or_default();
        assert_eq!(code, 69, "{}", String::from_utf8_lossy(&out.stderr));
        assert!(error.contains("refusing the bwrap executable"), "{error}");
        assert!(error.contains("bwrap-executable=PATH"), "{error}");
        assert_nothing_ran(&f, &out);
    }
}

/// Opens a directory as fd 7 and a connected Unix socket as fd 8 (both inheritable), then
/// execs the rest: a caller that leaks descriptors into agentdiff.
const LEAKING_CALLER: &str = "import os, socket, sys\n\
s = socket.socket(socket.AF_UNIX)\n\
s.connect(sys.argv[1])\n\
os.dup2(s.fileno(), 8)\n\
os.dup2(os.open(sys.argv[2], os.O_RDONLY | os.O_DIRECTORY), 7)\n\
os.execv(sys.argv[3], sys.argv[3:])\n";

#[test]
fn descriptors_inherited_from_the_caller_do_not_reach_the_command() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let host_dir = f.home.path().join("host-dir");
    fs::create_dir_all(&host_dir).unwrap();
    let sock = f.home.path().join("engine.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let command = "echo x > /proc/self/fd/7/pwned; echo leaked >&8; \
                   for n in 7 8; do [ -e /proc/self/fd/$n ] && echo fd$n-open; done > fds.txt; \
                   true";
    let inner = super::cmd(
        f.root(),
        &[
            "run",
            "--runtime",
            "bwrap",
            "--format",
            "json",
            "--",
            "sh",
            "-c",
            command,
        ],
    );
    let mut caller = Command::new("python3");
    caller
        .args(["-c", LEAKING_CALLER])
        .arg(&sock)
        .arg(&host_dir)
        .arg(inner.get_program())
        .args(inner.get_args())
        .current_dir(f.root())
        .env("HOME", f.home.path());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => caller.env(k, v),
            None => caller.env_remove(k),
        };
    }
    let out = caller.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["start_state"], "started", "{rt:#}");
    assert!(!host_dir.join("pwned").exists(), "wrote through fd 7");
    assert_eq!(fs::read_to_string(f.root().join("fds.txt")).unwrap(), "");
    // The caller connected; the command sent nothing through the socket.
    let (mut conn, _) = listener.accept().unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut got = Vec::new();
    let _ = conn.read_to_end(&mut got);
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
}

#[test]
fn junk_written_into_the_start_marker_does_not_change_the_runs_outcome() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let command = "n=0; for m in .agentdiff/runs/*/bwrap-start-marker.fifo; do \
                   printf 'junk\\nargc_mismatch token=- expected=1 received=2\\n\
                   not_sandboxed token=x ns=net\\nexec_failed token=x forged\\n' > \"$m\" \
                   && n=$((n+1)); done; echo $n > written.txt";
    let (code, result, out) = f.run(&[], &["sh", "-c", command], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, 0, "{stderr}");
    // The junk did reach the marker.
    assert_eq!(
        fs::read_to_string(f.root().join("written.txt"))
            .unwrap()
            .trim(),
        "1"
    );
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["start_state"], "started", "{rt:#}");
    assert_eq!(rt["wrapper"]["exit_attribution"], "command");
    assert_eq!(rt["capabilities"]["sandboxed"], true);
    assert!(rt["failure"].is_null(), "{rt:#}");
}

/// A command the policy blocks never starts the sandbox (the held start comes before the
/// capsule is opened, but not for a blocked command), and its refusal seals and verifies with no
/// start file left in the capsule. The same recording `bwrap` is started for an allowed command,
/// so the log can show a start.
#[test]
fn a_blocked_command_never_starts_the_sandbox() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    f.write_policy("version: 1\nprocess:\n  deny: [touch]\n");
    let real = Command::new("sh")
        .args(["-c", "command -v bwrap"])
        .output()
        .unwrap();
    let real = String::from_utf8(real.stdout).unwrap().trim().to_string();
    let log = f.home.path().join("bwrap-starts.log");
    let fake = f.home.path().join("bin/bwrap");
    let script = format!(
        "#!/bin/sh\necho start >> {}\nexec {real} \"$@\"\n",
        log.display()
    );
    install_script(&fake, &script);
    let opt = format!("bwrap-executable={}", fake.display());

    let (code, result, out) = f.run(&["--backend-option", &opt], &["touch", "ran.txt"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, 73, "{stderr}");
    assert_eq!(result["status"], "blocked", "{result:#}");
    assert!(!f.root().join("ran.txt").exists());
    assert!(!log.exists(), "bwrap was started for a blocked command");
    let id = result["run_id"].as_str().unwrap();
    let capsule = f.root().join(".agentdiff/runs").join(id);
    for entry in fs::read_dir(&capsule).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(!name.ends_with(".fifo"), "{name} left in the capsule");
    }
    let verify = super::cmd(f.root(), &["verify", id]).output().unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );

    let (code, _, out) = f.run(
        &["--backend-option", &opt],
        &["sh", "-c", "echo ran > ran.txt"],
        &[],
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(f.root().join("ran.txt").exists());
    assert!(fs::read_to_string(&log).unwrap().contains("start"));
}

/// The issue's commands: with a host file on stdin the command writes through `/proc/self/fd/0`,
/// with a host directory on stdin it lists, reads and creates files below it through that link,
/// and it writes through `/proc/self/fd/2` with a host file as stderr. Every stream that is not a
/// terminal, a pipe or the null device reaches the command as agentdiff's own pipe: the host
/// file and directory are untouched, the bytes still flow, and the evidence names the relayed
/// streams.
#[test]
fn standard_streams_never_reopen_host_files_or_directories() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let notes = f.home.path().join("notes.txt");
    fs::write(&notes, "my notes\n").unwrap();
    fs::write(f.home.path().join("secret.txt"), "HOME-SECRET-CANARY\n").unwrap();
    let errors = f.home.path().join("stderr.txt");
    let run = |stdin: &Path, command: &str| {
        let mut cmd = super::cmd(
            f.root(),
            &["run", "--runtime", "bwrap", "--format", "json", "--"],
        );
        cmd.args(["sh", "-c", command])
            .env("HOME", f.home.path())
            .stdin(fs::File::open(stdin).unwrap())
            .stderr(fs::File::create(&errors).unwrap());
        let out = cmd.output().unwrap();
        let result: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let stderr = fs::read_to_string(&errors).unwrap_or_default();
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        result
    };
    let result = run(
        &notes,
        "read line; echo \"got: $line\" >&2; echo X > /proc/self/fd/0; \
         echo Y > /proc/self/fd/2; true",
    );
    assert_eq!(fs::read_to_string(&notes).unwrap(), "my notes\n");
    let stderr = fs::read_to_string(&errors).unwrap();
    assert!(stderr.contains("got: my notes"), "{stderr}");
    let rt = f.runtime_json(&result);
    let relayed = rt["stdio_relayed"].to_string();
    assert!(
        relayed.contains("stdin: regular_file") && relayed.contains("stderr: regular_file"),
        "{rt:#}"
    );

    let result = run(
        f.home.path(),
        "ls -a /proc/self/fd/0/ > listing.txt 2>&1; \
         cat /proc/self/fd/0/secret.txt > stolen.txt 2>&1; \
         echo x > /proc/self/fd/0/planted 2>/dev/null; true",
    );
    assert!(!f.home.path().join("planted").exists());
    let stolen = fs::read_to_string(f.root().join("stolen.txt")).unwrap();
    assert!(!stolen.contains("HOME-SECRET-CANARY"), "{stolen}");
    let listing = fs::read_to_string(f.root().join("listing.txt")).unwrap();
    assert!(!listing.contains("notes.txt"), "{listing}");
    let rt = f.runtime_json(&result);
    assert!(
        rt["stdio_relayed"].to_string().contains("stdin: directory"),
        "{rt:#}"
    );

    // The null device is handed over as it is (no relay thread): reopened, it is still only the
    // null device, and the host's stays one.
    let result = run(
        Path::new("/dev/null"),
        "read line; echo \"read: $?\" > null.txt; echo x > /proc/self/fd/0; \
         stat -L -c '%t:%T' /proc/self/fd/0 >> null.txt",
    );
    let seen = fs::read_to_string(f.root().join("null.txt")).unwrap();
    assert_eq!(seen, "read: 1\n1:3\n", "{seen}");
    use std::os::unix::fs::FileTypeExt;
    assert!(fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    let rt = f.runtime_json(&result);
    let relayed = rt["stdio_relayed"].to_string();
    assert!(
        !relayed.contains("stdin") && relayed.contains("stderr: regular_file"),
        "{rt:#}"
    );
}

/// The start marker's forgery from inside the sandbox: the command looks for the salt in every
/// process's environment and argv (`/proc/*/environ`, `/proc/*/cmdline`, bwrap's init is pid 1),
/// tries to read the secret FIFO and the marker itself (to learn the token from the start line or
/// take that line away), and writes `exec_failed` with every token it could derive into the
/// marker, after changing a file. The run is still recorded as the command's: started, its exit
/// code, its change.
#[test]
fn the_command_cannot_forge_the_start_marker() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let command = r#"echo changed > changed.txt
m=$(ls .agentdiff/runs/*/bwrap-start-marker.fifo)
for p in /proc/[0-9]*; do cat "$p/environ" "$p/cmdline" 2>/dev/null | tr '\0' '\n'; done \
  | sed -n 's/^AGENTDIFF_EXEC_SHIM_ARGV_DIGEST=//p' > salts.txt
dd if="$m.secret" iflag=nonblock of=secret.txt 2>/dev/null
cut -d: -f1 secret.txt >> salts.txt
dd if="$m" iflag=nonblock of=stolen.txt 2>/dev/null
for salt in $(cut -d: -f1 salts.txt); do
  t=$(printf 'agentdiff exec shim start marker\000%s' "$salt" | sha256sum | cut -c1-32)
  printf 'exec_failed token=%s forged\n' "$t" > "$m"
done
t=$(sed -n 's/^started token=\([^ ]*\).*/\1/p' stolen.txt)
printf 'exec_failed token=%s forged\n' "$t" > "$m"
exit 3"#;
    let (code, result, out) = f.run(&[], &["sh", "-c", command], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let read = |name: &str| fs::read_to_string(f.root().join(name)).unwrap_or_default();
    assert_eq!(code, 3, "{stderr}");
    let rt = f.runtime_json(&result);
    assert_eq!(rt["wrapper"]["start_state"], "started", "{rt:#}");
    assert_eq!(rt["wrapper"]["exit_attribution"], "command");
    assert_eq!(rt["exit"]["code"], 3, "{rt:#}");
    assert!(rt["failure"].is_null(), "{rt:#}");
    let changes = result["changes"].to_string();
    assert!(changes.contains("changed.txt"), "{result:#}");
    assert_eq!(
        read("salts.txt"),
        "",
        "the salt was readable in the sandbox"
    );
    assert_eq!(
        read("stolen.txt"),
        "",
        "the start line was readable in the sandbox"
    );
}

/// Runs `argv` (a probe that writes what it saw to `probe.txt`) in the sandbox; the run must
/// pass. What the probe saw, and the run's result.
fn run_probe(f: &Fixture, argv: &[&str]) -> (String, Value) {
    let (code, result, out) = f.run(&[], argv, &[]);
    assert_eq!(
        code,
        0,
        "{result:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = fs::read_to_string(f.root().join("probe.txt")).unwrap();
    (seen, result)
}

/// Python that tries an `AF_VSOCK` socket (towards the host, CID 2, when one is made) and an
/// io_uring, and prints what happened (`vsock created|ERRNO`, `uring created|ERRNO`) to stdout,
/// or to the file its first argument names.
const VSOCK_AND_URING: &str = r#"
import ctypes, socket, sys
out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
def print(*a):
    out.write(" ".join(str(x) for x in a) + "\n")
try:
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    print("vsock created")
    s.settimeout(1)
    try:
        s.connect((2, 40123))
    except OSError:
        pass
except OSError as e:
    print("vsock", e.errno)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
params = ctypes.create_string_buffer(120)
fd = libc.syscall(425, 1, params)
print("uring created" if fd >= 0 else "uring %d" % ctypes.get_errno())
out.close()
"#;

#[test]
fn the_command_gets_no_vsock_and_no_io_uring() {
    if no_bwrap() {
        return;
    }
    let probe = |cmd: &mut Command| {
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    // What this host gives a plain process, so the sandbox's answer means something.
    let host = probe(Command::new("python3").args(["-c", VSOCK_AND_URING]));
    let f = Fixture::new();
    let argv = ["python3", "-c", VSOCK_AND_URING, "probe.txt"];
    let (stdout, result) = run_probe(&f, &argv);
    assert!(
        stdout.contains(&format!("vsock {}", libc::EAFNOSUPPORT)),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("uring {}", libc::ENOSYS)),
        "{stdout}"
    );
    if !host.contains("vsock created") {
        // Without vsock on the host, EAFNOSUPPORT is the kernel's answer; the filter's own
        // answer is checked by agentdiff-process's unit tests.
        eprintln!("note: this host has no vsock ({host:?}); the sandbox's refusal is the kernel's");
    }
    if !host.contains("uring created") {
        eprintln!("note: this host refuses io_uring itself ({host:?})");
    }
    let rt = f.runtime_json(&result);
    let how = rt["wrapper"]["controls"]["network"]["how"]
        .as_str()
        .unwrap_or_default();
    assert!(how.contains("AF_VSOCK"), "{rt:#}");
}

/// Python that tries to reach pid 1 (bwrap's init, outside the exec shim's filter) each way a
/// process of the same user can, and writes what happened to the file its argument names.
const DRIVE_PID1: &str = r#"
import ctypes, os, sys
out = open(sys.argv[1], "w")
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.syscall.restype = ctypes.c_long
out.write("comm %s\n" % open("/proc/1/comm").read().strip())
r = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH
if r == 0:
    os.waitpid(1, 0)
    libc.ptrace(17, 1, None, None)  # PTRACE_DETACH
    out.write("ptrace attached\n")
else:
    out.write("ptrace %d\n" % ctypes.get_errno())
for path in ("/proc/1/mem", "/proc/1/task/1/mem"):
    try:
        os.close(os.open(path, os.O_RDWR))
        out.write("%s opened\n" % path)
    except OSError as e:
        out.write("%s %d\n" % (path, e.errno))
r = libc.syscall(434, 1, 0)  # pidfd_open
out.write("pidfd opened\n" if r >= 0 else "pidfd %d\n" % ctypes.get_errno())
out.close()
"#;

#[test]
fn the_command_cannot_drive_bwraps_init_past_the_filter() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let argv = ["python3", "-c", DRIVE_PID1, "probe.txt"];
    let (seen, _) = run_probe(&f, &argv);
    assert!(
        seen.contains("comm bwrap"),
        "pid 1 is not bwrap's init: {seen}"
    );
    let eperm = libc::EPERM;
    assert!(seen.contains(&format!("ptrace {eperm}")), "{seen}");
    assert!(seen.contains(&format!("pidfd {eperm}")), "{seen}");
    for path in ["/proc/1/mem", "/proc/1/task/1/mem"] {
        assert!(!seen.contains(&format!("{path} opened")), "{seen}");
    }
}

/// Python that looks for a key in the user keyring and prints what it read: `read VALUE`, or
/// `search ERRNO`.
const READ_USER_KEY: &str = r#"
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = open(sys.argv[2], "w") if len(sys.argv) > 2 else sys.stdout
key = libc.syscall(250, 10, ctypes.c_int(-4), b"user", sys.argv[1].encode(), 0)  # KEYCTL_SEARCH
if key < 0:
    out.write("search %d\n" % ctypes.get_errno())
else:
    buf = ctypes.create_string_buffer(256)
    n = libc.syscall(250, 11, ctypes.c_long(key), buf, 256)  # KEYCTL_READ
    out.write("read %s\n" % buf.raw[:max(n, 0)].decode())
out.close()
"#;

/// A `user` key in this user's keyring, unlinked when dropped.
struct UserKey(libc::c_long);

impl UserKey {
    fn add(description: &str, value: &str) -> Option<UserKey> {
        let (kind, desc) = (c"user", std::ffi::CString::new(description).unwrap());
        // SAFETY: add_key(2) reads the two C strings and `value.len()` bytes of `value`.
        let id = unsafe {
            libc::syscall(
                libc::SYS_add_key,
                kind.as_ptr(),
                desc.as_ptr(),
                value.as_ptr(),
                value.len(),
                libc::c_long::from(-4i32), // KEY_SPEC_USER_KEYRING
            )
        };
        (id >= 0).then_some(UserKey(id))
    }
}

impl Drop for UserKey {
    fn drop(&mut self) {
        // SAFETY: keyctl(KEYCTL_UNLINK, key, KEY_SPEC_USER_KEYRING) with integer arguments.
        unsafe { libc::syscall(libc::SYS_keyctl, 9, self.0, -4) };
    }
}

#[test]
fn the_command_cannot_read_the_users_kernel_keyring() {
    if no_bwrap() {
        return;
    }
    let description = format!("agentdiff-test-{}", std::process::id());
    let Some(_key) = UserKey::add(&description, "KEYRING-SECRET") else {
        agentdiff_test_support::skip("this kernel gives no user keyring (add_key failed)");
        return;
    };
    let host = Command::new("python3")
        .args(["-c", READ_USER_KEY, &description])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&host.stdout).trim(),
        "read KEYRING-SECRET",
        "the key is readable outside the sandbox: {host:?}"
    );
    let f = Fixture::new();
    let argv = ["python3", "-c", READ_USER_KEY, &description, "probe.txt"];
    let (seen, _) = run_probe(&f, &argv);
    assert_eq!(seen.trim(), format!("search {}", libc::ENOSYS));
}

/// Python that connects to the Unix socket its first argument names and writes `connected` or
/// `refused ERRNO` to the file its second argument names.
const CONNECT_UNIX: &str = r#"
import socket, sys
out = open(sys.argv[2], "w")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
    out.write("connected\n")
except OSError as e:
    out.write("refused %d\n" % e.errno)
out.close()
"#;

/// The sockets live in a `/run` of its own (a tmpfs in a private mount namespace, in a process of
/// its own): the test needs to know what is there, and must never leave a socket in the host's.
#[test]
fn host_daemon_sockets_below_run_are_out_of_reach_unless_allowed() {
    if no_bwrap() {
        return;
    }
    // Mounting a private /run needs root, as CI runs.
    if !nix::unistd::geteuid().is_root() {
        agentdiff_test_support::skip("a private /run needs root");
        return;
    }
    agentdiff_test_support::run_ignored_in_own_process(
        "suite::bwrap_hardening_cli::host_daemon_sockets_in_a_private_run",
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            "mount -t tmpfs -o mode=0755 tmpfs /run && exec \"$@\"",
            "sh",
        ],
    );
}

#[test]
#[ignore = "run in a private mount namespace by host_daemon_sockets_below_run_are_out_of_reach_unless_allowed"]
fn host_daemon_sockets_in_a_private_run() {
    // Only in the fresh tmpfs the caller mounted: never a socket left in the host's /run.
    assert_eq!(
        fs::read_dir("/run").unwrap().count(),
        0,
        "not in a private /run"
    );
    // A daemon's socket where daemons keep theirs.
    let dir = Path::new("/run/agentdiff-test");
    fs::create_dir_all(dir).unwrap();
    let sock = dir.join("daemon.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || for _ in listener.incoming() {});
    let sock = sock.to_str().unwrap();
    let f = Fixture::new();
    let argv = ["python3", "-c", CONNECT_UNIX, sock, "probe.txt"];
    let (seen, result) = run_probe(&f, &argv);
    // Left out of the rebuilt /run: not there at all.
    assert_eq!(seen.trim(), format!("refused {}", libc::ENOENT));
    let rt = f.runtime_json(&result);
    assert_eq!(rt["runtime_config"]["host_sockets"], "hide", "{rt:#}");
    let mounts = rt["runtime_config"]["mounts"].to_string();
    assert!(
        mounts.contains(sock) && mounts.contains("host daemon socket"),
        "{mounts}"
    );
    // A socket and its directory removed between the plan and bwrap's mount setup (a
    // container's, gone with it): the run is not disturbed.
    let going = Path::new("/run/agentdiff-test-going");
    fs::create_dir_all(going).unwrap();
    let going_listener = std::os::unix::net::UnixListener::bind(going.join("c.sock")).unwrap();
    let wrapper = install_removing_bwrap(&f, going);
    let opt = format!("bwrap-executable={}", wrapper.display());
    let (code, result, out) = f.run(
        &["--backend-option", &opt],
        &[
            "sh",
            "-c",
            "ls -A /run /run/agentdiff-test-going > listing.txt",
        ],
        &[],
    );
    drop(going_listener);
    assert_eq!(
        code,
        0,
        "{result:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!going.exists());
    let listing = fs::read_to_string(f.root().join("listing.txt")).unwrap();
    // The rebuilt directory is there, empty: made from the plan, nothing of the host's in it.
    assert!(listing.contains("agentdiff-test\n"), "{listing}");
    assert!(
        listing.ends_with("/run/agentdiff-test-going:\n"),
        "{listing}"
    );
    // Allowed by the policy: the same connection reaches the daemon.
    f.write_policy("version: 2\nruntime:\n  bwrap:\n    host_sockets: allow\n");
    let (seen, result) = run_probe(&f, &argv);
    assert_eq!(seen.trim(), "connected");
    assert_eq!(
        f.runtime_json(&result)["runtime_config"]["host_sockets"],
        "allow"
    );
}

#[test]
fn the_systems_credential_files_are_hidden() {
    if no_bwrap() {
        return;
    }
    let shadow = Path::new("/etc/shadow");
    if !shadow.exists() {
        agentdiff_test_support::skip("this host has no /etc/shadow");
        return;
    }
    // Root (as CI runs) reads it outside the sandbox, and bwrap gives root no user namespace.
    let readable_outside = fs::read(shadow).is_ok_and(|b| !b.is_empty());
    let f = Fixture::new();
    let (code, result, out) = f.run(
        &[],
        &["sh", "-c", "cat /etc/shadow > seen.txt 2>/dev/null; exit 0"],
        &[],
    );
    assert_eq!(
        code,
        0,
        "{result:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = fs::read_to_string(f.root().join("seen.txt")).unwrap_or_default();
    assert_eq!(seen, "", "/etc/shadow was readable in the sandbox");
    let rt = f.runtime_json(&result);
    let hidden = rt["wrapper"]["controls"]["credentials"]["hidden"].to_string();
    assert!(hidden.contains("/etc/shadow"), "{rt:#}");
    if !readable_outside {
        eprintln!("note: /etc/shadow is not readable here outside the sandbox either (not root)");
    }
}

#[test]
fn the_command_cannot_change_the_configuration_later_runs_read() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    f.write_policy("version: 2\n");
    let claude = f.root().join(".claude");
    fs::create_dir_all(&claude).unwrap();
    fs::write(claude.join("settings.json"), "{}\n").unwrap();
    let script = r#"printf '{"disableAllHooks": true}' > .claude/settings.local.json; a=$?
echo '# weakened' >> agentdiff.yaml; b=$?
rm -rf .claude; c=$?
echo ok > allowed.txt
echo "$a $b $c" > codes.txt"#;
    let (code, result, out) = f.run(&[], &["sh", "-c", script], &[]);
    assert_eq!(
        code,
        0,
        "{result:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let codes = fs::read_to_string(f.root().join("codes.txt")).unwrap();
    assert!(
        codes.split_whitespace().all(|c| c != "0"),
        "a write to the configuration succeeded: {codes}"
    );
    assert!(!claude.join("settings.local.json").exists());
    assert_eq!(
        fs::read_to_string(claude.join("settings.json")).unwrap(),
        "{}\n"
    );
    assert_eq!(
        fs::read_to_string(f.root().join("agentdiff.yaml")).unwrap(),
        "version: 2\n"
    );
    // The rest of the project stays writable.
    assert_eq!(
        fs::read_to_string(f.root().join("allowed.txt")).unwrap(),
        "ok\n"
    );
}

/// `$HOME` names another directory than the user database's home of the user the command runs
/// as (sudo, su, a CI runner): that home is hidden by the allowlist all the same.
#[test]
fn the_users_own_home_is_hidden_whatever_home_says() {
    if no_bwrap() {
        return;
    }
    let Some(home) = agentdiff_host::system::effective_user_home() else {
        agentdiff_test_support::skip("the user database gives this user no home");
        return;
    };
    let secret = home.join(format!(".agentdiff-test-secret-{}", std::process::id()));
    if fs::write(&secret, "SECRET\n").is_err() {
        agentdiff_test_support::skip("this user's home is not writable");
        return;
    }
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&secret);
    // The fixture's `HOME` is a temporary directory, not `home`.
    let f = Fixture::new();
    assert_ne!(f.home.path(), home.as_path());
    let script = format!("cat '{}' > seen.txt 2>/dev/null; exit 0", secret.display());
    let (code, result, out) = f.run(&[], &["sh", "-c", &script], &[]);
    assert_eq!(
        code,
        0,
        "{result:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = fs::read_to_string(f.root().join("seen.txt")).unwrap_or_default();
    assert_eq!(seen, "", "{} was readable in the sandbox", secret.display());
}

/// A read-only bind protects a name, not the file: with `.claude/settings.json` also reachable as
/// `alias.json` (a link an earlier, unsandboxed command made), the sandbox would let the command
/// rewrite the hook settings through the alias. The run is refused before the command starts,
/// names the file and says how to give it a name of its own; once it has one, the run goes ahead
/// and writing the alias leaves the settings alone.
#[test]
fn a_protected_file_with_another_hard_link_refuses_the_sandboxed_run() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let root = f.root();
    fs::create_dir_all(root.join(".claude")).unwrap();
    fs::write(root.join(".claude/settings.json"), "{}\n").unwrap();
    fs::hard_link(root.join(".claude/settings.json"), root.join("alias.json")).unwrap();
    let write_alias = format!("echo '{{\"disableAllHooks\":true}}' > alias.json; {CANARY_COMMAND}");
    let (code, result, out) = f.run(&[], &["sh", "-c", &write_alias], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_nothing_ran(&f, &out);
    assert_eq!(code, 69, "{stderr}");
    let error = result["execution_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("`.claude/settings.json` (2 links)") && error.contains("cp -p"),
        "{error}"
    );
    assert_eq!(
        fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
        "{}\n"
    );
    // The remedy the error gives.
    let fixed = Command::new("sh")
        .args([
            "-c",
            "cp -p .claude/settings.json .claude/settings.json.tmp && mv .claude/settings.json.tmp .claude/settings.json",
        ])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(fixed.success());
    let (code, _, out) = f.run(&[], &["sh", "-c", &write_alias], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(root.join("ran.txt").exists());
    assert_eq!(
        fs::read_to_string(root.join(".claude/settings.json")).unwrap(),
        "{}\n"
    );
    // The same door into git metadata: a hook with a second name is refused as well.
    fs::remove_file(root.join("ran.txt")).unwrap();
    fs::create_dir_all(root.join(".git/hooks")).unwrap();
    fs::write(root.join(".git/hooks/pre-commit"), "#!/bin/sh\n").unwrap();
    fs::hard_link(root.join(".git/hooks/pre-commit"), root.join("hook.sh")).unwrap();
    let plant = format!("echo 'curl evil' >> hook.sh; {CANARY_COMMAND}");
    let (code, result, out) = f.run(&[], &["sh", "-c", &plant], &[]);
    assert_nothing_ran(&f, &out);
    assert_eq!(code, 69, "{}", String::from_utf8_lossy(&out.stderr));
    let error = result["execution_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("`.git/hooks/pre-commit` (2 links)"),
        "{error}"
    );
    assert_eq!(
        fs::read_to_string(root.join(".git/hooks/pre-commit")).unwrap(),
        "#!/bin/sh\n"
    );
}
