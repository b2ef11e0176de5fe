//! srt settings: which file srt reads, its digest for evidence, and the derivation of a settings
//! file from the effective agentdiff policy (the default when no `--srt-settings` is named).
//!
//! The derived settings let the command write below its working directory and nowhere else, deny
//! writes to the evidence store, `.git` and every git directory found in the tree, the policy's
//! literal deny paths, the project's configuration that exists
//! (`agentdiff_backend_api::protected`: the policy, the ignore rules, `.claude`) and agentdiff's
//! per-user state directory (its key and caches), deny reads of well-known credential locations
//! and of that state directory, and allow network access only to the domains the run lists
//! (`srt-allow-domain`, from the command line or the policy's `runtime.options`).
//!
//! Not defended: the derived file is a request to srt; agentdiff does not audit srt's
//! enforcement (the labels stay `requested`). Deny globs srt cannot take on Linux are only
//! decided after the run. Credential locations outside the listed ones are readable.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use agentdiff_backend_api::protected::literal_path;
use serde_json::{json, Value};

use crate::facts::{SettingsFacts, SettingsSource};
use sha2::{Digest, Sha256};

/// Name of the derived settings file in the run capsule.
pub const GENERATED_SETTINGS_FILE: &str = "srt-settings.json";
/// Name of the file the transaction writes before launch, holding the effective policy.
pub const POLICY_ARTIFACT: &str = "policy.json";

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
    #[error("cannot write the derived srt settings {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where srt's settings come from for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SettingsChoice {
    /// A file named with `--srt-settings` (absolute): it wins over the derivation.
    File(PathBuf),
    /// Derived from the effective policy into the capsule at launch (the default).
    FromPolicy(PathBuf),
}

impl SettingsChoice {
    /// The path handed to `srt --settings`.
    pub fn path(&self) -> &Path {
        match self {
            SettingsChoice::File(p) | SettingsChoice::FromPolicy(p) => p,
        }
    }

    pub fn source(&self) -> SettingsSource {
        match self {
            SettingsChoice::File(_) => SettingsSource::File,
            SettingsChoice::FromPolicy(_) => SettingsSource::GeneratedFromPolicy,
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

/// Evidence for the settings srt used: source, path, digest and size of the exact bytes.
pub fn settings_evidence(choice: &SettingsChoice) -> Result<SettingsFacts, SettingsError> {
    let path = choice.path();
    let (sha256, bytes) = digest_file(path)?;
    Ok(SettingsFacts {
        source: choice.source(),
        path: path.to_string_lossy().into_owned(),
        sha256,
        bytes,
        bridge: None,
    })
}

/// Credential locations below a home directory whose reads the derived settings deny: the
/// engine's one list, shared with the bwrap backend and the hook.
pub use agentdiff_host::credentials::HOME_CREDENTIAL_LOCATIONS as CREDENTIAL_LOCATIONS;
use agentdiff_host::credentials::SYSTEM_CREDENTIAL_LOCATIONS;

/// agentdiff's per-user state directory (its seal key and caches), resolved exactly as the store
/// resolves it (`$AGENTDIFF_STATE_DIR`, `$XDG_STATE_HOME/agentdiff`, `$HOME/.local/state/agentdiff`),
/// so the directory denied to the command is the one holding the key. `None` when it cannot be
/// resolved (the store then refuses to seal as well).
pub fn agentdiff_state_dir() -> Option<PathBuf> {
    agentdiff_host::state_dir::locate().ok()
}

/// The home directories whose credential locations are denied: the command's `HOME`,
/// agentdiff's own, when they are absolute paths, and the user database's home of this user.
pub fn home_dirs(env: &[(OsString, OsString)]) -> Vec<PathBuf> {
    let command_home = env
        .iter()
        .rev()
        .find(|(k, _)| k == "HOME")
        .map(|(_, v)| PathBuf::from(v));
    let mut homes: Vec<PathBuf> = Vec::new();
    // And the user database's home of the user the command runs as, which `$HOME` may not name.
    let own_user = agentdiff_host::system::effective_user_home();
    for h in [
        command_home,
        std::env::var_os("HOME").map(PathBuf::from),
        own_user,
    ]
    .into_iter()
    .flatten()
    {
        if h.is_absolute() && !homes.contains(&h) {
            homes.push(h);
        }
    }
    homes
}

/// The effective policy's filesystem deny patterns and where they came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyDenies {
    pub patterns: Vec<String>,
    /// `run_policy` (the run's effective policy, which the transaction hands over in the launch
    /// spec and records as `policy.json`) or `none` (a spec without deny patterns: a direct
    /// backend call outside a transaction, such as a probe).
    pub source: &'static str,
}

/// The deny patterns the launch spec carries. The backend never reads the capsule for them: the
/// transaction puts the effective policy's patterns in the spec before anything is launched.
pub fn policy_denies(spec_patterns: &[String]) -> PolicyDenies {
    PolicyDenies {
        patterns: spec_patterns.to_vec(),
        source: if spec_patterns.is_empty() {
            "none"
        } else {
            "run_policy"
        },
    }
}

/// Everything the derivation reads.
#[derive(Debug, Clone)]
pub struct BridgeInput<'a> {
    pub workdir: &'a Path,
    pub root: &'a Path,
    pub denies: &'a [String],
    pub allow_domains: &'a [String],
    /// Home directories whose [`CREDENTIAL_LOCATIONS`] are denied for reading.
    pub homes: &'a [PathBuf],
    /// agentdiff's state directory ([`agentdiff_state_dir`]).
    pub state_dir: Option<&'a Path>,
    /// What the run keeps read-only ([`agentdiff_backend_api::protected::read_only_paths`]):
    /// `.git` and every git directory found, the store, the capsule, the project's configuration.
    pub read_only: &'a [(PathBuf, &'static str)],
}

/// A settings file derived from the policy, and what it could not express.
#[derive(Debug, Clone, PartialEq)]
pub struct Bridged {
    pub settings: Value,
    /// Policy deny patterns that became `denyWrite` entries.
    pub expressed: Vec<String>,
    /// Policy deny patterns srt cannot take on Linux (globs other than a trailing `/**`).
    pub not_expressed: Vec<String>,
    /// Read denials left out because the working directory lies inside them (the command could
    /// not run at all); the paths stay readable.
    pub reads_left_readable: Vec<String>,
}

fn push_unique(list: &mut Vec<String>, p: &Path) {
    let s = p.to_string_lossy().into_owned();
    if !list.contains(&s) {
        list.push(s);
    }
}

/// Translate the policy into srt settings (see the module documentation).
pub fn bridge(input: &BridgeInput<'_>) -> Bridged {
    let mut deny_write: Vec<String> = Vec::new();
    // The command must not rewrite the evidence of its own run, nor Git's control data: the
    // store and `.git` even when absent (srt binds an empty read-only placeholder, so neither can
    // be created), the rest of the run's read-only list where it exists (srt would otherwise
    // leave a placeholder in the project for each configuration file).
    push_unique(&mut deny_write, &input.root.join(".agentdiff"));
    if let Some(state) = input.state_dir {
        push_unique(&mut deny_write, state);
    }
    push_unique(&mut deny_write, &input.root.join(".git"));
    if input.workdir != input.root {
        push_unique(&mut deny_write, &input.workdir.join(".git"));
    }
    for (p, _) in input.read_only {
        let covered = deny_write.iter().any(|d| p.starts_with(d));
        if !covered && p.symlink_metadata().is_ok() {
            push_unique(&mut deny_write, p);
        }
    }
    let mut expressed = Vec::new();
    let mut not_expressed = Vec::new();
    for pattern in input.denies {
        match literal_path(pattern) {
            Some(rel) => {
                push_unique(&mut deny_write, &input.workdir.join(rel));
                expressed.push(pattern.clone());
            }
            None => not_expressed.push(pattern.clone()),
        }
    }
    let mut deny_read: Vec<String> = Vec::new();
    let mut reads_left_readable = Vec::new();
    let readable_needed = |p: &Path| input.workdir.starts_with(p) || input.root.starts_with(p);
    let candidates = input
        .homes
        .iter()
        .flat_map(|h| CREDENTIAL_LOCATIONS.iter().map(move |rel| h.join(rel)))
        // Only the system locations that exist: srt would otherwise create a placeholder for
        // each below the read-only `/etc`.
        .chain(
            SYSTEM_CREDENTIAL_LOCATIONS
                .iter()
                .map(PathBuf::from)
                .filter(|p| p.symlink_metadata().is_ok()),
        )
        .chain(input.state_dir.map(Path::to_path_buf));
    for p in candidates {
        if readable_needed(&p) {
            push_unique(&mut reads_left_readable, &p);
        } else {
            push_unique(&mut deny_read, &p);
        }
    }
    let settings = json!({
        "filesystem": {
            "denyRead": deny_read,
            "allowRead": [],
            "allowWrite": [input.workdir.to_string_lossy()],
            "denyWrite": deny_write,
        },
        "network": {
            "allowedDomains": input.allow_domains,
            "deniedDomains": [],
        },
    });
    Bridged {
        settings,
        expressed,
        not_expressed,
        reads_left_readable,
    }
}

/// Write derived settings to `path` (which must not exist yet), mode 0600. Not flushed to disk:
/// the file lives only for the run and srt reads it from the page cache.
pub fn write_generated(path: &Path, settings: &Value) -> Result<Vec<u8>, SettingsError> {
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
    Ok(text)
}

/// What the policy bridge cannot express, recorded with every derived file.
pub const BRIDGE_LIMITS: &[&str] = &[
    "review and allow_write patterns are not sandbox rules: every path below the working \
     directory stays writable and is decided after the run",
    "deny globs other than a literal path or `dir/**` are not passed to srt (bubblewrap binds \
     literal paths only); they are still decided after the run",
    "process rules and limits are applied by agentdiff, not by srt",
    "reads are denied only for the listed credential locations and agentdiff's state directory; \
     everything else the user can read stays readable",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(denies: &'a [String], homes: &'a [PathBuf]) -> BridgeInput<'a> {
        BridgeInput {
            workdir: Path::new("/w"),
            root: Path::new("/w"),
            denies,
            allow_domains: &[],
            homes,
            state_dir: Some(Path::new("/h/.local/state/agentdiff")),
            read_only: &[],
        }
    }

    #[test]
    fn bridge_allows_the_workdir_and_denies_the_store_git_state_and_literal_paths() {
        let denies = [".env".to_string(), ".git/**".into(), "**/*.key".into()];
        let b = bridge(&input(&denies, &[]));
        assert_eq!(b.settings["filesystem"]["allowWrite"], json!(["/w"]));
        assert_eq!(
            b.settings["filesystem"]["denyWrite"],
            json!([
                "/w/.agentdiff",
                "/h/.local/state/agentdiff",
                "/w/.git",
                "/w/.env"
            ])
        );
        assert_eq!(b.settings["network"]["allowedDomains"], json!([]));
        assert_eq!(b.expressed, vec![".env", ".git/**"]);
        assert_eq!(b.not_expressed, vec!["**/*.key"]);
    }

    /// The run's read-only list (the project's configuration, the git directories found) is
    /// denied where it exists, and gets no placeholder where it does not.
    #[test]
    fn bridge_denies_writing_the_read_only_paths_that_exist() {
        use agentdiff_backend_api::protected::PROTECTED_CONFIGURATION;
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::write(root.join("agentdiff.yaml"), "version: 2\n").unwrap();
        std::fs::create_dir(root.join(".claude")).unwrap();
        std::fs::create_dir_all(root.join("sub/.git")).unwrap();
        std::fs::create_dir_all(root.join("vendor/x.git")).unwrap();
        let mut read_only: Vec<(PathBuf, &str)> = PROTECTED_CONFIGURATION
            .iter()
            .map(|(rel, why)| (root.join(rel), *why))
            .collect();
        for g in ["sub/.git", "vendor/x.git", "gone/.git"] {
            read_only.push((root.join(g), "git directory"));
        }
        let b = bridge(&BridgeInput {
            workdir: root,
            root,
            read_only: &read_only,
            ..input(&[], &[])
        });
        let denied = b.settings["filesystem"]["denyWrite"].as_array().unwrap();
        for (p, _) in &read_only {
            let listed = denied.contains(&json!(p.to_string_lossy()));
            assert_eq!(listed, p.exists(), "{}: {denied:?}", p.display());
        }
        assert!(!root.join(".agentdiffignore").exists() && !root.join("gone").exists());
    }

    #[test]
    fn bridge_denies_credential_reads_but_never_the_working_directory() {
        let homes = [PathBuf::from("/h")];
        let b = bridge(&input(&[], &homes));
        let reads = b.settings["filesystem"]["denyRead"].as_array().unwrap();
        for p in [
            "/h/.ssh",
            "/h/.aws",
            "/h/.netrc",
            "/h/.local/state/agentdiff",
        ] {
            assert!(reads.contains(&json!(p)), "{p} not in {reads:?}");
        }
        assert!(b.reads_left_readable.is_empty());
        // The system's credential locations that exist here are denied too; absent ones are not
        // listed (srt would make a placeholder below the read-only /etc for each).
        for l in SYSTEM_CREDENTIAL_LOCATIONS {
            let exists = Path::new(l).symlink_metadata().is_ok();
            assert_eq!(reads.contains(&json!(l)), exists, "{l} in {reads:?}");
        }
        // A project that lives inside a credential location stays usable; the read denial that
        // would hide it is left out and said so.
        let mut i = input(&[], &homes);
        i.workdir = Path::new("/h/.ssh/project");
        i.root = Path::new("/h/.ssh/project");
        let b = bridge(&i);
        let reads = b.settings["filesystem"]["denyRead"].as_array().unwrap();
        assert!(!reads.contains(&json!("/h/.ssh")));
        assert_eq!(b.reads_left_readable, vec!["/h/.ssh"]);
    }

    #[test]
    fn policy_denies_are_the_launch_specs_and_say_so() {
        let d = policy_denies(&[".env".to_string(), "**/*.pem".to_string()]);
        assert_eq!(d.source, "run_policy");
        assert_eq!(d.patterns, vec![".env".to_string(), "**/*.pem".to_string()]);
        let none = policy_denies(&[]);
        assert_eq!(none.source, "none");
        assert!(none.patterns.is_empty());
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
    fn generated_settings_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(GENERATED_SETTINGS_FILE);
        write_generated(&p, &json!({"a": 1})).unwrap();
        assert!(write_generated(&p, &json!({"a": 2})).is_err());
        let v: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
        assert_eq!(v, json!({"a": 1}));
    }
}
