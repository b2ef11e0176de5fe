//! Refused connections under `--runtime bwrap` (`network: filtered`) as a reviewer meets them:
//! every surface and the dashboard list the hosts with their rule and counts, a host name the
//! command chose is escaped everywhere, and `network.egress.on_denied` decides what a refused
//! attempt is. A refused attempt needs no server: the proxy refuses before resolving.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;

use serde_json::Value;

use super::bwrap_cli::{no_bwrap, Fixture};
use super::serve_cli::{request, serve};

const ALLOWED: &str = "pkgs.allowed.test";
const DENIED: &str = "other.denied.test";
/// A host name a hostile command sends through SOCKS5 (which carries any bytes as the name).
const HOSTILE: &str = "\"'><img src=x onerror=alert(1)><script>alert(2)</script>\u{202e}";

/// A Python script that asks the run's proxy (`ALL_PROXY`) for [`HOSTILE`] over SOCKS5.
fn socks_script() -> String {
    let name: Vec<String> = HOSTILE.bytes().map(|b| b.to_string()).collect();
    format!(
        "import os, socket, urllib.parse\n\
         u = urllib.parse.urlparse(os.environ['ALL_PROXY'])\n\
         name = bytes([{}])\n\
         s = socket.create_connection((u.hostname, u.port), timeout=10)\n\
         s.sendall(b'\\x05\\x01\\x00'); s.recv(2)\n\
         s.sendall(b'\\x05\\x01\\x00\\x03' + bytes([len(name)]) + name + (443).to_bytes(2, 'big'))\n\
         print(s.recv(10))\n",
        name.join(", ")
    )
}

fn policy(extra: &str) -> String {
    format!("version: 2\nnetwork:\n  egress:\n    allow: [\"{ALLOWED}\"]\n{extra}")
}

/// Runs `sh -c script` under bwrap with `fail_on`; the exit code and result.json.
fn run(f: &Fixture, fail_on: &str, script: &str) -> (i32, Value, String) {
    let (code, result, out) = f.run(&["--fail-on", fail_on], &["sh", "-c", script], &[]);
    (
        code,
        result,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn denied_findings(result: &Value) -> Vec<Value> {
    result["evidence_findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "egress_denied")
        .cloned()
        .collect()
}

#[test]
fn a_hostile_host_name_is_escaped_on_every_surface_and_the_dashboard_counts_refusals() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    f.write_policy(policy(""));
    fs::write(f.root().join("socks.py"), socks_script()).unwrap();
    let (code, result, stderr) = run(
        &f,
        "never",
        &format!("python3 socks.py; curl -s -m 10 http://{DENIED}/ >/dev/null; true"),
    );
    assert_eq!(code, 0, "{stderr}");
    let rt = f.runtime_json(&result);
    let hosts = rt["network"]["egress"]["destinations"].as_array().unwrap();
    assert!(
        hosts
            .iter()
            .any(|h| h["host"] == HOSTILE && h["action"] == "deny" && h["attempts"] == 1),
        "the hostile name reached the proxy: {hosts:#?}"
    );
    assert_eq!(rt["network"]["egress"]["denied"], 2, "{rt:#}");
    let id = result["run_id"].as_str().unwrap();

    // Every surface: the rule of each refused host, the name never as markup or a raw control.
    for format in ["summary", "markdown", "html"] {
        let out = super::cmd(f.root(), &["inspect", id, "--format", format])
            .output()
            .unwrap();
        super::assert_exit(&out, 0);
        // Markdown escapes `_` and `:`.
        let text = String::from_utf8(out.stdout).unwrap().replace('\\', "");
        // Markup is harmless on a terminal; a raw control character is not.
        let markup = text.contains("<img") || text.contains("<script>alert");
        assert!(format == "summary" || !markup, "{format}: {text}");
        assert!(!text.contains('\u{202e}'), "{format}: {text}");
        assert!(
            text.contains("network.egress.invalid_host"),
            "{format}: {text}"
        );
        assert!(text.contains("network.egress.default"), "{format}: {text}");
        // The backend line says filtered, not blocked: the allowed host was reachable.
        assert!(
            format == "summary" || text.contains("network filtered"),
            "{format}: {text}"
        );
    }

    // The dashboard: the refused count in the index, the hosts with their rule on the run's page.
    let server = serve(f.root());
    let host = format!("127.0.0.1:{}", server.port);
    let (status, index) = request(
        server.port,
        "GET",
        &format!("/?token={}", server.token),
        &host,
        "",
    );
    assert_eq!(status, 200, "{index}");
    assert!(index.contains("Refused connections</th>"), "{index}");
    let row = &index[index.find(&format!("/run/{id}?")).unwrap()..];
    let row = &row[..row.find("</tr>").unwrap()];
    assert!(row.ends_with("<td class=\"d-review\">2</td>"), "{row}");
    let (status, page) = request(
        server.port,
        "GET",
        &format!("/run/{id}?token={}", server.token),
        &host,
        "",
    );
    assert_eq!(status, 200, "{page}");
    assert!(
        !page.contains("<img") && !page.contains("<script>alert"),
        "{page}"
    );
    let network = &page[page.find("id=\"network\"").expect("a network table")..];
    let network = &network[..network.find("</table>").unwrap()];
    assert!(
        network.contains(
            "<td><code>&quot;&#39;&gt;&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;alert(2)\
             &lt;/script&gt;\\u{202e}</code></td><td class=\"d-deny\">1</td><td>0</td>\
             <td>0 / 0</td><td><code>network.egress.invalid_host</code></td>"
        ),
        "{network}"
    );
    assert!(
        network.contains(&format!(
            "<td><code>{DENIED}</code></td><td class=\"d-deny\">1</td><td>0</td><td>0 / 0</td>\
             <td><code>network.egress.default</code></td>"
        )),
        "{network}"
    );
}

/// `network.egress.on_denied`: a refused attempt is a review finding by default (`--fail-on deny`
/// passes), a deny finding when the policy says `deny` (the run fails with the deny code), and a
/// value the policy does not know stops the run before anything is launched.
#[test]
fn on_denied_decides_whether_a_refused_connection_fails_the_run() {
    if no_bwrap() {
        return;
    }
    let refused = format!("curl -s -m 10 http://{DENIED}/ >/dev/null; touch ran.txt");

    let f = Fixture::new();
    f.write_policy(policy(""));
    let (code, result, stderr) = run(&f, "deny", &refused);
    assert_eq!(code, 0, "{stderr}");
    let found = denied_findings(&result);
    assert_eq!(found.len(), 1, "{result:#}");
    assert_eq!(found[0]["action"], "review");
    assert_eq!(result["safety_outcome"], "review", "{result:#}");
    let (code, _, stderr) = run(&f, "review", &refused);
    assert_eq!(code, 72, "review findings under --fail-on review: {stderr}");

    let f = Fixture::new();
    f.write_policy(policy("    on_denied: deny\n"));
    let (code, result, stderr) = run(&f, "deny", &refused);
    assert_eq!(code, 71, "denied findings under --fail-on deny: {stderr}");
    let found = denied_findings(&result);
    assert_eq!(found.len(), 1, "{result:#}");
    assert_eq!(found[0]["action"], "deny");
    assert!(
        found[0]["detail"]
            .as_str()
            .unwrap()
            .contains("network.egress.on_denied makes it deny"),
        "{found:?}"
    );
    assert_eq!(result["safety_outcome"], "deny", "{result:#}");
    assert!(
        f.root().join("ran.txt").exists(),
        "the command ran to its end"
    );
    // The effective policy the run recorded says so.
    let id = result["run_id"].as_str().unwrap();
    let recorded: Value = serde_json::from_str(
        &fs::read_to_string(
            f.root()
                .join(".agentdiff/runs")
                .join(id)
                .join("policy.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(
        recorded["effective"]["network"]["egress"]["on_denied"],
        "deny"
    );

    let f = Fixture::new();
    f.write_policy(policy("    on_denied: ignore\n"));
    let (code, _, stderr) = run(&f, "deny", "touch ran.txt");
    assert_eq!(code, 65, "{stderr}");
    assert!(
        stderr.contains("network.egress.on_denied: \"ignore\" is not one of review, deny"),
        "{stderr}"
    );
    assert!(!f.root().join("ran.txt").exists());
}
