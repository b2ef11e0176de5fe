//! Test fixtures shared by the test suites of every agentdiff crate: the skip rule, programs
//! written so they can be executed at once, a fake container engine, a real "remote" podman
//! service, an in-place rewrite.
//!
//! A dev-dependency only: no product crate links it. It sits just above `agentdiff-host`, so the
//! lowest crates' unit tests can use it without linking a second copy of anything above them.
//! Fixtures that record whole runs need the engine's types and live with the engine's tests.

use std::path::Path;

pub mod remote_engine;
pub mod rootfs;

/// A test that cannot run here says why. Under `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` (CI) that is a
/// failure, never a skip; elsewhere it prints `SKIPPED (not a pass): <reason>` and the caller
/// returns. (The same rule as `agentdiff_conformance::skip_unless_required`.)
pub fn skip(reason: &str) {
    if std::env::var_os("AGENTDIFF_REQUIRE_REAL_BACKENDS").is_some_and(|v| v == "1") {
        // A test-support function: failing the calling test is its purpose.
        #[allow(clippy::panic)]
        {
            panic!("cannot run here: {reason} (AGENTDIFF_REQUIRE_REAL_BACKENDS=1)");
        }
    }
    // Straight to the real standard error: the test harness captures only `eprintln!`.
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED (not a pass): {reason}");
}

/// A podman-like engine API on the Unix socket `path`: `/_ping` answers `OK` with podman's
/// version header, every other request an empty event log. Returns how many connections it got
/// (a test asserts whether agentdiff asked at all).
#[allow(clippy::unwrap_used)]
pub fn fake_podman(path: &Path) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::os::unix::net::UnixListener::bind(path).unwrap();
    let count = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = std::sync::Arc::clone(&count);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { return };
            seen.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 2048];
            let n = c.read(&mut buf).unwrap_or(0);
            let body: &[u8] = if buf[..n].starts_with(b"GET /_ping") {
                b"OK"
            } else {
                b""
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nLibpod-Api-Version: 4.3.1\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            let _ = c.write_all(head.as_bytes());
            let _ = c.write_all(body);
        }
    });
    count
}

/// Rewrites `path` with `bytes` (the same size, for the attack it stands for) and puts its mtime
/// back, so only the ctime shows the write: what an unprivileged tamperer can hide at best.
#[allow(clippy::unwrap_used)]
pub fn rewrite_in_place(path: &Path, bytes: &[u8]) {
    let mtime = std::fs::metadata(path).unwrap().modified().unwrap();
    std::fs::write(path, bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
}

/// Writes the script `body` at `path` with permission bits `mode`, ready to be executed by any
/// process at once: never `fs::write` for a script a test runs (see
/// [`agentdiff_host::program_file`] for the ETXTBSY it avoids).
#[allow(clippy::unwrap_used)]
pub fn write_executable(path: &Path, body: &str, mode: u32) {
    agentdiff_host::program_file::write(path, body.as_bytes(), mode).unwrap();
}

/// Copies the program `from` to `to` with permission bits `mode`, ready to be executed at once:
/// never `fs::copy` for a program a test runs.
#[allow(clippy::unwrap_used)]
pub fn copy_executable(from: &Path, to: &Path, mode: u32) {
    agentdiff_host::program_file::copy(from, to, mode).unwrap();
}

/// Runs the `#[ignore]`d test `name` (its full path in this test binary) in a process of its
/// own, behind `prefix` (a program and its arguments, e.g. `unshare --mount`; empty for none),
/// and panics with its output unless it ran and passed. For a test that changes its whole
/// process (a resource limit, a mount namespace) where the other tests run alongside.
#[allow(clippy::panic)]
pub fn run_ignored_in_own_process(name: &str, prefix: &[&str]) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test binary: {e}"));
    let mut command = match prefix.split_first() {
        Some((program, args)) => {
            let mut c = std::process::Command::new(program);
            c.args(args).arg(exe);
            c
        }
        None => std::process::Command::new(exe),
    };
    let out = command
        .args(["--exact", name, "--ignored", "--nocapture"])
        .output()
        .unwrap_or_else(|e| panic!("running {name} in a process of its own: {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
