//! The exec shim as a standalone program for tests that run without the `agentdiff` binary. It
//! takes the same arguments as `agentdiff __exec-shim` and runs the same engine code.

use std::process::ExitCode;

#[cfg(unix)]
fn main() -> ExitCode {
    ExitCode::from(agentdiff_process::exec_shim::standalone_main(
        "agentdiff-bwrap-exec-shim",
    ))
}

#[cfg(not(unix))]
fn main() -> ExitCode {
    eprintln!("the exec shim runs on Unix only");
    ExitCode::from(125)
}
