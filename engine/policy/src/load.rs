//! Reading policy documents (YAML or JSON) from text and from the project.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::hook::resolve;
use super::node::{self, Node};
use super::{nesting, schema, Policy, PolicyError};

/// Largest policy document accepted, in bytes.
pub const MAX_POLICY_BYTES: usize = 1024 * 1024;
/// The policy file read from the project root when no `--policy` is given.
pub const POLICY_FILE_NAME: &str = "agentdiff.yaml";
/// Names that look like a policy file but are not read implicitly; finding one without
/// `agentdiff.yaml` is an error rather than a silent fallback to the built-in policy.
const MISNAMED: [&str; 2] = ["agentdiff.yml", "agentdiff.json"];

/// Where the policy in force came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PolicySource {
    /// No policy file: the conservative built-in policy.
    BuiltIn,
    /// A policy file and the SHA-256 of its exact bytes.
    File { path: PathBuf, sha256: String },
}

impl PolicySource {
    /// One-line description for output.
    pub fn describe(&self) -> String {
        match self {
            PolicySource::BuiltIn => "built-in policy".to_owned(),
            PolicySource::File { path, .. } => path.display().to_string(),
        }
    }
}

/// A policy and where it came from.
#[derive(Debug, Clone)]
pub struct LoadedPolicy {
    pub policy: Policy,
    pub source: PolicySource,
}

/// Load the policy in force: the explicit file if given, else `ROOT/agentdiff.yaml` if it
/// exists (never through a symlink that leads outside the root), else the built-in policy. A
/// relative explicit path is taken as given (relative to the current directory), as users expect
/// of a command-line flag.
pub fn load(root: &Path, explicit: Option<&Path>) -> Result<LoadedPolicy, PolicyError> {
    if let Some(path) = explicit {
        let mut loaded = load_file(path)?;
        // A policy file kept inside the project is protected configuration like agentdiff.yaml.
        let inside = std::fs::canonicalize(path)
            .ok()
            .zip(std::fs::canonicalize(root).ok())
            .and_then(|(p, r)| p.strip_prefix(r).ok().map(Path::to_path_buf));
        if let Some(rel) = inside.as_ref().and_then(|r| r.to_str()) {
            loaded.policy.protect_source(rel);
        }
        return Ok(loaded);
    }
    // A mistyped root must not look like "no policy file here" and fall back to the built-in.
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(PolicyError::Root {
                path: root.to_owned(),
                source: std::io::Error::other("not a directory"),
            })
        }
        Err(source) => {
            return Err(PolicyError::Root {
                path: root.to_owned(),
                source,
            })
        }
    }
    let default = root.join(POLICY_FILE_NAME);
    match std::fs::symlink_metadata(&default) {
        Ok(_) => return load_project_file(root),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(PolicyError::Io {
                path: default,
                source,
            })
        }
    }
    for name in MISNAMED {
        let candidate = root.join(name);
        if std::fs::symlink_metadata(&candidate).is_ok() {
            return Err(PolicyError::Misnamed {
                found: candidate,
                expected: default,
            });
        }
    }
    Ok(LoadedPolicy {
        policy: Policy::builtin(),
        source: PolicySource::BuiltIn,
    })
}

/// Load `ROOT/agentdiff.yaml`, resolved as the kernel resolves it. A symlink that leads outside
/// the root is refused: a project (or a command it ran) cannot make agentdiff read a file
/// elsewhere, and an error about that file could show its content. Reached through a symlink
/// inside the root, the file in force has another name, which is protected too.
fn load_project_file(root: &Path) -> Result<LoadedPolicy, PolicyError> {
    let file = Path::new(POLICY_FILE_NAME);
    let io = |source| PolicyError::Io {
        path: root.join(file),
        source,
    };
    let real_root = std::fs::canonicalize(root).map_err(|source| PolicyError::Root {
        path: root.to_owned(),
        source,
    })?;
    let found = resolve(&real_root, file).map_err(|e| io(std::io::Error::other(e.to_string())))?;
    if !found.target.starts_with(&real_root) {
        return Err(PolicyError::OutsideRoot {
            path: root.join(file),
        });
    }
    if found.file.is_none() {
        // A dangling link: say so about the name the user knows.
        return Err(io(std::io::ErrorKind::NotFound.into()));
    }
    let mut loaded = load_file(&found.target)?;
    if let PolicySource::File { path, .. } = &mut loaded.source {
        root.join(file).clone_into(path);
    }
    if let Some(rel) = found
        .target
        .strip_prefix(&real_root)
        .ok()
        .and_then(Path::to_str)
    {
        loaded.policy.protect_source(rel);
    }
    Ok(loaded)
}

/// Load one policy file. A FIFO or device is refused (it could block or stream without end),
/// and at most [`MAX_POLICY_BYTES`] + 1 bytes are read.
pub fn load_file(path: &Path) -> Result<LoadedPolicy, PolicyError> {
    let io = |source| PolicyError::Io {
        path: path.to_owned(),
        source,
    };
    let file = open_nonblocking(path).map_err(io)?;
    if !file.metadata().map_err(io)?.is_file() {
        return Err(PolicyError::NotAFile {
            path: path.to_owned(),
        });
    }
    let mut bytes = Vec::new();
    file.take(MAX_POLICY_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(io)?;
    let origin = path.display().to_string();
    if bytes.len() > MAX_POLICY_BYTES {
        return Err(PolicyError::TooLarge {
            origin,
            size: bytes.len(),
            max: MAX_POLICY_BYTES,
        });
    }
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let text = String::from_utf8(bytes).map_err(|_| PolicyError::NotUtf8 {
        path: path.to_owned(),
    })?;
    let policy = Policy::from_yaml_or_json(&text, &origin)?;
    Ok(LoadedPolicy {
        policy,
        source: PolicySource::File {
            path: path.to_owned(),
            sha256,
        },
    })
}

#[cfg(unix)]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

/// Parse text into a checked [`schema::Spec`]. JSON is detected by its first character (or a
/// `.json` origin); a document that starts like JSON but is not JSON is read as YAML (YAML flow
/// mappings also start with `{`).
pub(crate) fn parse(text: &str, origin: &str) -> Result<schema::Spec, PolicyError> {
    if text.len() > MAX_POLICY_BYTES {
        return Err(PolicyError::TooLarge {
            origin: origin.to_owned(),
            size: text.len(),
            max: MAX_POLICY_BYTES,
        });
    }
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim().is_empty() {
        return Err(PolicyError::Empty {
            origin: origin.to_owned(),
        });
    }
    let syntax = |message: String| PolicyError::Syntax {
        origin: origin.to_owned(),
        message,
    };
    // Before any parser: the YAML scanner's work per token grows with the nesting depth.
    nesting::check(text, node::MAX_DEPTH).map_err(|e| syntax(e.to_string()))?;
    let strict_json = origin.to_ascii_lowercase().ends_with(".json");
    let looks_json = text.trim_start().starts_with(['{', '[']);
    let tree = if strict_json {
        read_json(text).map_err(|e| syntax(e.to_string()))?
    } else if looks_json {
        match read_json(text) {
            Ok(tree) => tree,
            // Not JSON syntax: a YAML flow document. A JSON *data* error (duplicate key,
            // budget) stands: YAML would read the same document the same way.
            Err(e) if e.is_syntax() || e.is_eof() => {
                read_yaml(text).map_err(|e| syntax(e.to_string()))?
            }
            Err(e) => return Err(syntax(e.to_string())),
        }
    } else {
        read_yaml(text).map_err(|e| syntax(e.to_string()))?
    };
    if tree == Node::Null {
        return Err(PolicyError::Empty {
            origin: origin.to_owned(),
        });
    }
    schema::check(&tree).map_err(|problems| PolicyError::Invalid {
        origin: origin.to_owned(),
        problems,
    })
}

fn read_json(text: &str) -> Result<Node, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_str(text);
    let tree = node::read(&mut de)?;
    de.end()?;
    Ok(tree)
}

fn read_yaml(text: &str) -> Result<Node, serde_yaml::Error> {
    node::read(serde_yaml::Deserializer::from_str(text))
}
