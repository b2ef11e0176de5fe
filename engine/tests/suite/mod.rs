mod hook_resolve;
mod policy;
mod rollback;
mod scanner;
mod store;

/// A test that cannot run here says why. Under `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` (CI) that is a
/// failure, never a skip; elsewhere it prints `SKIPPED (not a pass): <reason>`. (The same rule as
/// `agentdiff_conformance::skip_unless_required`, which the engine's tests cannot depend on.)
pub fn skip(reason: &str) {
    if std::env::var_os("AGENTDIFF_REQUIRE_REAL_BACKENDS").is_some_and(|v| v == "1") {
        panic!("cannot run here: {reason} (AGENTDIFF_REQUIRE_REAL_BACKENDS=1)");
    }
    // Straight to the real standard error: the test harness captures only `eprintln!`.
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED (not a pass): {reason}");
}
