//! Integration tests of the example backend (one binary; cases under `suite/`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;
