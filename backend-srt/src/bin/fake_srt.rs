//! A stand-in for the srt CLI in tests. It appends one JSON line per invocation to the file
//! named by `FAKE_SRT_RECORD` (argv, cwd and environment, exactly as received), then behaves as
//! srt's command line does without any sandbox:
//!
//! - `--version` / `-V` prints `FAKE_SRT_VERSION` (default `0.0.0-fake`);
//! - `--settings FILE` must name an existing file (srt refuses a missing one with exit 1);
//! - everything after `--` is run as an argv, never through a shell, and its exit code is
//!   returned (a command killed by signal N gives 128+N, as srt 0.0.78 does);
//! - `FAKE_SRT_MODE=refuse` fails setup with exit 1 before running anything;
//!   `FAKE_SRT_MODE=broken-version` makes `--version` fail;
//!   `FAKE_SRT_MODE=alter` changes the last argument's content (a wrapper that mangles argv).
//!
//! `-c` is refused: agentdiff must never use it.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;

fn record(argv: &[OsString]) {
    let Some(path) = std::env::var_os("FAKE_SRT_RECORD") else {
        return;
    };
    // Bytes as arrays of numbers would be exact; UTF-8 strings are enough for the tests and keep
    // the record readable. Invalid UTF-8 is marked rather than hidden.
    let text = |s: &std::ffi::OsStr| match s.to_str() {
        Some(t) => serde_json::Value::String(t.to_string()),
        None => serde_json::json!({ "non_utf8": s.as_bytes() }),
    };
    let env: serde_json::Map<String, serde_json::Value> = std::env::vars_os()
        .map(|(k, v)| (k.to_string_lossy().into_owned(), text(&v)))
        .collect();
    let line = serde_json::json!({
        "argv": argv.iter().map(|a| text(a)).collect::<Vec<_>>(),
        "cwd": std::env::current_dir().map(|d| d.to_string_lossy().into_owned()).unwrap_or_default(),
        "env": env,
    });
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

fn record_settings(content: &str) {
    let Some(path) = std::env::var_os("FAKE_SRT_RECORD") else {
        return;
    };
    let line = serde_json::json!({ "settings_content": content });
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().collect();
    record(&argv);
    let mode = std::env::var("FAKE_SRT_MODE").unwrap_or_default();
    let mut rest = argv.iter().skip(1);
    let mut settings: Option<OsString> = None;
    let mut command: Vec<OsString> = Vec::new();
    while let Some(arg) = rest.next() {
        match arg.to_str() {
            Some("--version") | Some("-V") => {
                if mode == "broken-version" {
                    eprintln!("fake srt: broken install");
                    return ExitCode::from(1);
                }
                println!(
                    "{}",
                    std::env::var("FAKE_SRT_VERSION").unwrap_or_else(|_| "0.0.0-fake".into())
                );
                return ExitCode::SUCCESS;
            }
            Some("--settings") | Some("-s") => settings = rest.next().cloned(),
            Some("-d") | Some("--debug") => {}
            Some("-c") => {
                eprintln!("fake srt: -c (a shell string) is never acceptable");
                return ExitCode::from(2);
            }
            Some("--") => {
                command = rest.cloned().collect();
                break;
            }
            _ => {
                eprintln!("fake srt: unexpected argument {arg:?} before `--`");
                return ExitCode::from(2);
            }
        }
    }
    if mode == "refuse" {
        eprintln!("Error: fake srt setup failure");
        return ExitCode::from(1);
    }
    if let Some(s) = &settings {
        let Ok(content) = std::fs::read_to_string(s) else {
            eprintln!("Error: {} does not exist.", s.to_string_lossy());
            return ExitCode::from(1);
        };
        record_settings(&content);
    }
    if mode == "alter" {
        if let Some(last) = command.last_mut() {
            last.push("-altered");
        }
    }
    let Some((program, args)) = command.split_first() else {
        eprintln!("Error: No command specified.");
        return ExitCode::from(1);
    };
    match std::process::Command::new(program).args(args).status() {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(c), _) => ExitCode::from(c as u8),
            // As the real srt (0.0.78): a command killed by signal N exits 128+N.
            (None, Some(sig)) => ExitCode::from(128u8.saturating_add(sig as u8)),
            _ => ExitCode::from(1),
        },
        Err(e) => {
            eprintln!("Failed to execute command: {e}");
            ExitCode::from(1)
        }
    }
}
