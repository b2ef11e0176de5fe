//! `network.egress` under `--runtime bwrap` with real programs: the sandbox's only route out is
//! agentdiff's egress proxy. A local HTTP server on a loopback address is reached by names a
//! private `/etc/hosts` (a mount namespace of the test's own) maps to it; the policy lists the
//! loopback address, without which the proxy refuses a name that resolves there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use super::bwrap_cli::{no_bwrap, Fixture};

/// The server's address: loopback, but not 127.0.0.1, so the policy's address pattern is the
/// only thing that lets the proxy reach it.
pub(super) const SERVER_IP: &str = "127.0.0.7";
pub(super) const ALLOWED: &str = "pkgs.allowed.test";
pub(super) const DENIED: &str = "other.denied.test";
/// A Python with pip, outside any home the sandbox hides.
const PYTHON: &str = "/usr/bin/python3";

/// `python3 -m http.server` serving `dir` on [`SERVER_IP`]; killed on drop.
pub(super) struct Server {
    child: Child,
    pub(super) port: u16,
}

impl Server {
    pub(super) fn start(dir: &Path) -> Server {
        let mut child = Command::new(PYTHON)
            .args(["-u", "-m", "http.server", "--bind", SERVER_IP, "0"])
            .current_dir(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // "Serving HTTP on 127.0.0.7 port 41234 (http://127.0.0.7:41234/) ..."
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the server holds: a file, a bare git repository served over dumb HTTP, and a simple
/// index with one wheel built here.
fn serve_dir(dir: &Path) {
    fs::write(dir.join("hello.txt"), "hello through the proxy\n").unwrap();
    sh(
        dir,
        "git init -q work && cd work && echo egress > README && git add README && \
         git -c user.name=t -c user.email=t@t commit -qm init && cd .. && \
         git clone -q --bare work repo.git && cd repo.git && git update-server-info",
    );
    let wheel = r#"
import base64, hashlib, os, zipfile
name = "demo_pkg-1.0-py3-none-any.whl"
files = {
    "demo_pkg/__init__.py": b"VALUE = 'installed through the proxy'\n",
    "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
    "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = []
for path, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record.append(f"{path},sha256={digest},{len(data)}")
record.append("demo_pkg-1.0.dist-info/RECORD,,")
os.makedirs("simple/demo-pkg", exist_ok=True)
with zipfile.ZipFile(name, "w") as z:
    for path, data in files.items():
        z.writestr(path, data)
    z.writestr("demo_pkg-1.0.dist-info/RECORD", "\n".join(record) + "\n")
with open("simple/demo-pkg/index.html", "w") as f:
    f.write(f'<html><body><a href="../../{name}">{name}</a></body></html>\n')
"#;
    let out = Command::new(PYTHON)
        .args(["-c", wheel])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether the tools this test drives exist here; `None` names the missing one.
fn tools_missing() -> Option<&'static str> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("unshare", &["-m", "true"]) {
        return Some("a private mount namespace (unshare -m, root) for /etc/hosts");
    }
    if !works("curl", &["--version"]) {
        return Some("curl");
    }
    if !works("git", &["--version"]) {
        return Some("git");
    }
    if !works(PYTHON, &["-m", "pip", "--version"]) {
        return Some("/usr/bin/python3 with pip");
    }
    None
}

pub(super) fn records<'a>(rt: &'a Value, host: &str) -> Vec<&'a Value> {
    rt["network"]["egress"]["records"]
        .as_array()
        .unwrap_or_else(|| panic!("no network.egress records: {rt:#}"))
        .iter()
        .filter(|r| r["host"] == host)
        .collect()
}

#[test]
fn real_programs_reach_only_the_allowed_name_and_every_attempt_is_sealed() {
    if no_bwrap() {
        return;
    }
    if let Some(missing) = tools_missing() {
        agentdiff_conformance::skip_unless_required(missing);
        return;
    }
    let served = tempfile::tempdir().unwrap();
    serve_dir(served.path());
    let server = Server::start(served.path());
    let port = server.port;
    let f = Fixture::new();
    let hosts = f.home.path().join("hosts");
    fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n{SERVER_IP} {ALLOWED} {DENIED}\n"),
    )
    .unwrap();
    f.write_policy(format!(
        "version: 2\nnetwork:\n  egress:\n    allow:\n      - \"{ALLOWED}\"\n      - \"{SERVER_IP}\"\n"
    ));
    let url = |host: &str, path: &str| format!("http://{host}:{port}/{path}");
    // Each program ignores the machine's own configuration (a pip mirror in /etc/pip.conf, a
    // system gitconfig, a .curlrc): only the names this test asks for are contacted.
    let tries: Vec<(&str, String)> = vec![
        (
            "curl_allowed",
            format!("curl -q -sSf -m 60 {}", url(ALLOWED, "hello.txt")),
        ),
        (
            "curl_denied",
            format!("curl -q -sSf -m 60 {}", url(DENIED, "hello.txt")),
        ),
        (
            "curl_socks5",
            format!(
                "curl -q -sSf -m 60 -x \"$ALL_PROXY\" {}",
                url(ALLOWED, "hello.txt")
            ),
        ),
        (
            "git_clone",
            format!(
                "GIT_CONFIG_NOSYSTEM=1 git clone -q {} clone && test -f clone/README",
                url(ALLOWED, "repo.git")
            ),
        ),
        (
            "pip_install",
            format!(
                "PIP_CONFIG_FILE=/dev/null {PYTHON} -m pip install -q --no-cache-dir --timeout 60 \
                 --disable-pip-version-check --trusted-host {ALLOWED} --index-url {} --target site demo-pkg && \
                 test -f site/demo_pkg/__init__.py",
                url(ALLOWED, "simple/")
            ),
        ),
        (
            "raw_socket_server",
            format!(
                "{PYTHON} -c \"import socket; socket.create_connection(('{SERVER_IP}', {port}), \
                 timeout=5)\""
            ),
        ),
        (
            "raw_socket_outside",
            format!(
                "{PYTHON} -c \"import socket; socket.create_connection(('192.0.2.1', 80), \
                 timeout=5)\""
            ),
        ),
    ];
    // Each attempt starts from an empty environment but for PATH, HOME and the proxy variables
    // agentdiff gave the sandbox: a machine's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, a
    // GIT_* or CURL_* variable) must not send a program to a host this test did not name.
    let keep: Vec<String> = ["PATH", "HOME"]
        .into_iter()
        .map(String::from)
        .chain(
            agentdiff_backend_api::egress::proxy_env()
                .into_iter()
                .map(|(k, _)| k.to_string_lossy().into_owned()),
        )
        .map(|k| format!("{k}=\"${k}\""))
        .collect();
    let mut script = format!(
        "r=report.txt\n: > $r\nmkdir -p errs\ntry() {{ if env -i {} sh -c \"$2\" >/dev/null 2>\"errs/$1\"; \
         then echo \"$1=ok\" >> $r; else echo \"$1=fail\" >> $r; fi; }}\n",
        keep.join(" ")
    );
    for (name, cmd) in &tries {
        script.push_str(&format!("try {name} '{}'\n", cmd.replace('\'', r"'\''")));
    }
    fs::write(f.root().join("attempts.sh"), script).unwrap();
    let setup = format!("mount --bind '{}' /etc/hosts", hosts.display());
    let args = [
        "run",
        "--runtime",
        "bwrap",
        "--format",
        "json",
        "--fail-on",
        "never",
        "--",
        "sh",
        "attempts.sh",
    ];
    let out = super::in_mount_namespace(f.root(), &setup, &args)
        .env("HOME", f.home.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report = fs::read_to_string(f.root().join("report.txt"))
        .unwrap_or_else(|e| panic!("no report ({e}); stderr {stderr}"));
    let outcomes: std::collections::BTreeMap<&str, bool> = report
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k, v == "ok"))
        .collect();
    let expected = [
        ("curl_allowed", true),
        ("curl_denied", false),
        ("curl_socks5", true),
        ("git_clone", true),
        ("pip_install", true),
        ("raw_socket_server", false),
        ("raw_socket_outside", false),
    ];
    for (name, ok) in expected {
        // What the attempt itself printed, so a failure on another machine says why.
        let said = fs::read_to_string(f.root().join("errs").join(name)).unwrap_or_default();
        assert_eq!(
            outcomes.get(name),
            Some(&ok),
            "{name}: {report}; the attempt's stderr: {said}; agentdiff's stderr {stderr}"
        );
    }
    assert_eq!(
        fs::read_to_string(f.root().join("site/demo_pkg/__init__.py")).unwrap(),
        "VALUE = 'installed through the proxy'\n"
    );

    // The sealed evidence: the label, every attempt with its decision, the finding.
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rt = f.runtime_json(&result);
    assert_eq!(rt["capabilities"]["network"], "filtered", "{rt:#}");
    assert_eq!(rt["wrapper"]["controls"]["network"]["level"], "filtered");
    let allowed = records(&rt, ALLOWED);
    let protocols: Vec<&str> = allowed
        .iter()
        .map(|r| r["protocol"].as_str().unwrap())
        .collect();
    assert!(
        allowed
            .iter()
            .all(|r| r["action"] == "allow" && r["rule"] == "network.egress.allow[0]"),
        "{allowed:#?}"
    );
    // curl (1) + git (info/refs and objects) + pip (index and wheel) over HTTP, curl over SOCKS5.
    assert!(
        protocols.iter().filter(|p| **p == "http").count() >= 5,
        "{protocols:?}"
    );
    assert!(protocols.contains(&"socks5"), "{protocols:?}");
    assert!(
        allowed
            .iter()
            .all(|r| r["address"] == format!("{SERVER_IP}:{port}")),
        "{allowed:#?}"
    );
    let denied = records(&rt, DENIED);
    assert_eq!(denied.len(), 1, "{denied:#?}");
    assert_eq!(denied[0]["action"], "deny");
    assert_eq!(denied[0]["rule"], "network.egress.default");
    assert!(denied[0].get("address").is_none(), "{denied:#?}");
    // The raw sockets never reached the proxy: nothing else was recorded.
    let egress = &rt["network"]["egress"];
    assert_eq!(egress["total"], allowed.len() + 1, "{egress:#}");
    assert_eq!(egress["denied"], 1);
    // The forwarder is the sandbox's plumbing, not a leftover of the command.
    assert!(rt["wrapper"]["egress_forwarder"]["pid"].is_u64(), "{rt:#}");
    assert_eq!(result["summary"]["leftover_processes"], 0, "{result:#}");
    let findings: Vec<&Value> = result["evidence_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "egress_denied")
        .collect();
    assert_eq!(findings.len(), 1, "{result:#}");
    assert_eq!(findings[0]["action"], "review");
    assert!(findings[0]["detail"].as_str().unwrap().contains(DENIED));
    let id = result["run_id"].as_str().unwrap();
    super::assert_exit(&super::cmd(f.root(), &["verify", id]).output().unwrap(), 0);
    // Every review surface lists the hosts, the refused one first.
    let surface = |format: &str| {
        let out = super::cmd(f.root(), &["inspect", id, "--format", format])
            .output()
            .unwrap();
        super::assert_exit(&out, 0);
        String::from_utf8(out.stdout).unwrap()
    };
    for (format, heading) in [
        ("summary", "egress proxy: "),
        ("markdown", "**Network**"),
        ("html", "id=\"h-network\""),
    ] {
        let text = surface(format);
        let rest = &text[text
            .find(heading)
            .unwrap_or_else(|| panic!("{format}: no {heading:?} in {text}"))..];
        let (denied, allowed) = (rest.find(DENIED), rest.find(ALLOWED));
        assert!(
            denied.is_some() && allowed.is_some() && denied < allowed,
            "{format}: {text}"
        );
    }
    // The proxy's private directory is gone with the run.
    let left: Vec<String> = fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("agentdiff-egress-{}-", out_pid(&rt))))
        .collect();
    assert_eq!(left, Vec::<String>::new());
    drop(server);
}

/// The pid of the agentdiff that ran (the outer bwrap's parent), which names the proxy's
/// directory.
fn out_pid(rt: &Value) -> u64 {
    rt["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["relation"] == "root")
        .and_then(|p| p["ppid"].as_u64())
        .unwrap()
}

#[test]
fn filtered_without_an_allowed_host_is_refused_before_anything_runs() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let (code, _, out) = f.run(
        &["--backend-option", "network=filtered"],
        &["touch", "ran.txt"],
        &[],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(code, 0, "{stderr}");
    assert!(
        stderr.contains("filtered") && stderr.contains("network.egress"),
        "{stderr}"
    );
    assert!(!f.root().join("ran.txt").exists());
}
