//! Integration tests of agentdiff-policy (one test binary; modules under `suite/`).
// Tests may unwrap and panic: a failure is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;
