//! Integration tests of the container backend (one binary; see suite/).
// Test helpers outside #[test] functions may panic on setup failures too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;
