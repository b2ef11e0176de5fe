//! Fuzz the policy loader: any text must load or fail with an error, never panic or blow up,
//! and a loaded policy must decide any path and command without panicking.
#![no_main]

use std::ffi::OsStr;

use agentdiff_policy::{Phase, Policy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for origin in ["fuzz.yaml", "fuzz.json"] {
        if let Ok(policy) = Policy::from_yaml_or_json(text, origin) {
            // The effective policy must load again as the same policy.
            let json = policy.to_json();
            let again = Policy::from_yaml_or_json(&json.to_string(), "effective.json");
            assert!(again.is_ok_and(|p| p.to_json() == json));
            for path in [".env", "src/a.rs", ".git", "a/b/c.pem", text] {
                let _ = policy.decide_path(path, Phase::PostRun);
            }
            let _ = policy.decide_command(OsStr::new(text));
        }
    }
});
