//! The `agentdiff` command: wraps one command in an evidence transaction.
//!
//! Each subcommand lives in its own file under `cli/`. Exit codes are defined in `exit.rs` and
//! documented in docs/cli.md.

// Link every built-in backend so its `inventory` registration survives linking
// (dtolnay/inventory#50).
use agentdiff_backend_bwrap as _;
use agentdiff_backend_container as _;
use agentdiff_backend_local as _;
use agentdiff_backend_srt as _;

#[macro_use]
mod out;
mod cli;
mod exit;
mod report;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version are not errors; everything else is a usage error.
            let code = if err.use_stderr() { exit::USAGE } else { 0 };
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
    // Output the user asked for was lost (not a closed pipe, which ends output quietly).
    match out::failure() {
        Some(failure) => {
            errln!("agentdiff: error: {failure}");
            ExitCode::from(exit::INTERNAL)
        }
        None => code,
    }
}

#[cfg(test)]
mod tests {
    use agentdiff_engine::backend::Registry;

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
}
