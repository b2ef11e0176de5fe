//! A fake podman/docker CLI for tests: records every invocation (argv and the environment it got)
//! as one JSON line, answers the auxiliary calls the backend makes, and for `run` executes the
//! command on the host in the mounted workspace directory (or fails as configured).
//!
//! Configuration (environment of the engine client):
//! - `FAKE_ENGINE_LOG`: file to append invocations to (required).
//! - `FAKE_ENGINE_KIND`: `podman` (default) or `docker`, for `--version`.
//! - `FAKE_ENGINE_IMAGES`: comma-separated images present locally.
//! - `FAKE_ENGINE_RUN`: `exec` (default), `oci-fail` (container created, never started, exit 126),
//!   `engine-fail` (exit 125 before creating anything), `hang` (runs until `stop`).
//! - `FAKE_ENGINE_PS`: comma-separated container ids `ps` reports for any label filter.
//! - `FAKE_ENGINE_VERSION_FAIL`, `FAKE_ENGINE_SERVER_FAIL`: make `--version` / `version` and
//!   `info` fail.
//! - `FAKE_ENGINE_NAME`: the host name `info` reports (default: this machine's).
//! - `FAKE_ENGINE_STATE`: directory for the pid of a running `run` (so `stop`/`rm -f` can end it);
//!   defaults to the directory of `FAKE_ENGINE_LOG`.
//!
//! - `init` succeeds and `inspect --format {{.State.Pid}}` prints the fake's caller: a
//!   "container" without a network namespace of its own (`network: filtered` must refuse it).
//! - Remote mode (`create`, `cp`, `start`, `info`): `create` records the run argv in the state
//!   directory and prints the container id; `cp - ID:/workspace` unpacks the uploaded tar into
//!   `STATE/volume` (with the system `tar`); `start -a -i ID` runs the recorded command there;
//!   `cp ID:/workspace/. -` writes `STATE/volume` as a tar, or the bytes of the file named by
//!   `FAKE_ENGINE_ARCHIVE_OUT` (a hostile engine); `rm -f ID` removes the container, after which
//!   `ps --filter id=ID` lists nothing (unless `FAKE_ENGINE_RM_KEEPS` is set), and only with `-v`
//!   its volume `fakevol`; `inspect --format {{range .Mounts}}…` lists `fakevol` while it
//!   exists, `volume inspect fakevol` succeeds while it exists and `volume rm fakevol` removes
//!   it.
//!
//! Like a container's pid namespace, everything the command starts ends with it: `run` is a child
//! subreaper, so daemons re-parent to it, and it kills what is left when the command exits;
//! `stop` and `rm -f` kill the running `run`'s whole tree.

use std::io::Write;
use std::process::ExitCode;

const FAKE_CID: &str = "0f0e0d0c0b0a09080706050403020100f0e0d0c0b0a09080706050403020100f";
const FAKE_VOLUME: &str = "fakevol";

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    if let Err(e) = record(&argv) {
        eprintln!("fake engine: cannot record invocation: {e}");
        return ExitCode::from(125);
    }
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let first = argv.first().map(String::as_str).unwrap_or("");
    match first {
        "--version" => {
            if !var("FAKE_ENGINE_VERSION_FAIL").is_empty() {
                eprintln!("Error: fake engine is broken");
                return ExitCode::from(1);
            }
            if var("FAKE_ENGINE_KIND") == "docker" {
                println!("Docker version 99.0.0-fake, build fake");
            } else {
                println!("podman version 99.0.0-fake");
            }
            ExitCode::SUCCESS
        }
        "version" => {
            if !var("FAKE_ENGINE_SERVER_FAIL").is_empty() {
                eprintln!("Cannot connect to the Docker daemon at unix:///nowhere. Is the docker daemon running?");
                return ExitCode::from(1);
            }
            println!("99.0.0-fake");
            ExitCode::SUCCESS
        }
        "image" => {
            let image = argv.last().cloned().unwrap_or_default();
            let present = var("FAKE_ENGINE_IMAGES").split(',').any(|i| i == image);
            match argv.get(1).map(String::as_str) {
                Some("exists") => ExitCode::from(if present { 0 } else { 1 }),
                Some("inspect") if present => {
                    println!("sha256:{}", "ab".repeat(32));
                    ExitCode::SUCCESS
                }
                _ => {
                    eprintln!("Error: {image}: image not known");
                    ExitCode::from(125)
                }
            }
        }
        "events" => {
            if var("FAKE_ENGINE_RUN") != "oci-fail" {
                println!("start");
            }
            ExitCode::SUCCESS
        }
        "ps" => {
            if let Some(id) = argv.iter().find_map(|a| a.strip_prefix("id=")) {
                let created = state_dir().join("created.json").exists();
                let removed = state_dir().join("removed").exists();
                if id == FAKE_CID
                    && created
                    && (!removed || !var("FAKE_ENGINE_RM_KEEPS").is_empty())
                {
                    println!("{FAKE_CID}");
                }
                return ExitCode::SUCCESS;
            }
            for id in var("FAKE_ENGINE_PS").split(',').filter(|s| !s.is_empty()) {
                println!("{id}");
            }
            ExitCode::SUCCESS
        }
        "info" => {
            if !var("FAKE_ENGINE_SERVER_FAIL").is_empty() {
                eprintln!("Cannot connect to the Docker daemon at unix:///nowhere.");
                return ExitCode::from(1);
            }
            // The host name: FAKE_ENGINE_NAME, else this machine's (a local engine).
            let name = match var("FAKE_ENGINE_NAME") {
                n if !n.is_empty() => n,
                _ => std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .unwrap_or_default()
                    .trim()
                    .to_string(),
            };
            let reply = serde_json::json!({
                "id": "FAKEENGINE",
                "name": name,
                "version": "99.0.0-fake",
                "os": "linux",
                "arch": "amd64",
            });
            println!("{reply}");
            ExitCode::SUCCESS
        }
        "create" => create(&argv[1..]),
        // `init` succeeds; the "container's" pid is the engine's caller, which shares every
        // namespace with it: a lying engine whose container has no network namespace of its own.
        "init" => ExitCode::SUCCESS,
        "inspect" if argv.iter().any(|a| a == "{{.State.Pid}}") => {
            println!("{}", std::os::unix::process::parent_id());
            ExitCode::SUCCESS
        }
        "start" => start(),
        "cp" => copy(&argv[1..]),
        "inspect" if argv.iter().any(|a| a.contains(".Mounts")) => {
            if state_dir().join("created.json").exists() && state_dir().join("volume").exists() {
                println!("{FAKE_VOLUME} ");
            }
            ExitCode::SUCCESS
        }
        "volume" => volume(&argv),
        "rm" | "stop" => remove_or_stop(&argv),
        "run" => run(&argv[1..], None),
        _ => {
            eprintln!("fake engine: unsupported invocation {argv:?}");
            ExitCode::from(125)
        }
    }
}

/// `volume inspect|rm NAME`: the fake's one volume, present until removed.
fn volume(argv: &[String]) -> ExitCode {
    let named = argv.iter().any(|a| a == FAKE_VOLUME);
    let exists = named && state_dir().join("volume").exists();
    match argv.get(1).map(String::as_str) {
        Some("inspect") if exists => ExitCode::SUCCESS,
        Some("rm") => {
            if exists {
                let _ = std::fs::remove_dir_all(state_dir().join("volume"));
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("Error: no such volume");
            ExitCode::from(1)
        }
    }
}

/// `rm [-f] [-v] ID` and `stop ID`: the container (with its volume under `-v`) goes; the running
/// `run` and everything it started end.
fn remove_or_stop(argv: &[String]) -> ExitCode {
    if argv.first().map(String::as_str) == Some("rm") && argv.iter().any(|a| a == FAKE_CID) {
        if argv.iter().any(|a| a == "-v") {
            let _ = std::fs::remove_dir_all(state_dir().join("volume"));
        }
        let _ = std::fs::write(state_dir().join("removed"), "");
    }
    if let Ok(pid) = std::fs::read_to_string(state_dir().join("run.pid")) {
        if let Ok(pid) = pid.trim().parse::<u32>() {
            // The container's processes end with it; then the `run` itself.
            kill_descendants(pid);
            // SAFETY: plain kill(2) on a pid this fake wrote itself.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
        }
    }
    ExitCode::SUCCESS
}

fn record(argv: &[String]) -> std::io::Result<()> {
    let Some(log) = std::env::var_os("FAKE_ENGINE_LOG") else {
        return Ok(());
    };
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let line = serde_json::json!({ "argv": argv, "env": env });
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    writeln!(f, "{line}")
}

/// Remote `create`: remember the argv (as for `run`), print the id.
fn create(args: &[String]) -> ExitCode {
    let state = state_dir();
    let saved = serde_json::to_string(args).unwrap_or_default();
    if std::fs::write(state.join("created.json"), saved).is_err()
        || std::fs::create_dir_all(state.join("volume")).is_err()
    {
        return ExitCode::from(125);
    }
    println!("{FAKE_CID}");
    ExitCode::SUCCESS
}

/// Remote `start -a -i ID`: the created argv, run in the volume.
fn start() -> ExitCode {
    let state = state_dir();
    let Ok(text) = std::fs::read_to_string(state.join("created.json")) else {
        eprintln!("Error: no such container");
        return ExitCode::from(125);
    };
    let args: Vec<String> = serde_json::from_str(&text).unwrap_or_default();
    run(&args, Some(state.join("volume")))
}

/// `cp - ID:/workspace` (upload) or `cp ID:/workspace/. -` (download), through the system tar.
fn copy(args: &[String]) -> ExitCode {
    let volume = state_dir().join("volume");
    let upload =
        args.iter().any(|a| a == "-") && args.last().is_some_and(|a| a.ends_with(":/workspace"));
    let status = if upload {
        std::process::Command::new("tar")
            .arg("-x")
            .arg("-C")
            .arg(&volume)
            .arg("-f")
            .arg("-")
            .status()
    } else if let Some(file) = std::env::var_os("FAKE_ENGINE_ARCHIVE_OUT") {
        let copied = std::fs::File::open(file)
            .and_then(|mut f| std::io::copy(&mut f, &mut std::io::stdout().lock()));
        return if copied.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        };
    } else {
        std::process::Command::new("tar")
            .arg("-c")
            .arg("-C")
            .arg(&volume)
            .arg("-f")
            .arg("-")
            .arg(".")
            .status()
    };
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        _ => {
            eprintln!("Error: copying failed");
            ExitCode::from(1)
        }
    }
}

fn run(args: &[String], volume: Option<std::path::PathBuf>) -> ExitCode {
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let mode = var("FAKE_ENGINE_RUN");
    if mode == "engine-fail" {
        eprintln!("Error: fake engine failed before creating the container");
        return ExitCode::from(125);
    }
    let mut i = 0;
    let mut cidfile = None;
    let mut workspace = None;
    let mut env_names = Vec::new();
    let mut rootfs = false;
    while i < args.len() {
        match args[i].as_str() {
            "--" => break,
            "--cidfile" => {
                cidfile = args.get(i + 1).cloned();
                i += 1;
            }
            "-v" => {
                workspace = args
                    .get(i + 1)
                    .and_then(|v| v.strip_suffix(":/workspace"))
                    .map(str::to_string);
                i += 1;
            }
            "--env" => {
                env_names.extend(args.get(i + 1).cloned());
                i += 1;
            }
            "--rootfs" | "--rm" | "--read-only" | "--init" | "--interactive" => {
                rootfs |= args[i] == "--rootfs";
            }
            _ => i += 1,
        }
        i += 1;
    }
    // args[i] is "--": then the image or rootfs, then the command.
    let Some(source) = args.get(i + 1) else {
        eprintln!("Error: no image");
        return ExitCode::from(125);
    };
    if !rootfs && !var("FAKE_ENGINE_IMAGES").split(',').any(|s| s == source) {
        eprintln!("Error: {source}: image not known");
        return ExitCode::from(125);
    }
    let command = &args[(i + 2).min(args.len())..];
    if let Some(c) = &cidfile {
        if std::fs::write(c, FAKE_CID).is_err() {
            return ExitCode::from(125);
        }
    }
    if mode == "oci-fail" {
        eprintln!("Error: runc: runc create failed: unable to start container process: OCI permission denied");
        return ExitCode::from(126);
    }
    if std::fs::write(state_dir().join("run.pid"), std::process::id().to_string()).is_err() {
        return ExitCode::from(125);
    }
    if mode == "hang" {
        loop {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
    let Some((program, rest)) = command.split_first() else {
        return ExitCode::from(125);
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(rest).env_clear();
    for name in &env_names {
        if let Some(v) = std::env::var_os(name) {
            cmd.env(name, v);
        }
    }
    cmd.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    if let Some(w) = volume.or(workspace.map(std::path::PathBuf::from)) {
        cmd.current_dir(w);
    }
    // SAFETY: prctl with constant arguments; only affects this process.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    let code = match cmd.status() {
        Ok(s) => ExitCode::from(s.code().map(|c| c as u8).unwrap_or(137)),
        Err(_) => ExitCode::from(127),
    };
    // The container is gone: so is everything its command started.
    kill_descendants(std::process::id());
    code
}

fn state_dir() -> std::path::PathBuf {
    match std::env::var_os("FAKE_ENGINE_STATE") {
        Some(d) if !d.is_empty() => d.into(),
        _ => std::env::var_os("FAKE_ENGINE_LOG")
            .map(std::path::PathBuf::from)
            .and_then(|l| l.parent().map(|p| p.to_path_buf()))
            .unwrap_or_else(std::env::temp_dir),
    }
}

/// Parent pid of every process, from /proc.
fn parents() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if let Some(ppid) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
            out.push((pid, ppid));
        }
    }
    out
}

/// SIGKILL every descendant of `root` (repeatedly: a dying parent re-parents its children to
/// the subreaper) and reap what is ours.
fn kill_descendants(root: u32) {
    for _ in 0..50 {
        let all = parents();
        let mut tree = vec![root];
        let mut i = 0;
        while i < tree.len() {
            let p = tree[i];
            tree.extend(all.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
            i += 1;
        }
        if tree.len() == 1 {
            return;
        }
        for pid in &tree[1..] {
            // SAFETY: kill(2); a pid that vanished in between gives ESRCH, which is fine.
            unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: non-blocking reap of any of our children.
        while unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) } > 0 {}
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
