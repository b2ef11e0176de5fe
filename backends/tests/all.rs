//! Integration tests of the `agentdiff` binary (one test binary; modules under `suite/`).

mod suite;
