//! Integration tests of agentdiff-engine (one test binary; modules under `suite/`).

mod suite;
