//! The `agentdiff` command: wraps one command in an evidence transaction.
//!
//! Each subcommand lives in its own file under `cli/`. Exit codes are defined in `common/exit.rs` and
//! documented in docs/cli.md.

// Link every built-in backend so its `inventory` registration survives linking
// (dtolnay/inventory#50).
use agentdiff_backend_bwrap as _;
use agentdiff_backend_container as _;
use agentdiff_backend_local as _;
use agentdiff_backend_srt as _;

#[macro_use]
mod common;
mod cli;
#[cfg(test)]
mod cli_names;
mod serve;

use std::ffi::OsString;
use std::process::ExitCode;

use agentdiff_plugins::Registry;
use agentdiff_process::exec_shim;

use crate::common::{exit, out};

/// Makes this process non-dumpable, so processes of the same user — the watched command among
/// them — cannot open `/proc/<agentdiff>/fd/*` (the run's private spool and lock files), read its
/// memory (the per-user key) or attach to it: those accesses need ptrace permission, which the
/// kernel refuses for a non-dumpable process without CAP_SYS_PTRACE. The command itself is not
/// affected: `execve` makes every new program dumpable again.
///
/// Not defended: root, or a process with CAP_SYS_PTRACE.
fn harden_process() {
    #[cfg(target_os = "linux")]
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        // Only possible on a kernel without prctl; the run's evidence does not depend on it, so
        // this is said, not fatal.
        eprintln!("agentdiff: warning: could not make the process non-dumpable: {e}");
    }
}

fn main() -> ExitCode {
    // The exec shim (started by wrapping backends inside their sandbox) takes every following
    // argument verbatim, so it is dispatched before any option parsing.
    let argv: Vec<OsString> = std::env::args_os().collect();
    if let Some(rest) = shim_arguments(&argv) {
        return ExitCode::from(exec_shim::run(rest));
    }
    harden_process();
    let registry = match Registry::from_inventory() {
        Ok(r) => r,
        Err(err) => {
            eprintln!("agentdiff: error: the backend registry is inconsistent: {err}");
            return ExitCode::from(exit::INTERNAL);
        }
    };
    let cli = match cli::Cli::try_parse_with(&registry) {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version are not errors; everything else is a usage error, which for the
            // PreToolUse hook must block the call (any other non-zero exit lets Claude Code run
            // it), and for every other command, the session hooks included, is 64.
            let code = match (err.use_stderr(), cli::hook::failure_blocks(&argv)) {
                (false, _) => 0,
                (true, true) => cli::hook::HOOK_BLOCK,
                (true, false) => exit::USAGE,
            };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let code = match cli.dispatch() {
        Ok(code) => code,
        Err(err) => {
            let code = exit::code_of(&err);
            errln!("agentdiff: error: {}", exit::render(&err));
            ExitCode::from(code)
        }
    };
    // Output the user asked for was lost (not a closed pipe, which ends output quietly). A hook
    // whose answer was lost blocks the call.
    match out::failure() {
        Some(failure) => {
            errln!("agentdiff: error: {failure}");
            ExitCode::from(if cli::hook::failure_blocks(&argv) {
                cli::hook::HOOK_BLOCK
            } else {
                exit::INTERNAL
            })
        }
        None => code,
    }
}

/// The arguments after the hidden exec-shim subcommand, when `argv[1]` is it.
fn shim_arguments(argv: &[OsString]) -> Option<&[OsString]> {
    exec_shim::subcommand_arguments(argv.get(1..)?)
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::Path;

    use agentdiff_plugins::Registry;

    use super::{exec_shim, shim_arguments};

    /// The linker drops a backend crate nothing references (dtolnay/inventory#50); this pins the
    /// built-in set so a lost registration fails here rather than at a user's `--runtime`.
    #[test]
    fn the_built_in_backends_are_registered() {
        let registry = Registry::from_inventory().unwrap();
        #[cfg(target_os = "linux")]
        assert_eq!(registry.ids(), vec!["bwrap", "container", "local", "srt"]);
        #[cfg(not(target_os = "linux"))]
        assert_eq!(registry.ids(), vec!["container", "local", "srt"]);
    }

    /// Registration here is the one place the binary names a backend: the subcommand files and
    /// their shared helpers build everything (flags, validation, doctor, conformance cases) from
    /// descriptors. Every `.rs` file under `cli/`, `common/` and `serve/`, at any depth, is read
    /// through the lexer in `cli_names` (which has its own tests showing what it finds); main.rs
    /// may name backend crates only as `as _` registrations, so no subcommand can reach one
    /// through a re-export.
    #[test]
    fn no_subcommand_file_names_a_built_in_backend() {
        let registry = Registry::from_inventory().unwrap();
        let ids = registry.ids();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut offenders = Vec::new();
        let mut scanned = 0;
        let mut dirs = vec![src.join("cli"), src.join("common"), src.join("serve")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                    continue;
                }
                scanned += 1;
                let text = std::fs::read_to_string(&path).unwrap();
                for (line, what) in crate::cli_names::mentions(&text, &ids) {
                    offenders.push(format!("{}:{line}: names {what}", path.display()));
                }
            }
        }
        assert!(scanned >= 15, "only {scanned} files scanned under src/");
        let main = std::fs::read_to_string(src.join("main.rs")).unwrap();
        let code = main.split("\n#[cfg(test)]\nmod tests").next().unwrap();
        for line in code.lines().filter(|l| l.contains("agentdiff_backend_")) {
            let registration =
                line.starts_with("use agentdiff_backend_") && line.ends_with(" as _;");
            if !registration {
                offenders.push(format!("main.rs: not a registration: {line}"));
            }
        }
        assert!(offenders.is_empty(), "{}", offenders.join("\n"));
    }

    #[test]
    fn shim_arguments_pass_through_verbatim() {
        let tail: Vec<OsString> = [
            "v1",
            "/cap/m.fifo",
            "9",
            "tool",
            "--",
            "--help",
            "-h",
            "-V",
            "",
            "a b",
            "x\ny",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let mut argv = vec![
            OsString::from("agentdiff"),
            OsString::from(exec_shim::SHIM_SUBCOMMAND),
        ];
        argv.extend(tail.iter().cloned());
        assert_eq!(shim_arguments(&argv), Some(&tail[..]));
        // The earlier name stays accepted.
        argv[1] = OsString::from(exec_shim::LEGACY_SHIM_SUBCOMMAND);
        assert_eq!(shim_arguments(&argv), Some(&tail[..]));
        let run = [OsString::from("agentdiff"), OsString::from("run")];
        assert_eq!(shim_arguments(&run), None);
        assert_eq!(shim_arguments(&[OsString::from("agentdiff")]), None);
    }
}
