//! The home directories by allowlist: under the default `home: allowlist` every home
//! (agentdiff's and the command's) is an empty tmpfs, read-only once the sandbox is built, in
//! which only the allowlist is shown: [`HOME_ALLOWLIST`] and the `home-read` entries read-only,
//! the `home-write` entries writable. The project root and the `writable` paths are bound after
//! it, so a project under `$HOME` stays reachable. The per-user runtime directories
//! ([`RUNTIME_DIRS`], whether or not `$XDG_RUNTIME_DIR` is set), `$XDG_RUNTIME_DIR` and the agent
//! sockets the environment names (`SSH_AUTH_SOCK`, `GPG_AGENT_INFO`, `DBUS_SESSION_BUS_ADDRESS`)
//! are hidden and their variables dropped ([`AGENT_VARS`]).
//!
//! Invariants: an allowlist entry is a path below a home (`~/…` without `..`, never the home
//! itself), never agentdiff's state directory nor anything containing or inside it (refused);
//! an entry that is a symlink is shown as that symlink (`--symlink`), never as a bind of its
//! target at the entry's path, so the target is seen only where the sandbox shows it (a link
//! into a hidden location or elsewhere in the home leads to nothing). The credential locations
//! stay hidden inside allowlisted directories (their mounts come later).
//!
//! `home: denylist` keeps the previous behaviour (the home readable except the credential
//! list) and is labelled for what it is: unlisted files are readable.
//!
//! Not defended: secrets inside an allowlisted directory other than the credential list (a
//! token a tool keeps in `~/.npm` or `~/.cargo/config.toml`). Sockets below `/run` are the
//! daemon-socket sweep's ([`super::daemon_sockets`]).

use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};

use agentdiff_backend_api::BackendOptions;
use serde::Serialize;

use crate::{OPT_HOME, OPT_HOME_READ, OPT_HOME_SOCKETS, OPT_HOME_WRITE};

use super::{Mount, MountKind, PlanError};

/// What the command needs of the home to work, shown read-only by default: git's configuration,
/// toolchains and their caches. Credential locations inside them stay hidden.
pub const HOME_ALLOWLIST: &[&str] = &[
    ".gitconfig",
    ".config/git",
    ".cargo",
    ".rustup",
    ".npm",
    ".cache/pip",
    ".local/bin",
];

/// Variables naming the runtime directory and agent sockets: dropped under the allowlist.
pub const AGENT_VARS: &[&str] = &[
    "SSH_AUTH_SOCK",
    "SSH_AGENT_PID",
    "GPG_AGENT_INFO",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
];

/// How the homes are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HomeMode {
    /// Hidden except the allowlist (the default).
    Allowlist,
    /// Readable except the credential list.
    Denylist,
}

/// The `home`, `home-read` and `home-write` options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeOptions {
    pub mode: HomeMode,
    pub read: Vec<String>,
    pub write: Vec<String>,
    /// `home-sockets: allow`: the runtime directory and agent sockets stay, with their variables.
    pub sockets_allowed: bool,
}

impl HomeOptions {
    /// Whether the runtime directory and agent sockets are hidden and their variables dropped.
    pub fn hide_agents(&self) -> bool {
        self.mode == HomeMode::Allowlist && !self.sockets_allowed
    }
}

/// Read and check the home options (`~/…` below the home, without `..`).
pub fn read_options(o: &BackendOptions) -> Result<HomeOptions, PlanError> {
    let mode = match o.get(OPT_HOME) {
        None | Some("allowlist") => HomeMode::Allowlist,
        Some("denylist") => HomeMode::Denylist,
        Some(v) => {
            return Err(PlanError::BadOption {
                key: OPT_HOME,
                message: format!("`{v}` is not `allowlist` or `denylist`"),
            })
        }
    };
    let mut lists = [Vec::new(), Vec::new()];
    for (list, key) in lists.iter_mut().zip([OPT_HOME_READ, OPT_HOME_WRITE]) {
        for v in o.get_all(key) {
            let rest = v.strip_prefix("~/").unwrap_or("");
            let bad = Path::new(rest)
                .components()
                .any(|c| !matches!(c, Component::Normal(_)));
            if rest.trim_matches('/').is_empty() || bad {
                return Err(PlanError::BadOption {
                    key,
                    message: format!(
                        "{v:?} must name a path below the home, as `~/…`, without `..`"
                    ),
                });
            }
            list.push(rest.trim_end_matches('/').to_string());
        }
    }
    let [read, write] = lists;
    let sockets_allowed = match o.get(OPT_HOME_SOCKETS) {
        None | Some("hide") => false,
        Some("allow") => true,
        Some(v) => {
            return Err(PlanError::BadOption {
                key: OPT_HOME_SOCKETS,
                message: format!("`{v}` is not `hide` or `allow`"),
            })
        }
    };
    Ok(HomeOptions {
        mode,
        read,
        write,
        sockets_allowed,
    })
}

/// Where the per-user runtime directories live (`/run/user/UID`), hidden whole under the home
/// allowlist whether or not `$XDG_RUNTIME_DIR` names one of them.
pub const RUNTIME_DIRS: &str = "/run/user";

/// The runtime directory and the agent sockets `env` names (absolute paths only).
pub fn agent_locations(env: &[(OsString, OsString)]) -> Vec<(PathBuf, String)> {
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k.as_os_str() == OsStr::new(name))
            .map(|(_, v)| v.to_string_lossy().into_owned())
            .filter(|v| !v.is_empty())
    };
    let mut out = Vec::new();
    if let Some(dir) = var("XDG_RUNTIME_DIR") {
        out.push((
            PathBuf::from(dir),
            "runtime directory ($XDG_RUNTIME_DIR)".into(),
        ));
    }
    if let Some(sock) = var("SSH_AUTH_SOCK") {
        out.push((PathBuf::from(sock), "agent socket ($SSH_AUTH_SOCK)".into()));
    }
    if let Some(info) = var("GPG_AGENT_INFO") {
        if let Some(sock) = info.split(':').next() {
            out.push((PathBuf::from(sock), "agent socket ($GPG_AGENT_INFO)".into()));
        }
    }
    if let Some(addr) = var("DBUS_SESSION_BUS_ADDRESS") {
        for part in addr.split([';', ',']) {
            if let Some(p) = part
                .strip_prefix("unix:path=")
                .or_else(|| part.strip_prefix("path="))
            {
                let why = "session bus socket ($DBUS_SESSION_BUS_ADDRESS)";
                out.push((PathBuf::from(p), why.into()));
            }
        }
    }
    out.retain(|(p, _)| p.is_absolute());
    out
}

fn overlaps(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The home mounts under the allowlist, in order: each home's tmpfs, then its allowed entries
/// (that exist). `state_dir` may not be allowed, nor overlap an entry. A home inside a
/// `writable` path (the root included) is shown whole by that path's bind, so it gets no tmpfs
/// (its remount would otherwise reach the covering bind).
pub fn mounts(
    homes: &[PathBuf],
    opts: &HomeOptions,
    state_dir: Option<&Path>,
    writable: &[PathBuf],
    not_applied: &mut Vec<String>,
) -> Result<Vec<Mount>, PlanError> {
    let mut out: Vec<Mount> = Vec::new();
    let mut seen: Vec<PathBuf> = Vec::new();
    for home in homes {
        let Ok(home) = home.canonicalize() else {
            continue;
        };
        if home == Path::new("/") || seen.contains(&home) || !home.is_dir() {
            continue;
        }
        if let Some(w) = writable.iter().find(|w| home.starts_with(w)) {
            not_applied.push(format!(
                "home {} is inside the writable {}: shown whole",
                home.display(),
                w.display()
            ));
            continue;
        }
        seen.push(home.clone());
        out.push(Mount {
            kind: MountKind::HomeTmpfs,
            path: home.clone(),
            target: None,
            reason: "home hidden (allowlist)".into(),
        });
        let entries = HOME_ALLOWLIST
            .iter()
            .map(|e| (e.to_string(), false, "home allowlist (default)"))
            .chain(
                opts.read
                    .iter()
                    .map(|e| (e.clone(), false, "home-read option")),
            )
            .chain(
                opts.write
                    .iter()
                    .map(|e| (e.clone(), true, "home-write option")),
            );
        for (rel, writable, why) in entries {
            let path = home.join(&rel);
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                if why != "home allowlist (default)" {
                    not_applied.push(format!("{}: does not exist, not shown", path.display()));
                }
                continue;
            };
            if let Some(state) = state_dir {
                let resolved = path.canonicalize().unwrap_or_else(|_| path.clone());
                if overlaps(&path, state) || overlaps(&resolved, state) {
                    let key = if writable {
                        OPT_HOME_WRITE
                    } else {
                        OPT_HOME_READ
                    };
                    return Err(PlanError::BadOption {
                        key,
                        message: format!(
                            "{} holds or lies in agentdiff's state directory {}: never shown",
                            path.display(),
                            state.display()
                        ),
                    });
                }
            }
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).ok();
                out.push(Mount {
                    kind: MountKind::Symlink,
                    path,
                    target,
                    reason: format!("{why} (a symlink, shown as one)"),
                });
                continue;
            }
            out.push(Mount {
                kind: if writable {
                    MountKind::Writable
                } else {
                    MountKind::ReadOnly
                },
                path,
                target: None,
                reason: why.into(),
            });
        }
    }
    Ok(out)
}
