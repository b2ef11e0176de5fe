//! Fuzz hook input parsing and evaluation: malformed input must be an error, never a panic.
#![no_main]

use agentdiff_policy::{hook, Policy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(call) = hook::ToolCall::parse(text) {
        let root = std::env::temp_dir();
        let _ = hook::evaluate(&Policy::builtin(), &root, &call);
    }
});
