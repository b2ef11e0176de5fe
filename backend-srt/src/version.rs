//! srt's version, proved by running `srt --version` once per srt binary identity and cached.
//!
//! srt is a Node.js program: `srt --version` starts a whole Node.js runtime (about 0.17 s), which
//! used to be paid twice per run (availability, then launch). The answer only changes when the
//! srt script or its interpreter changes, so it is cached under an [`Identity`] made of both
//! files' device, inode, size, modification and status-change times (the status-change time
//! cannot be set back by a user, so a replaced or edited file never matches an old entry).
//!
//! The cache lives in memory for the process and in `srt-version.json` in agentdiff's per-user
//! state directory ([`crate::settings::agentdiff_state_dir`]). Settings derived from the policy
//! deny every srt run writes (and reads) there, so a command under srt cannot forge an entry.
//! Reading and writing the file, and file identities, are the engine's [`cache_file`].
//! Not defended: a command run by another backend as the same user (e.g. `local`, which does not
//! confine writes) can write that file; the worst it gains is a wrong version string in later
//! srt evidence, or "Ready" for an srt that no longer runs — which then fails closed at launch
//! as a wrapper setup failure (the exec shim never marks the start). The file is ignored unless
//! it is a regular file owned by this user and writable by nobody else.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use agentdiff_host::cache_file;
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::host;

/// How long `srt --version` may take.
const VERSION_TIMEOUT: Duration = Duration::from_secs(30);
/// Name of the cache file in the state directory.
pub const CACHE_FILE: &str = "srt-version.json";
/// Entries kept in the cache file (one per srt install seen; old ones fall off).
const MAX_ENTRIES: usize = 8;

pub use agentdiff_host::cache_file::FileIdentity;

/// The srt executable and the interpreter its `#!` line names (Node.js for an npm install).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub srt: FileIdentity,
    pub interpreter: Option<FileIdentity>,
}

/// The interpreter a script's `#!` line starts: `#!/usr/bin/env NAME` looks NAME up on `path`.
fn interpreter(script: &Path, path: Option<&OsStr>) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(script).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    let program = words.next()?;
    if Path::new(program).file_name() == Some(OsStr::new("env")) {
        let name = words.find(|w| !w.starts_with('-'))?;
        agentdiff_host::system::find_program(OsStr::new(name), path, Path::new("/"))
    } else {
        Some(PathBuf::from(program))
    }
}

impl Identity {
    /// The identity of `srt` as it would start with `path` as PATH.
    pub fn of(srt: &Path, path: Option<&OsStr>) -> std::io::Result<Identity> {
        let srt_id = FileIdentity::of(srt)?;
        let interpreter = match interpreter(&srt_id.path, path) {
            Some(p) => Some(FileIdentity::of(&p)?),
            None => None,
        };
        Ok(Identity {
            srt: srt_id,
            interpreter,
        })
    }
}

/// Where a version answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VersionSource {
    /// `srt --version` ran now.
    Probed,
    /// An earlier `srt --version` of the same identity, in this process or the cache file.
    Cached,
}

/// srt's version and where it came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Version {
    pub version: String,
    pub source: VersionSource,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    identity: Identity,
    version: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    entries: Vec<Entry>,
}

static MEMORY: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn lookup(entries: &[Entry], identity: &Identity) -> Option<String> {
    entries
        .iter()
        .find(|e| &e.identity == identity)
        .map(|e| e.version.clone())
}

fn remember(entries: &mut Vec<Entry>, identity: &Identity, version: &str) {
    entries.retain(|e| &e.identity != identity);
    entries.insert(
        0,
        Entry {
            identity: identity.clone(),
            version: version.to_string(),
        },
    );
    entries.truncate(MAX_ENTRIES);
}

/// Why srt's version could not be had.
#[derive(Debug, thiserror::Error)]
pub enum VersionError {
    #[error("`{} --version` did not answer within {timeout:?}", srt.display())]
    Timeout { srt: PathBuf, timeout: Duration },
    #[error("cannot run `{} --version`: {source}", srt.display())]
    Run {
        srt: PathBuf,
        source: std::io::Error,
    },
    /// It ran but did not answer with one line on success; `detail` is its first stderr line.
    #[error("`{} --version` failed ({status}): {detail}", srt.display())]
    Failed {
        srt: PathBuf,
        status: std::process::ExitStatus,
        detail: String,
    },
}

/// srt's version: from the cache when this srt (and its interpreter) is unchanged since an
/// earlier `srt --version` answered, else by running `srt --version` with `env` (or agentdiff's
/// own environment) and caching the answer. `state_dir` is where the cache file lives (`None`:
/// memory only).
pub async fn version(
    srt: &Path,
    env: Option<&[(OsString, OsString)]>,
    state_dir: Option<&Path>,
) -> Result<Version, VersionError> {
    let path = match env {
        Some(env) => host::search_path(env),
        None => std::env::var_os("PATH"),
    };
    let identity = Identity::of(srt, path.as_deref()).ok();
    if let Some(id) = &identity {
        let hit = MEMORY.lock().ok().and_then(|m| lookup(&m, id));
        let hit = hit.or_else(|| {
            state_dir.and_then(|d| {
                lookup(
                    &cache_file::read::<CacheFile>(&d.join(CACHE_FILE)).entries,
                    id,
                )
            })
        });
        if let Some(version) = hit {
            if let Ok(mut m) = MEMORY.lock() {
                remember(&mut m, id, &version);
            }
            return Ok(Version {
                version,
                source: VersionSource::Cached,
            });
        }
    }
    let version = probe(srt, env).await?;
    if let Some(id) = &identity {
        if let Ok(mut m) = MEMORY.lock() {
            remember(&mut m, id, &version);
        }
        if let Some(dir) = state_dir {
            let mut cache: CacheFile = cache_file::read(&dir.join(CACHE_FILE));
            remember(&mut cache.entries, id, &version);
            cache_file::write(dir, CACHE_FILE, &cache);
        }
    }
    Ok(Version {
        version,
        source: VersionSource::Probed,
    })
}

/// How often `srt --version` is retried when exec reports ETXTBSY.
const ETXTBSY_RETRIES: u32 = 10;

/// Run `srt --version` (with `env`, the command's environment, when given: srt is a Node script
/// found through its PATH).
pub async fn probe(
    srt: &Path,
    env: Option<&[(OsString, OsString)]>,
) -> Result<String, VersionError> {
    let mut cmd = tokio::process::Command::new(srt);
    cmd.arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(env) = env {
        cmd.env_clear().envs(env.iter().map(|(k, v)| (k, v)));
    }
    let mut attempt = 0;
    let out = loop {
        let result = tokio::time::timeout(VERSION_TIMEOUT, cmd.output())
            .await
            .map_err(|_| VersionError::Timeout {
                srt: srt.to_path_buf(),
                timeout: VERSION_TIMEOUT,
            })?;
        match result {
            Ok(out) => break out,
            // ETXTBSY: the file is still open for writing somewhere, typically by a child another
            // thread forked while srt was being (re)installed or written; that descriptor closes
            // at the child's exec, so a short wait is enough. Anything else is final.
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < ETXTBSY_RETRIES => {
                attempt += 1;
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            Err(source) => {
                return Err(VersionError::Run {
                    srt: srt.to_path_buf(),
                    source,
                })
            }
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || stdout.is_empty() || stdout.lines().count() != 1 {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(VersionError::Failed {
            srt: srt.to_path_buf(),
            status: out.status,
            detail: stderr
                .lines()
                .next()
                .unwrap_or("no output")
                .chars()
                .take(200)
                .collect(),
        });
    }
    Ok(stdout.chars().take(100).collect())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        agentdiff_test_support::write_executable(&p, body, 0o755);
        p
    }

    #[test]
    fn the_interpreter_is_part_of_the_identity() {
        let dir = tempfile::tempdir().unwrap();
        let node = script(dir.path(), "node", "#!/bin/sh\n");
        let srt = script(dir.path(), "srt", "#!/usr/bin/env node\n");
        let path = dir.path().as_os_str().to_os_string();
        let id = Identity::of(&srt, Some(&path)).unwrap();
        assert_eq!(id.interpreter.as_ref().unwrap().path, node);
        let direct = script(dir.path(), "srt2", "#!/bin/sh\n");
        let id2 = Identity::of(&direct, Some(&path)).unwrap();
        assert_eq!(
            id2.interpreter.unwrap().path,
            std::fs::canonicalize("/bin/sh").unwrap()
        );
    }

    #[tokio::test]
    async fn a_changed_srt_is_probed_again_and_the_cache_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let srt = script(dir.path(), "srt-a", "#!/bin/sh\necho 1.0.0\n");
        let v = version(&srt, None, Some(&state)).await.unwrap();
        assert_eq!(
            (v.version.as_str(), v.source),
            ("1.0.0", VersionSource::Probed)
        );
        let v = version(&srt, None, Some(&state)).await.unwrap();
        assert_eq!(
            (v.version.as_str(), v.source),
            ("1.0.0", VersionSource::Cached)
        );
        let mode = std::fs::metadata(state.join(CACHE_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
        // Another process sees the file entry; an edited script is a new identity.
        MEMORY.lock().unwrap().clear();
        let v = version(&srt, None, Some(&state)).await.unwrap();
        assert_eq!(v.source, VersionSource::Cached);
        agentdiff_test_support::write_executable(&srt, "#!/bin/sh\necho 2.0.0\n", 0o755);
        let v = version(&srt, None, Some(&state)).await.unwrap();
        assert_eq!(
            (v.version.as_str(), v.source),
            ("2.0.0", VersionSource::Probed)
        );
    }

    #[tokio::test]
    async fn a_cache_file_writable_by_others_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let srt = script(dir.path(), "srt-b", "#!/bin/sh\necho 3.0.0\n");
        let id = Identity::of(&srt, None).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let forged = CacheFile {
            entries: vec![Entry {
                identity: id,
                version: "forged".into(),
            }],
        };
        let file = state.join(CACHE_FILE);
        std::fs::write(&file, serde_json::to_vec(&forged).unwrap()).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
        let v = version(&srt, None, Some(&state)).await.unwrap();
        assert_eq!(
            (v.version.as_str(), v.source),
            ("3.0.0", VersionSource::Probed)
        );
    }

    #[tokio::test]
    async fn a_broken_srt_is_an_error_and_not_cached() {
        let dir = tempfile::tempdir().unwrap();
        let srt = script(dir.path(), "srt-c", "#!/bin/sh\necho broken >&2\nexit 1\n");
        let err = version(&srt, None, Some(dir.path())).await.unwrap_err();
        assert!(
            matches!(&err, VersionError::Failed { detail, .. } if detail == "broken"),
            "{err}"
        );
        assert!(!dir.path().join(CACHE_FILE).exists());
    }
}
