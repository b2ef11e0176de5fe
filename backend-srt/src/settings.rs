//! srt settings: which file srt reads, its digest for evidence, and the optional bridge that
//! generates a settings file from the agentdiff policy.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Name of the generated settings file in the run capsule.
pub const GENERATED_SETTINGS_FILE: &str = "srt-settings.json";
/// Name of the file the transaction writes before launch, holding the effective policy.
pub const POLICY_ARTIFACT: &str = "policy.json";
/// The file srt reads when `--settings` is not given (relative to `$HOME`).
pub const SRT_DEFAULT_SETTINGS: &str = ".srt-settings.json";

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("the srt settings file {path} does not exist")]
    Missing { path: PathBuf },
    #[error("the srt settings path {path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("the srt settings file {path} cannot be read: {source}")]
    Unreadable {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the effective policy from {path}: {message}")]
    Policy { path: PathBuf, message: String },
    #[error("cannot write the generated srt settings {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where srt's settings come from for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsChoice {
    /// A file named with `--srt-settings` (absolute).
    File(PathBuf),
    /// Generated from the policy into the capsule at launch (`--srt-settings-from-policy`).
    FromPolicy(PathBuf),
    /// Nothing named: srt reads `$HOME/.srt-settings.json` if it exists, else its built-in
    /// defaults.
    SrtDefault,
}

impl SettingsChoice {
    /// The path handed to `srt --settings`, if any.
    pub fn path(&self) -> Option<&Path> {
        match self {
            SettingsChoice::File(p) | SettingsChoice::FromPolicy(p) => Some(p),
            SettingsChoice::SrtDefault => None,
        }
    }

    pub fn source_label(&self) -> &'static str {
        match self {
            SettingsChoice::File(_) => "file",
            SettingsChoice::FromPolicy(_) => "generated_from_policy",
            SettingsChoice::SrtDefault => "srt_default",
        }
    }
}

/// Check that a named settings file exists, is a regular file and can be opened for reading.
/// Reads nothing but metadata and opens nothing for writing.
pub fn check_settings_file(path: &Path) -> Result<(), SettingsError> {
    let meta = std::fs::metadata(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            SettingsError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            SettingsError::Unreadable {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    if !meta.is_file() {
        return Err(SettingsError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    std::fs::File::open(path).map_err(|source| SettingsError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(())
}

/// SHA-256 (hex) and size of a file's content.
pub fn digest_file(path: &Path) -> Result<(String, u64), SettingsError> {
    let bytes = std::fs::read(path).map_err(|source| SettingsError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((hex::encode(Sha256::digest(&bytes)), bytes.len() as u64))
}

/// Evidence for the settings srt used: source, path and digest, or "srt built-in defaults".
pub fn settings_evidence(
    choice: &SettingsChoice,
    env: &[(OsString, OsString)],
) -> Result<Value, SettingsError> {
    match choice {
        SettingsChoice::File(path) | SettingsChoice::FromPolicy(path) => {
            let (sha256, bytes) = digest_file(path)?;
            Ok(json!({
                "source": choice.source_label(),
                "path": path.to_string_lossy(),
                "sha256": sha256,
                "bytes": bytes,
            }))
        }
        SettingsChoice::SrtDefault => {
            // srt reads $HOME/.srt-settings.json when no --settings is given; say which applied.
            let home = env
                .iter()
                .rev()
                .find(|(k, _)| k == "HOME")
                .map(|(_, v)| PathBuf::from(v));
            let default_file = home.map(|h| h.join(SRT_DEFAULT_SETTINGS));
            match default_file.as_deref().filter(|p| p.is_file()) {
                Some(path) => {
                    let (sha256, bytes) = digest_file(path)?;
                    Ok(json!({
                        "source": "srt_default_file",
                        "path": path.to_string_lossy(),
                        "sha256": sha256,
                        "bytes": bytes,
                    }))
                }
                None => Ok(json!({
                    "source": "srt_builtin_defaults",
                    "description": "srt built-in defaults",
                    "checked_default_path": default_file.map(|p| p.to_string_lossy().into_owned()),
                })),
            }
        }
    }
}

/// A settings file generated from the policy, and what it could not express.
#[derive(Debug, Clone, PartialEq)]
pub struct Bridged {
    pub settings: Value,
    /// Policy deny patterns that became `denyWrite` entries.
    pub expressed: Vec<String>,
    /// Policy deny patterns srt cannot take on Linux (globs other than a trailing `/**`).
    pub not_expressed: Vec<String>,
}

/// Read the effective policy's filesystem deny patterns from the capsule's `policy.json`
/// (the `effective` object the transaction writes; a bare policy document is accepted too).
pub fn read_policy_denies(capsule_dir: &Path) -> Result<Vec<String>, SettingsError> {
    let path = capsule_dir.join(POLICY_ARTIFACT);
    let err = |message: String| SettingsError::Policy {
        path: path.clone(),
        message,
    };
    let text = std::fs::read_to_string(&path).map_err(|e| err(e.to_string()))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
    let policy = doc.get("effective").unwrap_or(&doc);
    let filesystem = policy
        .get("filesystem")
        .ok_or_else(|| err("no `effective.filesystem` section".into()))?;
    match filesystem.get("deny") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| err("`filesystem.deny` holds a non-string".into()))
            })
            .collect(),
        Some(_) => Err(err("`filesystem.deny` is not a list".into())),
    }
}

/// The literal root-relative path a policy pattern names, when srt on Linux can take it:
/// no glob characters, except a trailing `/**` (which srt itself drops).
fn literal_path(pattern: &str) -> Option<&str> {
    let base = pattern.strip_suffix("/**").unwrap_or(pattern);
    let base = base.trim_start_matches("./").trim_end_matches('/');
    let is_glob = base.contains(['*', '?', '[', ']', '{', '}', '!']);
    let escapes = base.split('/').any(|seg| seg == "..");
    if base.is_empty() || is_glob || escapes || base.starts_with('/') {
        None
    } else {
        Some(base)
    }
}

/// Translate the policy into srt settings: writes allowed below `workdir`, the evidence store
/// and the policy's literal deny paths as `denyWrite`, no read denials, and network only to
/// `allow_domains` (none: no network).
pub fn bridge(
    workdir: &Path,
    root: &Path,
    capsule_dir: &Path,
    denies: &[String],
    allow_domains: &[String],
) -> Bridged {
    let mut deny_write: Vec<String> = Vec::new();
    let mut push = |p: PathBuf| {
        let s = p.to_string_lossy().into_owned();
        if !deny_write.contains(&s) {
            deny_write.push(s);
        }
    };
    // The command must not rewrite the evidence of its own run.
    let store = root.join(".agentdiff");
    push(store.clone());
    if !capsule_dir.starts_with(&store) {
        push(capsule_dir.to_path_buf());
    }
    let mut expressed = Vec::new();
    let mut not_expressed = Vec::new();
    for pattern in denies {
        match literal_path(pattern) {
            Some(rel) => {
                push(workdir.join(rel));
                expressed.push(pattern.clone());
            }
            None => not_expressed.push(pattern.clone()),
        }
    }
    let settings = json!({
        "filesystem": {
            "denyRead": [],
            "allowRead": [],
            "allowWrite": [workdir.to_string_lossy()],
            "denyWrite": deny_write,
        },
        "network": {
            "allowedDomains": allow_domains,
            "deniedDomains": [],
        },
    });
    Bridged {
        settings,
        expressed,
        not_expressed,
    }
}

/// Write generated settings to `path` (which must not exist yet), mode 0600.
pub fn write_generated(path: &Path, settings: &Value) -> Result<(), SettingsError> {
    let err = |source| SettingsError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut text = serde_json::to_vec_pretty(settings)
        .map_err(|e| err(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
    text.push(b'\n');
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(err)?;
    file.write_all(&text).map_err(err)?;
    file.sync_all().map_err(err)
}

/// What the policy bridge cannot express, recorded with every generated file.
pub const BRIDGE_LIMITS: &[&str] = &[
    "review and allow_write patterns are not sandbox rules: every path below the working \
     directory stays writable and is decided after the run",
    "deny globs other than a literal path or `dir/**` are not passed to srt (bubblewrap binds \
     literal paths only); they are still decided after the run",
    "process rules and limits are applied by agentdiff, not by srt",
    "reads are not restricted (denyRead is empty)",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_paths_and_trailing_double_star_are_expressible() {
        assert_eq!(literal_path(".env"), Some(".env"));
        assert_eq!(literal_path(".git/**"), Some(".git"));
        assert_eq!(literal_path("./secrets/"), Some("secrets"));
        assert_eq!(literal_path("**/*.pem"), None);
        assert_eq!(literal_path(".env.*"), None);
        assert_eq!(literal_path("a/[bc]"), None);
        assert_eq!(literal_path("../outside"), None);
        assert_eq!(literal_path("/abs"), None);
        assert_eq!(literal_path("**"), None);
    }

    #[test]
    fn bridge_allows_the_workdir_and_denies_the_store_and_literal_paths() {
        let b = bridge(
            Path::new("/w"),
            Path::new("/w"),
            Path::new("/w/.agentdiff/runs/r1"),
            &[".env".into(), ".git/**".into(), "**/*.key".into()],
            &[],
        );
        assert_eq!(b.settings["filesystem"]["allowWrite"], json!(["/w"]));
        assert_eq!(
            b.settings["filesystem"]["denyWrite"],
            json!(["/w/.agentdiff", "/w/.env", "/w/.git"])
        );
        assert_eq!(b.settings["network"]["allowedDomains"], json!([]));
        assert_eq!(b.expressed, vec![".env", ".git/**"]);
        assert_eq!(b.not_expressed, vec!["**/*.key"]);
    }

    #[test]
    fn policy_denies_are_read_from_the_effective_policy() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(POLICY_ARTIFACT),
            r#"{"effective":{"filesystem":{"deny":[".env","**/*.pem"]}}}"#,
        )
        .unwrap();
        assert_eq!(
            read_policy_denies(dir.path()).unwrap(),
            vec![".env".to_string(), "**/*.pem".to_string()]
        );
        std::fs::write(dir.path().join(POLICY_ARTIFACT), r#"{"effective":{}}"#).unwrap();
        assert!(read_policy_denies(dir.path()).is_err());
        std::fs::remove_file(dir.path().join(POLICY_ARTIFACT)).unwrap();
        assert!(read_policy_denies(dir.path()).is_err());
    }

    #[test]
    fn settings_checks_and_digest() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("s.json");
        assert!(matches!(
            check_settings_file(&f),
            Err(SettingsError::Missing { .. })
        ));
        assert!(matches!(
            check_settings_file(dir.path()),
            Err(SettingsError::NotAFile { .. })
        ));
        std::fs::write(&f, b"{}").unwrap();
        check_settings_file(&f).unwrap();
        let (sha, n) = digest_file(&f).unwrap();
        assert_eq!(n, 2);
        assert_eq!(
            sha,
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn default_settings_evidence_names_the_builtin_defaults_or_the_home_file() {
        let home = tempfile::tempdir().unwrap();
        let env = vec![(
            OsString::from("HOME"),
            home.path().as_os_str().to_os_string(),
        )];
        let v = settings_evidence(&SettingsChoice::SrtDefault, &env).unwrap();
        assert_eq!(v["source"], "srt_builtin_defaults");
        assert_eq!(v["description"], "srt built-in defaults");
        std::fs::write(home.path().join(SRT_DEFAULT_SETTINGS), b"{}").unwrap();
        let v = settings_evidence(&SettingsChoice::SrtDefault, &env).unwrap();
        assert_eq!(v["source"], "srt_default_file");
        assert_eq!(v["bytes"], 2);
    }

    #[test]
    fn generated_settings_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(GENERATED_SETTINGS_FILE);
        write_generated(&p, &json!({"a": 1})).unwrap();
        assert!(write_generated(&p, &json!({"a": 2})).is_err());
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v, json!({"a": 1}));
    }
}
