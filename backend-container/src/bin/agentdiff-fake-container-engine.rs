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
//! - `FAKE_ENGINE_VERSION_FAIL`, `FAKE_ENGINE_SERVER_FAIL`: make `--version` / `version` fail.
//! - `FAKE_ENGINE_STATE`: directory for the pid of a hanging `run` (so `stop` can end it).

use std::io::Write;
use std::process::ExitCode;

const FAKE_CID: &str = "0f0e0d0c0b0a09080706050403020100f0e0d0c0b0a09080706050403020100f";

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
            for id in var("FAKE_ENGINE_PS").split(',').filter(|s| !s.is_empty()) {
                println!("{id}");
            }
            ExitCode::SUCCESS
        }
        "rm" => ExitCode::SUCCESS,
        "stop" => {
            let state = var("FAKE_ENGINE_STATE");
            if let Ok(pid) = std::fs::read_to_string(format!("{state}/run.pid")) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: plain kill(2) on a pid this fake wrote itself.
                    unsafe {
                        libc::kill(pid, libc::SIGTERM);
                    }
                }
            }
            ExitCode::SUCCESS
        }
        "run" => run(&argv[1..]),
        _ => {
            eprintln!("fake engine: unsupported invocation {argv:?}");
            ExitCode::from(125)
        }
    }
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

fn run(args: &[String]) -> ExitCode {
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
            "--rootfs" | "--rm" | "--read-only" | "--init" => {
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
    if mode == "hang" {
        let state = var("FAKE_ENGINE_STATE");
        if std::fs::write(format!("{state}/run.pid"), std::process::id().to_string()).is_err() {
            return ExitCode::from(125);
        }
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
    if let Some(w) = workspace {
        cmd.current_dir(w);
    }
    match cmd.status() {
        Ok(s) => ExitCode::from(s.code().map(|c| c as u8).unwrap_or(137)),
        Err(_) => ExitCode::from(127),
    }
}
