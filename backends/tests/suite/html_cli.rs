//! The HTML report (`inspect --format html`) of real runs: escaping of hostile names, sensitive
//! content withheld, self-contained, seal status.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::agentdiff;

/// File names a hostile command could create: markup, quotes, a control character, a bidi
/// override, a line separator.
pub const HOSTILE_NAMES: &[&[u8]] = &[
    b"<script>alert(1)<\\script>.txt",
    b"q\"uote'd.txt",
    b"ctl\x01\x1b[31mred.txt",
    b"rtl\xe2\x80\xaetxt.exe",
    b"sep\xe2\x80\xa8line.txt",
    b"<img src=x onerror=alert(2)>",
];

/// Secrets written by the run into files the policy treats as sensitive (by path, and by a deny
/// rule); none may appear in any report.
pub const SECRETS: &[&str] = &[
    "SECRET_BEFORE_1f3a",
    "SECRET_AFTER_9c2e",
    "DENIED_CONTENT_77ab",
    "KEY_MATERIAL_5d1c",
];

/// A project whose run `id` changes a text file (with a visible diff), writes secrets into `.env`,
/// a new key file and a denied file, and creates files with hostile names (moved in from a
/// staging directory beside the project, so any byte can be in a name).
pub fn hostile_run(id: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let (proj, stage) = (dir.path().join("proj"), dir.path().join("stage"));
    fs::create_dir_all(proj.join("src")).unwrap();
    fs::create_dir(&stage).unwrap();
    fs::write(proj.join(".env"), "TOKEN=SECRET_BEFORE_1f3a\n").unwrap();
    fs::write(proj.join("notes.txt"), "DENIED_CONTENT_77ab old\n").unwrap();
    fs::write(proj.join("src/lib.rs"), "fn old() {}\n").unwrap();
    fs::write(
        proj.join("agentdiff.yaml"),
        "version: 1\nfilesystem:\n  deny: [notes.txt]\nnetwork:\n  mode: off\n",
    )
    .unwrap();
    for name in HOSTILE_NAMES {
        fs::write(
            stage.join(OsStr::from_bytes(name)),
            "<script>alert(3)</script>\n",
        )
        .unwrap();
    }
    let script = "printf 'TOKEN=SECRET_AFTER_9c2e\\n' > .env; \
                  printf 'DENIED_CONTENT_77ab new\\n' > notes.txt; \
                  printf 'KEY_MATERIAL_5d1c\\n' > id_ed25519; \
                  printf 'fn old() {}\\nfn added_line() {}\\n' > src/lib.rs; \
                  mv ../stage/* .";
    let out = agentdiff(&proj, &["run", "--run-id", id, "--", "sh", "-c", script]);
    assert!(out.status.code().is_some(), "{out:?}");
    assert!(proj.join("id_ed25519").exists(), "{out:?}");
    dir
}

pub fn project(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("proj")
}

/// The HTML report; exit 0, or 67 exactly when `verify` finds the capsule forged.
fn html(proj: &Path, id: &str) -> String {
    let forged = agentdiff(proj, &["verify", id]).status.code() == Some(67);
    let out = agentdiff(proj, &["inspect", id, "--format", "html"]);
    let want = if forged { Some(67) } else { Some(0) };
    assert_eq!(out.status.code(), want, "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Every recorded string is escaped: the only `<script` is the report's own, no raw control,
/// bidi or separator character, no attribute broken out of by a quote.
#[test]
fn hostile_names_are_escaped_in_the_html_report() {
    let dir = hostile_run("html-hostile-1");
    let page = html(&project(&dir), "html-hostile-1");
    assert_eq!(page.matches("<script").count(), 1, "{page}");
    assert!(!page.contains("<img"), "{page}");
    assert!(page.contains("&lt;script&gt;alert(1)"), "{page}");
    assert!(page.contains("q&quot;uote&#39;d.txt"), "{page}");
    assert!(page.contains("rtl\\u{202e}txt.exe"), "{page}");
    for bad in ['\u{1}', '\u{1b}', '\u{202e}', '\u{2028}'] {
        assert!(!page.contains(bad), "raw {bad:?} in the report");
    }
    // The hostile file's content is shown as an escaped diff line.
    assert!(
        page.contains("+&lt;script&gt;alert(3)&lt;/script&gt;"),
        "{page}"
    );
}

/// Sensitive files (by path, and by a deny rule) show sizes and hashes, never content; an
/// ordinary file's diff is shown.
#[test]
fn a_sensitive_file_content_never_appears_in_the_html_report() {
    let dir = hostile_run("html-secret-1");
    let page = html(&project(&dir), "html-secret-1");
    for secret in SECRETS {
        assert!(!page.contains(secret), "{secret} leaked");
    }
    assert_eq!(
        page.matches("Content withheld: sensitive file").count(),
        3,
        "{page}"
    );
    assert!(
        page.contains("<span class=\"l-add\">+fn added_line() {}</span>"),
        "{page}"
    );
}

/// One file, no request: no external URL, stylesheet, image, frame or script source, and a
/// policy that forbids fetching anything.
#[test]
fn the_html_report_is_self_contained() {
    let dir = hostile_run("html-self-1");
    let page = html(&project(&dir), "html-self-1");
    let without_svg_ns = page.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for bad in [
        "http://", "https://", "<link", "<iframe", " src=\"", "@import", "url(",
    ] {
        assert!(!without_svg_ns.contains(bad), "{bad} in the report");
    }
    assert!(page.contains("default-src 'none'"), "{page}");
    // Readable without JavaScript: the filters start hidden and every row is in the markup.
    assert!(page.contains("<form id=\"filters\" hidden"), "{page}");
    assert_eq!(page.matches("<tr data-decision=").count(), 10, "{page}");
}

/// The seal section uses the engine's verification: authenticated under the test user's key,
/// and forged once an artifact is changed.
#[test]
fn the_html_report_shows_the_seal_verdict() {
    let dir = hostile_run("html-seal-1");
    let proj = project(&dir);
    let page = html(&proj, "html-seal-1");
    assert!(
        page.contains("<strong id=\"seal-verdict\">authenticated</strong>"),
        "{page}"
    );
    // Another user's key (a fresh state directory): intact, but not authenticated here.
    let other = tempfile::tempdir().unwrap();
    let out = super::cmd(&proj, &["inspect", "html-seal-1", "--format", "html"])
        .env("AGENTDIFF_STATE_DIR", other.path().join("state"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(
        page.contains("<strong id=\"seal-verdict\">intact, not authenticated</strong>"),
        "{page}"
    );
    let events = proj.join(".agentdiff/runs/html-seal-1/events.jsonl");
    let mut text = fs::read_to_string(&events).unwrap();
    text.push_str("{\"seq\":999,\"at\":\"x\",\"event\":\"forged\"}\n");
    fs::write(&events, text).unwrap();
    let page = html(&proj, "html-seal-1");
    assert!(
        page.contains("<strong id=\"seal-verdict\">FORGED</strong>"),
        "{page}"
    );
}

/// The terminal `inspect` shows the process tree, ports and timeline, and `--diff` shows diffs
/// escaped, with sensitive files withheld.
#[test]
fn terminal_inspect_shows_evidence_sections_and_escaped_diffs() {
    let dir = hostile_run("term-diff-1");
    let proj = project(&dir);
    let out = agentdiff(&proj, &["inspect", "term-diff-1", "--diff"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for secret in SECRETS {
        assert!(!text.contains(secret), "{secret} leaked");
    }
    for want in [
        "processes (the command exited with code 0",
        "ports opened (",
        "timeline:",
        "capsule_created",
        "+fn added_line() {}",
        "content diff withheld: sensitive file",
        "== ctl\\u{1}\\u{1b}[31mred.txt",
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    for bad in ['\u{1}', '\u{1b}', '\u{202e}', '\u{2028}'] {
        assert!(!text.contains(bad), "raw {bad:?} in the output");
    }
    let without = agentdiff(&proj, &["inspect", "term-diff-1"]);
    assert!(!String::from_utf8(without.stdout)
        .unwrap()
        .contains("diffs:"));
    let bad = agentdiff(
        &proj,
        &["inspect", "term-diff-1", "--diff", "--format", "json"],
    );
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
}

/// The after side of a diff is the working-tree file only while it still hashes to what the run
/// recorded: an edit since the run, or the file swapped for a symlink to another file, gives no
/// diff instead of content the run never wrote.
#[test]
fn a_file_changed_since_the_run_shows_no_diff_rather_than_new_content() {
    let dir = hostile_run("html-stale-1");
    let proj = project(&dir);
    fs::write(proj.join("src/lib.rs"), "EDITED_AFTER_THE_RUN\n").unwrap();
    let outside = dir.path().join("outside.txt");
    fs::write(&outside, "LINK_TARGET_CONTENT\n").unwrap();
    let hostile = proj.join("q\"uote'd.txt");
    fs::remove_file(&hostile).unwrap();
    std::os::unix::fs::symlink(&outside, &hostile).unwrap();
    let page = html(&proj, "html-stale-1");
    assert!(!page.contains("EDITED_AFTER_THE_RUN"), "{page}");
    assert!(!page.contains("LINK_TARGET_CONTENT"), "{page}");
    assert_eq!(
        page.matches("no diff shown: after: the file has changed or gone since the run")
            .count(),
        2,
        "{page}"
    );
}
