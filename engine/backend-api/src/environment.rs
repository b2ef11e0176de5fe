//! The command's environment: what is handed over, and what is recorded about it.
//!
//! Evidence holds variable *names* with fingerprints of their values, never the values (seed 000);
//! the transaction keys them with the per-user key (`transaction::fingerprints::key_fingerprints` in the engine). The default mode inherits agentdiff's environment, because agents need their API
//! keys. The opt-in scrub passes only an allowlist plus names the user adds, always drops
//! runtime-injection variables (`LD_PRELOAD`, `NODE_OPTIONS`, …), drops names that look like
//! credentials unless the user named them exactly, and records what it dropped (names only).

use std::collections::BTreeMap;
use std::ffi::OsString;

use crate::EnvironmentEvidence;
use agentdiff_host::redact::fingerprint;

/// How the environment is handed to the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvMode {
    /// Everything agentdiff has (the default).
    #[default]
    Inherit,
    /// Only the allowlist plus names the user adds.
    Scrub,
}

impl EnvMode {
    pub fn as_str(self) -> &'static str {
        match self {
            EnvMode::Inherit => "inherit",
            EnvMode::Scrub => "scrub",
        }
    }
}

/// Names passed by the scrub. A trailing `*` matches any suffix.
pub const DEFAULT_ALLOWLIST: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "PWD",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TERM",
    "COLORTERM",
    "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION",
    "NO_COLOR",
    "CLICOLOR",
    "COLUMNS",
    "LINES",
    "TZ",
    "TMPDIR",
    "TMP",
    "TEMP",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "XDG_CONFIG_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
    "XDG_STATE_HOME",
    "XDG_RUNTIME_DIR",
    "CI",
];

/// Name fragments that make a variable look like a credential (matched case-insensitively).
pub const SENSITIVE_FRAGMENTS: &[&str] = &[
    "KEY",
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "AUTH",
    "CREDENTIAL",
    "PRIVATE",
    "CERT",
];

/// Variables that make a program load or run code it was not asked to (always dropped by the
/// scrub). A trailing `*` matches any suffix.
pub const RUNTIME_INJECTION: &[&str] = &[
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "LD_*",
    "DYLD_*",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHONSTARTUP",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONINSPECT",
    "PERL5OPT",
    "PERL5LIB",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "BASH_ENV",
    "ENV",
    "PROMPT_COMMAND",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "GCONV_PATH",
    "MALLOC_CONF",
    "GIT_EXEC_PATH",
    "GIT_SSH_COMMAND",
    "GIT_CONFIG_GLOBAL",
];

fn matches_pattern(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether `name` is a runtime-injection variable.
pub fn is_runtime_injection(name: &str) -> bool {
    RUNTIME_INJECTION.iter().any(|p| matches_pattern(p, name))
}

/// Whether `name` looks like it carries a credential.
pub fn looks_sensitive(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    SENSITIVE_FRAGMENTS.iter().any(|f| upper.contains(f))
}

/// The environment to launch with and the evidence about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvPlan {
    pub env: Vec<(OsString, OsString)>,
    pub evidence: EnvironmentEvidence,
}

/// Decide the command's environment from `current` (usually `std::env::vars_os()`).
///
/// In scrub mode a variable passes when it is on [`DEFAULT_ALLOWLIST`] or in `extra_pass`, and is
/// neither a runtime-injection variable nor (unless named exactly in `extra_pass`) credential-like.
/// Naming a credential variable exactly (`ANTHROPIC_API_KEY`) is how a user hands it over on
/// purpose; a wildcard (`AWS_*`) never passes credential-like names.
pub fn plan(
    mode: EnvMode,
    extra_pass: &[String],
    current: impl Iterator<Item = (OsString, OsString)>,
) -> EnvPlan {
    let mut env = Vec::new();
    let mut dropped = Vec::new();
    for (name, value) in current {
        let keep = match mode {
            EnvMode::Inherit => true,
            EnvMode::Scrub => match name.to_str() {
                // A name that is not UTF-8 cannot be on any list.
                None => false,
                Some(n) => {
                    let exact = extra_pass.iter().any(|p| p == n);
                    let listed = exact
                        || DEFAULT_ALLOWLIST.iter().any(|p| matches_pattern(p, n))
                        || extra_pass.iter().any(|p| matches_pattern(p, n));
                    listed && !is_runtime_injection(n) && (exact || !looks_sensitive(n))
                }
            },
        };
        if keep {
            env.push((name, value));
        } else {
            dropped.push(name.to_string_lossy().into_owned());
        }
    }
    env.sort();
    dropped.sort();
    let evidence = EnvironmentEvidence {
        mode,
        variables: fingerprints(&env),
        dropped,
    };
    EnvPlan { env, evidence }
}

/// Name → fingerprint of each variable; values never leave this function.
pub fn fingerprints(env: &[(OsString, OsString)]) -> BTreeMap<String, String> {
    env.iter()
        .map(|(k, v)| {
            let name = k.to_string_lossy().into_owned();
            let fp = fingerprint(&name, v.as_encoded_bytes());
            (name, fp)
        })
        .collect()
}

/// Prefix of keyed fingerprints.
pub const KEYED_PREFIX: &str = "hmac-sha256:";

/// Evidence for the environment a backend actually launched with. `mode` and `dropped` come from
/// the [`plan`] the transaction made (the launch request's `env_plan`); the fingerprints are
/// computed from what was launched.
pub fn evidence_for_launch(
    env: &[(OsString, OsString)],
    mode: EnvMode,
    dropped: &[String],
) -> EnvironmentEvidence {
    EnvironmentEvidence {
        mode,
        variables: fingerprints(env),
        dropped: dropped.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    const SAMPLE: &[(&str, &str)] = &[
        ("PATH", "/usr/bin"),
        ("HOME", "/home/u"),
        ("LC_ALL", "C.UTF-8"),
        ("ANTHROPIC_API_KEY", "sk-ant-very-secret-value"),
        ("GITHUB_TOKEN", "ghp_supersecret"),
        ("LD_PRELOAD", "/tmp/evil.so"),
        ("DYLD_INSERT_LIBRARIES", "/tmp/evil.dylib"),
        ("NODE_OPTIONS", "--require /tmp/x.js"),
        ("PYTHONSTARTUP", "/tmp/x.py"),
        ("AWS_REGION", "eu-west-1"),
        ("AWS_SECRET_ACCESS_KEY", "wJalrXUtnFEMI"),
        ("RANDOM_THING", "x"),
    ];

    #[test]
    fn inherit_keeps_everything_and_records_only_fingerprints() {
        let p = plan(EnvMode::Inherit, &[], vars(SAMPLE).into_iter());
        assert_eq!(p.env.len(), SAMPLE.len());
        assert_eq!(p.evidence.mode, EnvMode::Inherit);
        assert!(p.evidence.dropped.is_empty());
        let json = serde_json::to_string(&p.evidence).unwrap();
        for (name, value) in SAMPLE {
            assert!(json.contains(name));
            assert!(!json.contains(value), "raw value of {name} leaked");
        }
        assert!(p.evidence.variables["PATH"].starts_with("sha256:"));
    }

    #[test]
    fn scrub_passes_allowlist_and_drops_secrets_and_injection() {
        let p = plan(EnvMode::Scrub, &[], vars(SAMPLE).into_iter());
        let kept: Vec<String> = p
            .env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, ["HOME", "LC_ALL", "PATH"]);
        assert_eq!(
            p.evidence.dropped,
            [
                "ANTHROPIC_API_KEY",
                "AWS_REGION",
                "AWS_SECRET_ACCESS_KEY",
                "DYLD_INSERT_LIBRARIES",
                "GITHUB_TOKEN",
                "LD_PRELOAD",
                "NODE_OPTIONS",
                "PYTHONSTARTUP",
                "RANDOM_THING"
            ]
        );
        assert_eq!(p.evidence.mode, EnvMode::Scrub);
        let json = serde_json::to_string(&p.evidence).unwrap();
        for (_, value) in SAMPLE {
            assert!(!json.contains(value));
        }
    }

    #[test]
    fn exact_user_names_pass_credentials_but_wildcards_and_injection_do_not() {
        let extra = vec![
            "ANTHROPIC_API_KEY".to_string(),
            "AWS_*".to_string(),
            "LD_PRELOAD".to_string(),
        ];
        let p = plan(EnvMode::Scrub, &extra, vars(SAMPLE).into_iter());
        let kept: Vec<String> = p
            .env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert!(kept.contains(&"ANTHROPIC_API_KEY".to_string()));
        assert!(kept.contains(&"AWS_REGION".to_string()));
        assert!(!kept.contains(&"AWS_SECRET_ACCESS_KEY".to_string()));
        assert!(!kept.contains(&"LD_PRELOAD".to_string()));
        assert!(p.evidence.dropped.contains(&"LD_PRELOAD".to_string()));
    }

    #[test]
    fn evidence_for_launch_fingerprints_what_was_launched() {
        let env = vars(&[("A", "1")]);
        let ev = evidence_for_launch(&env, EnvMode::Scrub, &["B".into()]);
        assert_eq!(ev.variables["A"], fingerprint("A", b"1"));
        assert_eq!(ev.dropped, ["B"]);
    }
}
