//! `agentdiff __srt-exec-shim` (hidden): the program the srt backend starts inside the sandbox.
//! It marks "the command started" on the run's FIFO and then `exec`s the command's argv, so an
//! srt exit without the mark is recorded as srt's setup failure, not the command's exit code.
//! Every argument after the subcommand name is taken verbatim (`--`, `--help` and `-V` included)
//! and handed to `agentdiff_backend_srt::shim::run`.

use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
#[command(disable_help_flag = true, disable_version_flag = true)]
pub struct Args {
    /// `v1 MARKER ARGC ARGV…`, as written by the srt backend.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        num_args = 0..,
        value_parser = clap::value_parser!(OsString)
    )]
    pub args: Vec<OsString>,
}

/// Returns only when the command was not started; a started command replaces this process.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    Ok(ExitCode::from(agentdiff_backend_srt::shim::run(&args.args)))
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::{Parser, Subcommand};

    use super::Args;

    // Mirrors the variant in cli/mod.rs.
    #[derive(Debug, Parser)]
    #[command(name = "agentdiff", version)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(Debug, Subcommand)]
    enum Command {
        #[command(name = "__srt-exec-shim", hide = true)]
        ExecShim(Args),
    }

    #[test]
    fn shim_arguments_pass_through_verbatim() {
        let tail: Vec<OsString> = [
            "v1",
            "/cap/srt-start-marker.fifo",
            "9",
            "tool",
            "--",
            "--help",
            "-h",
            "-V",
            "--version",
            "",
            "a b",
            "-c",
            "x\ny",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let mut argv = vec![
            OsString::from("agentdiff"),
            OsString::from("__srt-exec-shim"),
        ];
        argv.extend(tail.iter().cloned());
        let cli = Cli::try_parse_from(argv).unwrap();
        let Command::ExecShim(args) = cli.command;
        assert_eq!(args.args, tail);
        assert_eq!(
            agentdiff_backend_srt::shim::SHIM_SUBCOMMAND,
            "__srt-exec-shim"
        );
    }
}
