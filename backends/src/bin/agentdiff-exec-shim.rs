//! `agentdiff-exec-shim`: the exec shim that wrapping backends start inside their sandbox, as a
//! program of its own. It runs the same engine code as `agentdiff __exec-shim` and takes the same
//! arguments; `agentdiff` uses it when it is installed beside it (`cargo install` installs both),
//! because it starts faster than the whole CLI (see `exec_shim::installed_beside`).

use std::process::ExitCode;

#[cfg(unix)]
fn main() -> ExitCode {
    ExitCode::from(agentdiff_process::exec_shim::standalone_main(
        agentdiff_process::exec_shim::STANDALONE_SHIM,
    ))
}

#[cfg(not(unix))]
fn main() -> ExitCode {
    eprintln!("the exec shim runs on Unix only");
    ExitCode::from(125)
}
