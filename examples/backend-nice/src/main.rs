//! `agentdiff-backend-nice`: the example backend as an external executable. Put it on `PATH` and
//! the stock `agentdiff` runs `--runtime nice` through it (docs/backend-protocol.md).

fn main() -> std::process::ExitCode {
    agentdiff_backend_api::serve::serve(&agentdiff_backend_nice::DESCRIPTOR)
}
