//! Integration tests of the srt backend: a fake srt for argv, redaction, exit codes and the
//! setup-failure distinction; the real srt for enforcement that agentdiff still only labels
//! `requested`.

mod suite;
