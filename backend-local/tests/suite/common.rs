//! Shared helpers: launching through the backend, and guards that never leave processes behind.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use agentdiff_backend_api::{
    LaunchContext, LaunchSpec, ProcessIdentity, RunEvidence, RuntimeBackend, StdioMode,
};
use agentdiff_backend_local::LocalBackend;
use agentdiff_conformance::testing::launch_spec;

/// Runs that rely on `/proc` polling claim orphans of the test process; one at a time keeps the
/// attribution of each test's daemons unambiguous.
static POLL_RUNS: Mutex<()> = Mutex::new(());

pub fn poll_lock() -> MutexGuard<'static, ()> {
    POLL_RUNS.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn spec(dir: &Path, argv: &[&str]) -> LaunchSpec {
    // The host PATH: tests run programs found wherever the host keeps them.
    launch_spec(dir, argv.iter().copied())
        .var("PATH", std::env::var_os("PATH").unwrap_or_default())
        .grace(Duration::from_millis(500))
        .build()
}

pub fn with_tracking(mut s: LaunchSpec, tracking: &str) -> LaunchSpec {
    s.options.push("tracking", tracking);
    s
}

pub fn files(dir: &Path) -> StdioMode {
    StdioMode::Files {
        stdin: None,
        stdout: dir.join("stdout.txt"),
        stderr: dir.join("stderr.txt"),
    }
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Launch through the backend with files for stdio and wait for the evidence.
pub fn run(spec: LaunchSpec) -> RunEvidence {
    let dir = spec.workdir.clone();
    run_ctx(spec, LaunchContext::new(files(&dir)))
}

pub fn run_ctx(spec: LaunchSpec, ctx: LaunchContext) -> RunEvidence {
    runtime().block_on(async {
        let b = LocalBackend::new();
        let prepared = b.prepare(&spec).unwrap();
        let running = b.launch(prepared, ctx).await.unwrap();
        running.wait().await.unwrap()
    })
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Whether the identity still names a live (non-zombie) process.
pub fn alive(id: &ProcessIdentity) -> bool {
    agentdiff_process::read_stat(id.pid)
        .map(|s| s.start_time_ticks == id.start_time_ticks && !s.is_zombie())
        .unwrap_or(false)
}

/// Kills, at drop, every pid listed in the given pid files that still runs `sleep`, so a failing
/// daemon test never leaves a `sleep 300` behind.
pub struct PidFileGuard(pub Vec<PathBuf>);

impl Drop for PidFileGuard {
    fn drop(&mut self) {
        for f in &self.0 {
            for word in read(f).split_whitespace() {
                let Ok(pid) = word.parse::<i32>() else {
                    continue;
                };
                let is_sleep = agentdiff_process::read_stat(pid as u32)
                    .map(|s| s.comm == "sleep")
                    .unwrap_or(false);
                if is_sleep {
                    // SAFETY: kill(2) of a test-owned sleeper identified by its pid file.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
    }
}

/// Wait until `path` exists (up to `limit`).
pub fn wait_for_file(path: &Path, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if path.exists() && !read(path).is_empty() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

pub fn harness() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agentdiff-local-harness"))
}

/// A test that cannot run here says why; under `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` it fails.
pub fn skip(reason: &str) {
    agentdiff_conformance::skip_unless_required(&format!("backend-local: {reason}"));
}
