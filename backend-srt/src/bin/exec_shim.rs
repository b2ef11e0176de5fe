//! The exec shim as a standalone program for tests that run without the `agentdiff` binary. It
//! takes the same arguments as `agentdiff __srt-exec-shim` and runs the same code.

use std::ffi::OsString;
use std::process::ExitCode;

use agentdiff_backend_srt::shim;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.split_first() {
        Some((first, rest)) if first == shim::SHIM_SUBCOMMAND => ExitCode::from(shim::run(rest)),
        _ => {
            eprintln!(
                "usage: agentdiff-srt-exec-shim {} {} MARKER ARGC ARGV…",
                shim::SHIM_SUBCOMMAND,
                shim::SHIM_PROTOCOL
            );
            ExitCode::from(shim::SHIM_REFUSED_EXIT)
        }
    }
}
