//! Redaction before persistence and terminal-safe display (seed 000: defence in depth, not DLP).
//!
//! - argv: values of credential-bearing flags (`--token X`, `--password=X`, `-p X` for known
//!   tools is not guessed), `KEY=VALUE` words whose key looks sensitive, credentials embedded in
//!   URLs (`https://user:pass@host`), and well-known token shapes are replaced by `[REDACTED]`;
//! - data: values under sensitive keys are replaced recursively;
//! - environment: values become SHA-256 fingerprints;
//! - display: control characters are escaped so recorded names cannot drive the terminal.

use serde_json::Value;
use sha2::{Digest, Sha256};

pub const REDACTED: &str = "[REDACTED]";

/// Substrings that make a flag, key or variable name sensitive wherever they appear
/// (matched case-insensitively).
const SENSITIVE_SUBSTRINGS: &[&str] = &[
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "apikey",
    "credential",
    "privatekey",
];

/// Words that make a name sensitive only as a whole `-`/`_`-separated segment, so that
/// `--author` or `--keyboard` stay readable.
const SENSITIVE_SEGMENTS: &[&str] = &[
    "auth",
    "authorization",
    "key",
    "pat",
    "cookie",
    "session",
    "signature",
    "pwd",
    "pass",
];

/// Prefixes of well-known credential formats that are redacted wherever they appear as a word.
const TOKEN_PREFIXES: &[&str] = &[
    "sk-",
    "sk_live_",
    "sk_test_",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "glpat-",
    "xoxb-",
    "xoxp-",
    "xoxa-",
    "AKIA",
    "ASIA",
    "AIza",
    "npm_",
    "pypi-",
];

/// Whether a flag, key or variable name looks like it carries a credential.
pub fn is_sensitive_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    let trimmed = lower.trim_start_matches('-');
    if trimmed.is_empty() {
        return false;
    }
    let squashed: String = trimmed.chars().filter(|c| *c != '-' && *c != '_').collect();
    SENSITIVE_SUBSTRINGS.iter().any(|w| squashed.contains(w))
        || trimmed
            .split(['-', '_', '.'])
            .any(|seg| SENSITIVE_SEGMENTS.contains(&seg))
}

fn looks_like_token(word: &str) -> bool {
    TOKEN_PREFIXES
        .iter()
        .any(|p| word.starts_with(p) && word.len() >= p.len() + 8)
        || word.starts_with("eyJ") && word.matches('.').count() == 2 && word.len() > 30
}

/// Replace `user:password@` in URLs.
fn redact_url_credentials(word: &str) -> Option<String> {
    let scheme_end = word.find("://")?;
    let rest = &word[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let at = authority.rfind('@')?;
    let userinfo = &authority[..at];
    if userinfo.is_empty() {
        return None;
    }
    let user = userinfo.split(':').next().unwrap_or("");
    let replaced = if userinfo.contains(':') {
        format!("{user}:{REDACTED}")
    } else {
        REDACTED.to_string()
    };
    Some(format!(
        "{}{}@{}",
        &word[..scheme_end + 3],
        replaced,
        &rest[at + 1..]
    ))
}

fn redact_word(word: &str) -> Option<String> {
    if let Some(url) = redact_url_credentials(word) {
        return Some(url);
    }
    if looks_like_token(word) {
        return Some(REDACTED.to_string());
    }
    // KEY=VALUE or --flag=value
    if let Some((key, value)) = word.split_once('=') {
        if !value.is_empty() && is_sensitive_name(key) {
            return Some(format!("{key}={REDACTED}"));
        }
        if let Some(inner) = redact_word(value) {
            return Some(format!("{key}={inner}"));
        }
    }
    // Authorization header values: "Bearer xyz", "Authorization: Basic xyz"
    let lower = word.to_ascii_lowercase();
    for marker in ["bearer ", "basic ", "token "] {
        if let Some(pos) = lower.find(marker) {
            let head = &word[..pos + marker.len()];
            if word.len() > head.len() {
                return Some(format!("{head}{REDACTED}"));
            }
        }
    }
    None
}

/// Redact an argument vector that may hold shell command strings (`sh -c "tool --token X"`, as
/// seen in a process's `cmdline`): [`redact_argv`], then every argument with whitespace is split
/// into words (quotes stripped for the check) and redacted as an argument vector of its own. A
/// redacted argument is rejoined with single spaces.
pub fn redact_argv_deep<S: AsRef<str>>(argv: &[S]) -> Vec<String> {
    redact_argv(argv)
        .into_iter()
        .map(|arg| {
            if !arg.contains(char::is_whitespace) {
                return arg;
            }
            let words: Vec<&str> = arg.split_whitespace().collect();
            let bare: Vec<&str> = std::iter::once("")
                .chain(
                    words
                        .iter()
                        .map(|w| w.trim_matches(|c| c == '\'' || c == '"')),
                )
                .collect();
            let redacted = redact_argv(&bare);
            if redacted.iter().zip(&bare).all(|(r, b)| r == b) {
                return arg;
            }
            words
                .iter()
                .zip(redacted.iter().skip(1).zip(bare.iter().skip(1)))
                .map(|(w, (r, b))| if r == b { (*w).to_string() } else { r.clone() })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Redact an argument vector for storage. The first element (the program) is kept.
pub fn redact_argv<S: AsRef<str>>(argv: &[S]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut redact_next = false;
    for (i, arg) in argv.iter().enumerate() {
        let arg = arg.as_ref();
        if redact_next {
            out.push(REDACTED.to_string());
            redact_next = false;
            continue;
        }
        if i > 0 && arg.starts_with('-') && !arg.contains('=') && is_sensitive_name(arg) {
            out.push(arg.to_string());
            redact_next = true;
            continue;
        }
        if arg.eq_ignore_ascii_case("-H") || arg.eq_ignore_ascii_case("--header") {
            out.push(arg.to_string());
            continue;
        }
        match redact_word(arg) {
            Some(r) if i > 0 => out.push(r),
            _ => out.push(arg.to_string()),
        }
    }
    out
}

/// Redact an OS argv (lossy for non-UTF-8 words, which are stored escaped).
pub fn redact_os_argv(argv: &[std::ffi::OsString]) -> Vec<String> {
    let words: Vec<String> = argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    redact_argv(&words)
}

/// Recursively replace values stored under sensitive keys.
pub fn redact_value(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (k, v) in map.iter_mut() {
                if is_sensitive_name(k) && !v.is_object() && !v.is_array() && !v.is_null() {
                    *v = Value::String(REDACTED.to_string());
                } else {
                    redact_value(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_value),
        Value::String(s) => {
            if let Some(r) = redact_word(s) {
                *s = r;
            }
        }
        _ => {}
    }
}

/// Stable fingerprint of a secret value: `sha256:` and the first 16 hex digits of
/// SHA-256("agentdiff-env-v1\0" || name || "\0" || value). Names are mixed in so equal values under
/// different names do not reveal each other.
pub fn fingerprint(name: &str, value: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"agentdiff-env-v1\0");
    h.update(name.as_bytes());
    h.update(b"\0");
    h.update(value);
    let digest = h.finalize();
    format!("sha256:{}", &hex::encode(digest)[..16])
}

/// The one escaping function for human output: every recorded string (file names, reasons, diff
/// lines, errors) passes through it before it reaches a terminal. Escapes C0 controls (so a
/// newline in a file name cannot start a fake report line), DEL, C1 controls, the Unicode line
/// and paragraph separators, and every bidirectional control (embeddings, overrides, isolates,
/// and the LRM/RLM/ALM marks), which could reorder what the reader sees.
pub fn escape_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            '\u{202a}'..='\u{202e}'
            | '\u{2066}'..='\u{2069}'
            | '\u{200e}'
            | '\u{200f}'
            | '\u{061c}'
            | '\u{2028}'
            | '\u{2029}' => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Escape for display but keep newlines (multi-line reports).
pub fn escape_terminal_lines(text: &str) -> String {
    text.split('\n')
        .map(escape_terminal)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_inside_shell_strings_are_redacted() {
        let argv = [
            "sh",
            "-c",
            "deploy --token hunter2 '--password=pw1' https://u:pw2@h/x API_KEY=k3y; echo ok",
        ];
        let out = redact_argv_deep(&argv);
        let joined = out.join(" ");
        for secret in ["hunter2", "pw1", "pw2", "k3y"] {
            assert!(!joined.contains(secret), "{secret} survived: {out:?}");
        }
        assert!(joined.contains("echo ok"));
        assert_eq!(
            redact_argv_deep(&["sh", "-c", "echo  plain"])[2],
            "echo  plain"
        );
    }

    #[test]
    fn flags_with_separate_values_are_redacted() {
        let argv = [
            "tool",
            "--token",
            "abc123",
            "--name",
            "x",
            "--password=hunter2",
        ];
        assert_eq!(
            redact_argv(&argv),
            vec![
                "tool",
                "--token",
                REDACTED,
                "--name",
                "x",
                "--password=[REDACTED]"
            ]
        );
    }

    #[test]
    fn env_style_words_urls_and_known_tokens_are_redacted() {
        let argv = [
            "env",
            "API_KEY=xyz",
            "PATH=/bin",
            "https://bob:pw@example.com/x",
            "ghp_0123456789abcdef0123",
            "Authorization: Bearer abc.def",
        ];
        let r = redact_argv(&argv);
        assert_eq!(r[1], "API_KEY=[REDACTED]");
        assert_eq!(r[2], "PATH=/bin");
        assert_eq!(r[3], "https://bob:[REDACTED]@example.com/x");
        assert_eq!(r[4], REDACTED);
        assert_eq!(r[5], "Authorization: Bearer [REDACTED]");
    }

    #[test]
    fn ordinary_arguments_survive() {
        let argv = ["python3", "-c", "print(1)", "--keyboard", "src/auth.py", ""];
        assert_eq!(redact_argv(&argv), argv.to_vec());
    }

    #[test]
    fn nested_values_are_redacted() {
        let mut v =
            serde_json::json!({"a": {"api_token": "t", "list": [{"password": 3}]}, "ok": "fine"});
        redact_value(&mut v);
        assert_eq!(v["a"]["api_token"], REDACTED);
        assert_eq!(v["a"]["list"][0]["password"], REDACTED);
        assert_eq!(v["ok"], "fine");
    }

    #[test]
    fn fingerprints_are_stable_and_hide_values() {
        let a = fingerprint("TOKEN", b"secret");
        assert_eq!(a, fingerprint("TOKEN", b"secret"));
        assert_ne!(a, fingerprint("OTHER", b"secret"));
        assert!(!a.contains("secret"));
        assert!(a.starts_with("sha256:"));
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(escape_terminal("a\x1b[31mb\n"), "a\\u{1b}[31mb\\n");
        assert_eq!(escape_terminal("x\u{202e}y"), "x\\u{202e}y");
        for c in [
            '\u{0}', '\r', '\u{7f}', '\u{85}', '\u{9b}', '\u{200e}', '\u{200f}', '\u{61c}',
            '\u{202a}', '\u{202d}', '\u{2066}', '\u{2069}', '\u{2028}', '\u{2029}',
        ] {
            let shown = escape_terminal(&format!("a{c}b"));
            assert!(!shown.contains(c), "{c:?} printed raw: {shown}");
            assert!(shown.starts_with('a') && shown.ends_with('b'), "{shown}");
        }
        // A file name cannot print a fake report line.
        let name = "x\n  would_create     .env";
        assert_eq!(escape_terminal(name).lines().count(), 1);
    }
}
