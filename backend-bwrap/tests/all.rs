//! Integration tests of the bwrap backend (one test binary; modules under `suite/`).
// Tests may unwrap and panic: a failure is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[cfg(target_os = "linux")]
mod suite;
