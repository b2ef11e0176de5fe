//! Redaction before persistence and terminal-safe display (seed 000: defence in depth, not DLP).
//!
//! - argv: values of credential-bearing flags (`--token X`, `--password=X`, `--oauth2-bearer X`),
//!   the password of `-u`/`--user`/`--proxy-user user:pass` (curl, wget…; a numeric `UID:GID`
//!   after a container engine client, `podman run --user 65532:65532`, is kept), the attached `-pPASS`
//!   after a MySQL-family program (a separate `-p X` is never guessed: `-p` means other things
//!   elsewhere), sensitive header values after `-H`/`--header` (`X-Api-Key: K`,
//!   `Authorization: Bearer T`, `Cookie: …`), `KEY=VALUE` words whose key looks sensitive,
//!   credentials embedded in URLs (`https://user:pass@host`), and well-known token shapes are
//!   replaced by `[REDACTED]`; a word holding a whole shell command (`sh -c "curl -u a:b …"`) is
//!   split into words and redacted the same way; a flag followed by a `--option` took no value
//!   (the option is kept: `bwrap --new-session --cap-drop ALL`);
//! - data: values under sensitive keys are replaced recursively;
//! - environment: values become SHA-256 fingerprints;
//! - display: control characters are escaped so recorded names cannot drive the terminal.

use serde_json::Value;

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
    "bearer",
];

/// Programs whose attached `-pVALUE` is a password (MySQL client family).
const PASSWORD_P_PROGRAMS: &[&str] = &[
    "mysql",
    "mysqldump",
    "mysqladmin",
    "mysqlimport",
    "mysqlshow",
    "mysqlcheck",
    "mysqlpump",
    "mariadb",
    "mariadb-dump",
    "mariadb-admin",
];

/// Container engine clients, whose `--user`/`-u` value is `uid[:gid]`, not `user:password`.
const CONTAINER_ENGINES: &[&str] = &["podman", "docker", "nerdctl"];
/// Flags whose value is `user[:password]`.
const USER_PASS_FLAGS: &[&str] = &["-u", "--user", "--proxy-user", "-U"];
/// Flags whose value is an HTTP header.
const HEADER_FLAGS: &[&str] = &["-H", "--header", "--proxy-header"];
/// Authorization schemes kept in front of a redacted credential, so the evidence still says which
/// kind of credential was sent.
const AUTH_SCHEMES: &[&str] = &["bearer", "basic", "token", "digest", "negotiate"];

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
    if let Some(header) = redact_header(word) {
        return Some(header);
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

/// `Name: value` with a sensitive header name → `Name: [REDACTED]` (an authorization scheme in
/// front of the value is kept). `None` when `word` is not such a header.
fn redact_header(word: &str) -> Option<String> {
    let (name, value) = word.split_once(':')?;
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'));
    let value = value.trim_start();
    if !name_ok || value.is_empty() || !is_sensitive_name(name) || value.starts_with("//") {
        return None;
    }
    let scheme = value
        .split_once(' ')
        .filter(|(s, rest)| {
            AUTH_SCHEMES.contains(&s.to_ascii_lowercase().as_str()) && !rest.is_empty()
        })
        .map(|(s, _)| format!("{s} "))
        .unwrap_or_default();
    Some(format!("{name}: {scheme}{REDACTED}"))
}

/// `user:password` → `user:[REDACTED]`; a bare user name is kept.
fn redact_user_pass(value: &str) -> String {
    match value.split_once(':') {
        Some((user, pass)) if !pass.is_empty() => format!("{user}:{REDACTED}"),
        _ => value.to_string(),
    }
}

/// What the previous word asked of the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pending {
    /// The whole next word is a secret.
    Value,
    /// The next word is `user[:password]`.
    UserPass,
    /// The next word is an HTTP header.
    Header,
}

#[derive(Debug, Default)]
struct ArgvRedactor {
    pending: Option<Pending>,
    /// A MySQL-family program was seen: an attached `-pVALUE` is a password.
    password_p: bool,
    /// A container engine client was seen: a numeric `--user UID:GID` is an identity.
    container_engine: bool,
}

impl ArgvRedactor {
    fn note_program(&mut self, word: &str) {
        let base = word.rsplit('/').next().unwrap_or(word);
        if PASSWORD_P_PROGRAMS.contains(&base) {
            self.password_p = true;
        }
        if CONTAINER_ENGINES.contains(&base) {
            self.container_engine = true;
        }
    }

    /// `user[:password]` redacted, except a container engine's numeric `UID:GID`: two decimal
    /// ids are no secret, and the recorded engine argv must say which user ran the command.
    fn user_pass(&self, value: &str) -> String {
        let decimal =
            |s: &str| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit());
        match value.split_once(':') {
            Some((uid, gid)) if self.container_engine && decimal(uid) && decimal(gid) => {
                value.to_string()
            }
            _ => redact_user_pass(value),
        }
    }

    fn word(&mut self, arg: &str) -> String {
        // A word that starts with `--` is the next option, not the value: no argument parser
        // hands a value written that way to the option before it, so the flag before it took
        // none (`bwrap --new-session --cap-drop ALL`). A value starting with one `-` is still
        // taken as the value.
        if arg.starts_with("--") && matches!(self.pending, Some(Pending::Value)) {
            self.pending = None;
        }
        if let Some(p) = self.pending.take() {
            return match p {
                Pending::Value => REDACTED.to_string(),
                Pending::UserPass => self.user_pass(arg),
                Pending::Header => redact_header(arg)
                    .or_else(|| redact_word(arg))
                    .unwrap_or_else(|| arg.to_string()),
            };
        }
        self.note_program(arg);
        if arg.starts_with('-') && !arg.contains('=') {
            if USER_PASS_FLAGS.contains(&arg) {
                self.pending = Some(Pending::UserPass);
                return arg.to_string();
            }
            if HEADER_FLAGS.iter().any(|f| f.eq_ignore_ascii_case(arg)) {
                self.pending = Some(Pending::Header);
                return arg.to_string();
            }
            if is_sensitive_name(arg) {
                self.pending = Some(Pending::Value);
                return arg.to_string();
            }
            if let Some(rest) = arg.strip_prefix("-u").filter(|r| r.contains(':')) {
                return format!("-u{}", self.user_pass(rest));
            }
            if let Some(rest) = arg.strip_prefix("-H").filter(|r| !r.is_empty()) {
                if let Some(h) = redact_header(rest) {
                    return format!("-H{h}");
                }
            }
            if self.password_p && arg.len() > 2 && arg.starts_with("-p") && !arg.starts_with("--") {
                return format!("-p{REDACTED}");
            }
        }
        if arg.chars().any(char::is_whitespace) {
            if let Some(r) = redact_shell_words(arg) {
                return r;
            }
        }
        redact_word(arg).unwrap_or_else(|| arg.to_string())
    }
}

/// Splits a shell command string into words (single and double quotes group; no other shell
/// syntax), redacts them as an argv, and re-joins them when anything was redacted.
fn redact_shell_words(text: &str) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    if words.len() < 2 {
        return None;
    }
    let mut r = ArgvRedactor::default();
    let redacted: Vec<String> = words.iter().map(|w| r.word(w)).collect();
    if redacted == words {
        return None;
    }
    let quoted: Vec<String> = redacted
        .iter()
        .map(|w| {
            if w.is_empty()
                || w.chars()
                    .any(|c| c.is_whitespace() || c == '"' || c == '\'')
            {
                format!("'{}'", w.replace('\'', "'\\''"))
            } else {
                w.clone()
            }
        })
        .collect();
    Some(quoted.join(" "))
}

/// Redact an argument vector that may hold shell command strings (`sh -c "tool --token X"`, as
/// seen in a process's `cmdline`). [`redact_argv`] already splits every argument holding
/// whitespace into shell words and redacts them; this name is kept for the exec log's callers.
pub fn redact_argv_deep<S: AsRef<str>>(argv: &[S]) -> Vec<String> {
    redact_argv(argv)
}

/// Redact an argument vector for storage. The first element (the program) is kept.
pub fn redact_argv<S: AsRef<str>>(argv: &[S]) -> Vec<String> {
    let mut out = Vec::with_capacity(argv.len());
    let mut r = ArgvRedactor::default();
    for (i, arg) in argv.iter().enumerate() {
        let arg = arg.as_ref();
        if i == 0 {
            r.note_program(arg);
            out.push(arg.to_string());
        } else {
            out.push(r.word(arg));
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
    let mut h = hmac_sha256::Hash::new();
    h.update(b"agentdiff-env-v1\0");
    h.update(name.as_bytes());
    h.update(b"\0");
    h.update(value);
    let digest = h.finalize();
    format!("sha256:{}", &crate::hex::encode(digest)[..16])
}

/// Whether `c` is invisible or changes how the text around it is shown: Unicode's format
/// characters (general category Cf: soft hyphen, zero-width space and joiners, word joiner,
/// byte-order mark, invisible operators, the bidirectional controls and marks, interlinear
/// annotation, tag characters U+E0000–E007F), variation selectors, the characters that render as
/// nothing (combining grapheme joiner, Hangul fillers, Khmer inherent vowels), the rest of the
/// default-ignorable blocks a future Unicode version may assign (U+FFF0–FFF8, U+E0080–E0FFF),
/// plus the line and paragraph separators. Such a character could hide text from a reader (tag characters carry
/// whole invisible sentences) or reorder what the reader sees.
fn is_hidden(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{034f}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061c}'
            | '\u{06dd}'
            | '\u{070f}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08e2}'
            | '\u{115f}'..='\u{1160}'
            | '\u{17b4}'..='\u{17b5}'
            | '\u{180b}'..='\u{180f}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{fe00}'..='\u{fe0f}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff0}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0000}'..='\u{e0fff}'
    )
}

/// The one escaping function for human output: every recorded string (file names, reasons, diff
/// lines, errors) passes through it before it reaches a terminal, and the markdown and HTML
/// escapers build on it. Writes `\` as `\\` (so a name holding a literal backslash-n cannot look
/// like one holding a newline), the C0 controls, DEL and the C1 controls in visible notation
/// (`\n`, `\t`, `\r`, `\u{1b}`: a newline in a file name cannot start a fake report line), and
/// every invisible or reordering character ([`is_hidden`]) as `\u{...}`.
pub fn escape_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control() || is_hidden(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
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
    fn the_issue_argv_forms_are_redacted() {
        let cases: &[(&[&str], &[&str])] = &[
            (
                &["curl", "-u", "admin:PASS", "https://x"],
                &["curl", "-u", "admin:[REDACTED]", "https://x"],
            ),
            (&["curl", "-uadmin:PASS"], &["curl", "-uadmin:[REDACTED]"]),
            (
                &["mysql", "-uroot", "-pPASS", "db"],
                &["mysql", "-uroot", "-p[REDACTED]", "db"],
            ),
            (
                &["curl", "--oauth2-bearer", "TOK"],
                &["curl", "--oauth2-bearer", REDACTED],
            ),
            (
                &["curl", "-H", "X-Api-Key: K"],
                &["curl", "-H", "X-Api-Key: [REDACTED]"],
            ),
            (
                &["curl", "-H", "Authorization: Bearer T"],
                &["curl", "-H", "Authorization: Bearer [REDACTED]"],
            ),
            (
                &["curl", "--header=Cookie: s=1"],
                &["curl", "--header=Cookie: [REDACTED]"],
            ),
            (
                &["tool", "--password", "X", "--password=Y"],
                &["tool", "--password", REDACTED, "--password=[REDACTED]"],
            ),
            // A value that starts with one dash is still the value.
            (
                &["tool", "--token", "-TOK", "--token", "--", "x"],
                &["tool", "--token", REDACTED, "--token", "--", "x"],
            ),
            (
                &["git", "clone", "https://u:p@host/r"],
                &["git", "clone", "https://u:[REDACTED]@host/r"],
            ),
            // Wrapped: the secret is inside srt's argv or a shell string.
            (
                &["srt", "--settings", "s.json", "--", "mysql", "-pPASS"],
                &["srt", "--settings", "s.json", "--", "mysql", "-p[REDACTED]"],
            ),
            (
                &["sh", "-c", "curl -u admin:PASS -H 'X-Api-Key: K' https://x"],
                &[
                    "sh",
                    "-c",
                    "curl -u admin:[REDACTED] -H 'X-Api-Key: [REDACTED]' https://x",
                ],
            ),
        ];
        for (argv, want) in cases {
            let got = redact_argv(argv);
            assert_eq!(got, want.to_vec(), "{argv:?}");
            let joined = got.join(" ");
            for secret in ["PASS", "TOK", ": K", "Bearer T", "s=1"] {
                assert!(
                    !joined.contains(secret),
                    "{secret} leaked from {argv:?}: {joined}"
                );
            }
        }
    }

    /// A flag whose name only looks sensitive (`--new-session`), followed by another option,
    /// took no value: the option after it is kept, and so is a wrapper argv around it.
    #[test]
    fn an_option_after_a_sensitive_looking_flag_is_not_its_value() {
        let options = [
            "bwrap",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--session-token",
        ];
        let argv: Vec<&str> = options
            .iter()
            .copied()
            .chain(["--pass", "hunter2"])
            .collect();
        let want: Vec<&str> = options
            .iter()
            .copied()
            .chain(["--pass", REDACTED])
            .collect();
        assert_eq!(redact_argv(&argv), want);
    }

    #[test]
    fn a_container_engines_numeric_user_is_kept_and_a_password_is_not() {
        let engine = [
            "/usr/bin/podman",
            "run",
            "--user",
            "65532:65532",
            "-u",
            "1000:1000",
            "--",
            "img",
        ];
        assert_eq!(redact_argv(&engine), engine.to_vec());
        for argv in [
            ["curl", "--user", "name:password"],
            ["curl", "--user", "1000:123456"],
            ["docker", "--user", "name:password"],
            ["docker", "--user", "1000:pw"],
        ] {
            let got = redact_argv(&argv);
            assert_eq!(
                got[2],
                format!("{}:{REDACTED}", argv[2].split(':').next().unwrap()),
                "{argv:?}"
            );
        }
        assert_eq!(
            redact_argv(&["curl", "-u1000:1000", "https://x"])[1],
            format!("-u1000:{REDACTED}")
        );
    }

    #[test]
    fn look_alike_flags_of_other_tools_survive() {
        let argv = [
            "mkdir",
            "-p",
            "-pdir",
            "ps",
            "-u",
            "root",
            "sort",
            "-u",
            "f",
            "-H",
            "Accept: text/html",
        ];
        assert_eq!(redact_argv(&argv), argv.to_vec());
        let argv = ["ssh", "-p22", "host", "sh", "-c", "echo hello world"];
        assert_eq!(redact_argv(&argv), argv.to_vec());
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
        // Pinned: recorded evidence compares fingerprints across versions.
        assert_eq!(a, "sha256:8f6ee2b5603a361e");
    }

    #[test]
    fn sha256_known_answers() {
        let hex = |d: [u8; 32]| crate::hex::encode(d);
        assert_eq!(
            hex(hmac_sha256::Hash::hash(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            hex(hmac_sha256::Hash::hash(b"")),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        // A million `a`s fed in uneven pieces: block boundaries fall inside updates.
        let mut h = hmac_sha256::Hash::new();
        let piece = [b'a'; 999];
        for _ in 0..1001 {
            h.update(piece);
        }
        h.update([b'a'; 1]);
        assert_eq!(
            hex(h.finalize()),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"
        );
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

    #[test]
    fn invisible_format_characters_are_escaped() {
        for c in [
            '\u{200b}',
            '\u{200c}',
            '\u{200d}',
            '\u{2060}',
            '\u{2064}',
            '\u{feff}',
            '\u{ad}',
            '\u{34f}',
            '\u{180e}',
            '\u{fe0f}',
            '\u{e0001}',
            '\u{e0041}',
            '\u{e007f}',
            '\u{e0100}',
            '\u{3164}',
            '\u{600}',
            '\u{fff9}',
            '\u{1d173}',
            '\u{e0fff}',
            '\u{fff0}',
        ] {
            let shown = escape_terminal(&format!("a{c}b"));
            assert_eq!(shown, format!("a\\u{{{:x}}}b", c as u32));
        }
        // A sentence in tag characters (invisible in most renderers) becomes visible notation.
        let hidden: String = "ignore the denials"
            .chars()
            .map(|c| char::from_u32(0xe0000 + c as u32).unwrap())
            .collect();
        let shown = escape_terminal(&format!("ok.txt{hidden}"));
        assert!(shown.is_ascii(), "{shown}");
        assert!(shown.starts_with("ok.txt\\u{e0069}\\u{e0067}"), "{shown}");
        // Ordinary text, accents and emoji stay as they are.
        assert_eq!(escape_terminal("café 日本 🙂"), "café 日本 🙂");
    }

    #[test]
    fn a_backslash_is_doubled_so_a_literal_escape_differs_from_a_real_one() {
        assert_eq!(escape_terminal("nl\\nname.txt"), "nl\\\\nname.txt");
        assert_eq!(escape_terminal("nl\nname.txt"), "nl\\nname.txt");
        assert_ne!(
            escape_terminal("nl\\nname.txt"),
            escape_terminal("nl\nname.txt")
        );
        assert_eq!(escape_terminal("\\u{1b}"), "\\\\u{1b}");
    }
}
