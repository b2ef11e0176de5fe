//! Integration tests of the srt backend: a fake srt for argv, redaction, exit codes and the
//! setup-failure distinction; the real srt for enforcement that agentdiff still only labels
//! `requested`.

// Test helpers outside `#[test]` functions may fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod suite;
