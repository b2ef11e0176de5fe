//! The exec shim as a standalone program for tests that run without the `agentdiff` binary. It
//! takes the same arguments as `agentdiff __srt-exec-shim` and runs the same engine code.

use std::ffi::OsString;
use std::process::ExitCode;

#[cfg(unix)]
fn main() -> ExitCode {
    use agentdiff_engine::process::exec_shim as shim;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match args.split_first() {
        Some((first, rest)) if first == shim::SHIM_SUBCOMMAND => ExitCode::from(shim::run(rest)),
        _ => {
            eprintln!(
                "usage: agentdiff-bwrap-exec-shim {} {} MARKER ARGC ARGV…",
                shim::SHIM_SUBCOMMAND,
                shim::SHIM_PROTOCOL
            );
            ExitCode::from(shim::SHIM_REFUSED_EXIT)
        }
    }
}

#[cfg(not(unix))]
fn main() -> ExitCode {
    let _: Vec<OsString> = Vec::new();
    eprintln!("the exec shim runs on Unix only");
    ExitCode::from(125)
}
