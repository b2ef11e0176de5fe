//! The engine integration tests (one binary).

mod suite;
