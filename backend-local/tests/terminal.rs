//! Terminal tests of the local backend, in a binary of their own.
//!
//! tmux's server daemonizes. In the `all` binary, other tests run the backend in-process, which
//! makes the test process a child subreaper: the tmux server (and the shell in its pane) would be
//! reparented to it and claimed as a leftover by whichever in-process run is then ending, killing
//! the terminal under these tests. Cargo runs test binaries one after another, so here no run of
//! another test can claim them.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "terminal/cases.rs"]
mod cases;
#[allow(dead_code)]
#[path = "suite/common.rs"]
mod common;
