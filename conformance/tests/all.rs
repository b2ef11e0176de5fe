//! Integration tests of the conformance suite (one binary; modules under `suite/`).
mod suite;
