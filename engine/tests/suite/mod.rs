mod policy;
mod rollback;
mod scanner;
mod store;

/// A test that cannot run here says why. Under `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` (CI) that is a
/// failure, never a skip; elsewhere the reason is printed and counted in
/// `target/tmp/agentdiff-skips.log`, so it is never mistaken for a pass.
pub fn skip(reason: &str) {
    if std::env::var_os("AGENTDIFF_REQUIRE_REAL_BACKENDS").is_some_and(|v| v == "1") {
        panic!("cannot run here: {reason} (AGENTDIFF_REQUIRE_REAL_BACKENDS=1)");
    }
    eprintln!("SKIPPED (not a pass): {reason}");
    use std::io::Write;
    let log = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("agentdiff-skips.log");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
    {
        let _ = writeln!(f, "engine: {reason}");
    }
}
