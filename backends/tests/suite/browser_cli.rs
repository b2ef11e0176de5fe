//! The HTML report and the dashboard in a real browser: headless Debian `chromium` loads them,
//! `--dump-dom` gives the DOM after scripts ran, and a screenshot of each is saved under
//! `target/tmp/review-screens/` for people to look at. Needs `chromium` (installed by `.ci/run`):
//! without it the test fails under `AGENTDIFF_REQUIRE_REAL_BACKENDS=1` and is otherwise skipped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

use agentdiff_conformance::skip_unless_required;

use super::agentdiff;
use super::html_cli::{hostile_run, project, SECRETS};
use super::serve_cli::serve;

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser"]
        .iter()
        .find_map(|name| which_executable(name))
}

/// `name` on PATH, if it is an executable file.
fn which_executable(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

fn screens_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("review-screens");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Headless chromium on `url` with `mode` (`--dump-dom` or `--screenshot=FILE`); its stdout.
fn browse(chromium: &Path, mode: &str, url: &str) -> String {
    let profile = tempfile::tempdir().unwrap();
    let out = Command::new("timeout")
        .arg("120")
        .arg(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1200,1500",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(mode)
        .arg(url)
        .output()
        .unwrap();
    assert!(out.status.success(), "chromium {mode} {url}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn assert_shows_run(dom: &str, id: &str) {
    assert!(dom.contains(id), "run id {id} missing: {dom}");
    for path in [
        "src/lib.rs",
        "id_ed25519",
        ".env",
        "notes.txt",
        "&lt;script&gt;alert(1)",
    ] {
        assert!(dom.contains(path), "{path} missing: {dom}");
    }
    for secret in SECRETS {
        assert!(!dom.contains(secret), "{secret} in the DOM");
    }
    // The filter script ran (allowed by its CSP hash): the form is shown.
    assert!(dom.contains("<form id=\"filters\" aria-label"), "{dom}");
    // No hostile name became an element.
    assert!(!dom.contains("<img"), "{dom}");
}

#[test]
fn chromium_shows_the_html_report_and_the_dashboard_without_secrets() {
    let Some(chromium) = chromium() else {
        skip_unless_required("chromium is not installed (apt-get install chromium)");
        return;
    };
    let dir = hostile_run("browser-1");
    let proj = project(&dir);
    let screens = screens_dir();

    let out = agentdiff(&proj, &["inspect", "browser-1", "--format", "html"]);
    assert!(out.status.success(), "{out:?}");
    let report = screens.join("report.html");
    std::fs::write(&report, &out.stdout).unwrap();
    let report_url = format!("file://{}", report.display());
    assert_shows_run(&browse(&chromium, "--dump-dom", &report_url), "browser-1");
    let shot = screens.join("report.png");
    browse(
        &chromium,
        &format!("--screenshot={}", shot.display()),
        &report_url,
    );
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);

    let server = serve(&proj);
    let index_url = format!("http://127.0.0.1:{}/?token={}", server.port, server.token);
    let index = browse(&chromium, "--dump-dom", &index_url);
    assert!(index.contains(">browser-1</a>"), "{index}");
    for secret in SECRETS {
        assert!(!index.contains(secret), "{secret} in the dashboard");
    }
    let shot = screens.join("dashboard.png");
    browse(
        &chromium,
        &format!("--screenshot={}", shot.display()),
        &index_url,
    );
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
    let run_url = format!(
        "http://127.0.0.1:{}/run/browser-1?token={}",
        server.port, server.token
    );
    assert_shows_run(&browse(&chromium, "--dump-dom", &run_url), "browser-1");
    // Without the token the browser gets the refusal, not the runs.
    let refused = browse(
        &chromium,
        "--dump-dom",
        &format!("http://127.0.0.1:{}/", server.port),
    );
    assert!(refused.contains("unauthorized"), "{refused}");
    assert!(!refused.contains("browser-1"), "{refused}");
    eprintln!("screenshots: {}", screens.display());
}
