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

/// Headless chromium with a fresh profile, `extra` flags, `mode` (`--dump-dom` or
/// `--screenshot=FILE`) on `url`; its output, whatever the exit status.
fn chromium_run(chromium: &Path, extra: &str, mode: &str, url: &str) -> std::process::Output {
    let profile = tempfile::tempdir().unwrap();
    Command::new("timeout")
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
            extra,
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(mode)
        .arg(url)
        .output()
        .unwrap()
}

/// Headless chromium on `url` with `mode` (`--dump-dom` or `--screenshot=FILE`); its stdout.
fn browse(chromium: &Path, mode: &str, url: &str) -> String {
    let out = chromium_run(chromium, "--window-size=1200,1500", mode, url);
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

/// A headless chromium driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`:
/// JSON messages separated by NUL on fds 3 and 4, here two FIFOs), for what `--dump-dom` cannot
/// wait for.
struct Devtools {
    child: std::process::Child,
    to: std::fs::File,
    from: std::sync::mpsc::Receiver<serde_json::Value>,
    next_id: u64,
    session: Option<String>,
    _dir: tempfile::TempDir,
}

impl Drop for Devtools {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Devtools {
    fn start(chromium: &Path) -> Devtools {
        use std::io::Read;
        let dir = tempfile::tempdir().unwrap();
        let (to_path, from_path) = (dir.path().join("in"), dir.path().join("out"));
        for p in [&to_path, &from_path] {
            assert!(Command::new("mkfifo").arg(p).status().unwrap().success());
        }
        let child = Command::new("bash")
            .args([
                "-c",
                "exec \"$1\" --headless --no-sandbox --disable-gpu --no-first-run \
                 --disable-background-networking --disable-component-update --disable-sync \
                 --user-data-dir=\"$2\" --remote-debugging-pipe about:blank 3<\"$3\" 4>\"$4\"",
                "chromium",
            ])
            .arg(chromium)
            .arg(dir.path().join("profile"))
            .arg(&to_path)
            .arg(&from_path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let to = std::fs::OpenOptions::new()
            .write(true)
            .open(&to_path)
            .unwrap();
        let mut from_file = std::fs::File::open(&from_path).unwrap();
        let (tx, from) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 65536];
            while let Ok(n) = from_file.read(&mut chunk) {
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                while let Some(end) = buf.iter().position(|b| *b == 0) {
                    let msg: Vec<u8> = buf.drain(..=end).collect();
                    if let Ok(v) = serde_json::from_slice(&msg[..msg.len() - 1]) {
                        if tx.send(v).is_err() {
                            return;
                        }
                    }
                }
            }
        });
        Devtools {
            child,
            to,
            from,
            next_id: 0,
            session: None,
            _dir: dir,
        }
    }

    /// Sends one command and waits for its result.
    fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use std::io::Write;
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = serde_json::json!({ "id": id, "method": method, "params": params });
        if let Some(s) = &self.session {
            msg["sessionId"] = serde_json::Value::String(s.clone());
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).unwrap();
        loop {
            let v = self
                .from
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|e| panic!("no answer to {method}: {e}"));
            if v["id"].as_u64() == Some(id) {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Opens `url` in a new tab and talks to that tab from now on.
    fn open(&mut self, url: &str) {
        let target = self.call("Target.createTarget", serde_json::json!({ "url": url }));
        let attached = self.call(
            "Target.attachToTarget",
            serde_json::json!({ "targetId": target["targetId"], "flatten": true }),
        );
        self.session = attached["sessionId"].as_str().map(str::to_string);
    }

    /// Evaluates `expr` in the page until it gives a string for which `done` holds.
    fn wait_for(&mut self, expr: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let r = self.call(
                "Runtime.evaluate",
                serde_json::json!({ "expression": expr, "returnByValue": true }),
            );
            let text = r["result"]["value"].as_str().unwrap_or("").to_string();
            if done(&text) || std::time::Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

/// The dashboard open in the browser shows, as they happen, the events of a run started after
/// the page connected, and its outcome once sealed; a wrong token of the same length and a
/// rebound host name get refusals instead of runs.
#[test]
fn chromium_dashboard_streams_a_run_started_after_the_page_opened() {
    let Some(chromium) = chromium() else {
        skip_unless_required("chromium is not installed (apt-get install chromium)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // `serve` needs a store.
    let first = agentdiff(dir.path(), &["run", "--run-id", "first-1", "--", "true"]);
    assert!(first.status.code().is_some(), "{first:?}");
    let server = serve(dir.path());
    let mut wrong = server.token.clone();
    wrong.replace_range(31.., if wrong.ends_with('0') { "1" } else { "0" });
    let refused = browse(
        &chromium,
        "--dump-dom",
        &format!("http://127.0.0.1:{}/?token={wrong}", server.port),
    );
    assert!(refused.contains("unauthorized"), "{refused}");
    // DNS rebinding: a foreign name resolving to 127.0.0.1, with the right token.
    let rebound = chromium_run(
        &chromium,
        "--host-resolver-rules=MAP rebind.example 127.0.0.1",
        "--dump-dom",
        &format!(
            "http://rebind.example:{}/?token={}",
            server.port, server.token
        ),
    );
    let rebound = String::from_utf8_lossy(&rebound.stdout);
    assert!(rebound.contains("forbidden: the Host header"), "{rebound}");

    let mut devtools = Devtools::start(&chromium);
    devtools.open(&format!(
        "http://127.0.0.1:{}/?token={}",
        server.port, server.token
    ));
    let state = devtools.wait_for(
        "(document.getElementById('live-state')||{}).textContent||''",
        |s| s == "connected",
    );
    assert_eq!(state, "connected");
    let run = agentdiff(
        dir.path(),
        &[
            "run",
            "--run-id",
            "live-1",
            "--",
            "sh",
            "-c",
            "echo x > new.txt",
        ],
    );
    assert!(run.status.code().is_some(), "{run:?}");
    let live = devtools.wait_for(
        "Array.from(document.querySelectorAll('#live li')).map(e=>e.textContent).join('\\n')",
        |s| s.contains("live-1 · sealed"),
    );
    assert!(live.contains("live-1 · capsule_created"), "{live}");
    assert!(
        live.contains("live-1 · sealed: status review, 1 change(s)"),
        "{live}"
    );
}

#[test]
fn chromium_shows_a_session_page_with_the_agents_text_as_text() {
    let Some(chromium) = chromium() else {
        skip_unless_required("chromium is not installed (apt-get install chromium)");
        return;
    };
    let (_dir, root, id) = super::session_cli::ended_session();
    let server = serve(&root);
    let index_url = format!("http://127.0.0.1:{}/?token={}", server.port, server.token);
    let index = browse(&chromium, "--dump-dom", &index_url);
    assert!(index.contains(&format!(">{id}</a>")), "{index}");
    assert!(index.contains("id=\"sessions\""), "{index}");
    let url = format!(
        "http://127.0.0.1:{}/session/{id}?token={}",
        server.port, server.token
    );
    let dom = browse(&chromium, "--dump-dom", &url);
    assert!(dom.contains("toolu_env") && dom.contains("denied"), "{dom}");
    assert!(
        dom.contains("unattributed") || dom.contains("toolu_w"),
        "{dom}"
    );
    // The agent's path is text in a cell, never an element.
    assert!(!dom.contains("<img"), "{dom}");
    assert!(dom.contains("&lt;img src=x onerror=alert(1)&gt;"), "{dom}");
    let shot = screens_dir().join("session.png");
    browse(&chromium, &format!("--screenshot={}", shot.display()), &url);
    assert!(std::fs::metadata(&shot).unwrap().len() > 1000);
}
