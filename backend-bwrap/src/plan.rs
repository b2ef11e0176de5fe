//! The pure part of the backend: from a launch request and a few host facts to the exact bwrap
//! argv. Nothing here starts a process or writes a file; it only looks at which paths exist, so
//! that a hidden or re-bound path that does not exist is never handed to bwrap (which would fail
//! to create a mount point on the read-only host).
//!
//! Mount order matters (later mounts cover earlier ones): host read-only, fresh `/dev` and
//! `/proc`, private `/tmp`, the project root and extra writable paths, then the read-only
//! re-binds inside them, then the hidden credential locations (which win over everything, so a
//! writable or protected path inside a hidden one stays hidden), and last the exec shim and its
//! start marker, each bound read-only so it is reachable wherever it lives (`/tmp` included)
//! unless the sandbox already shows it read-only at its own path: a path without symlinks whose
//! last covering mount is a read-only re-bind (the marker, in the capsule below the re-bound
//! `.agentdiff`), or, covered by no planned mount, the host's `--ro-bind / /` outside `/dev`,
//! `/proc` and `/tmp`. Every mount saved is one fewer for bwrap to make, and read the mount
//! table for, on every start.

use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};

use agentdiff_backend_api::environment::is_runtime_injection;
use agentdiff_backend_api::protected::literal_path;
use agentdiff_backend_api::LaunchSpec;
use agentdiff_host::system::canonical_if_present;
use agentdiff_process::containers::{EngineReach, HiddenSocket};
use agentdiff_process::exec_shim;
use serde::Serialize;

use crate::{
    OPTION_KEYS, OPT_EXECUTABLE, OPT_EXEC_SHIM, OPT_HIDE, OPT_HOST_SOCKETS, OPT_NETWORK,
    OPT_WRITABLE,
};

pub mod daemon_sockets;
mod home;
pub use home::{HomeMode, AGENT_VARS, HOME_ALLOWLIST};

/// Name of the start-marker FIFO in the run capsule (removed when the run ends).
pub const START_MARKER_FILE: &str = "bwrap-start-marker.fifo";
/// Name of the start-gate FIFO in the run capsule, where the exec shim waits until the run is
/// released (`agentdiff_process::exec_shim::start_gate`; removed when the run ends).
pub const START_GATE_FILE: &str = "bwrap-start-gate.fifo";

/// Credential locations below a home directory, hidden from the command when they exist: the
/// engine's one list, shared with the srt backend and the hook.
pub use agentdiff_host::credentials::HOME_CREDENTIAL_LOCATIONS as CREDENTIAL_LOCATIONS;
use agentdiff_host::credentials::SYSTEM_CREDENTIAL_LOCATIONS;

/// Errors of planning: the request cannot be turned into a sandbox as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("no command to run")]
    NoCommand,
    #[error("unknown bwrap option `{0}`; the bwrap backend accepts: {keys}", keys = OPTION_KEYS.join(", "))]
    UnknownOption(String),
    #[error("`{key}`: {message}")]
    BadOption { key: &'static str, message: String },
    #[error("{0}")]
    Layout(String),
    /// The bwrap executable is one a command could replace (refused, with the remedy).
    #[error("{0}")]
    UntrustedBwrap(String),
}

/// Whether the command gets a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// `--unshare-net`: only a loopback interface of its own.
    None,
    /// The host's network (`runtime.bwrap.network: host`).
    Host,
    /// `--unshare-net` with agentdiff's egress proxy as the only route out: its Unix socket is
    /// bound into the sandbox, the exec shim's forwarder listens on the sandbox's
    /// `127.0.0.1:`[`EGRESS_PORT`], and the proxy variables point there (the default when the
    /// run has the proxy, i.e. `network.egress` allows anything).
    Filtered,
}

impl Network {
    /// Whether the command gets a network namespace of its own (no route to the host's).
    pub fn unshared(self) -> bool {
        self != Network::Host
    }
}

/// The port the egress forwarder listens on inside the sandbox (shared with every backend that
/// labels its network `filtered`).
pub use agentdiff_backend_api::egress::FORWARDER_PORT as EGRESS_PORT;

/// What one mount does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MountKind {
    /// `--bind P P`.
    Writable,
    /// `--ro-bind P P` inside a writable path.
    ReadOnly,
    /// `--tmpfs P --remount-ro P`: an empty, read-only directory.
    HiddenDir,
    /// `--ro-bind /dev/null P`: an empty, read-only file.
    HiddenFile,
    /// `--tmpfs P`, remounted read-only after every mount below it: a home under the allowlist.
    HomeTmpfs,
    /// `--symlink TARGET P`: an allowlisted home entry or an entry of the rebuilt `/run` that is
    /// a symlink, shown as one.
    Symlink,
    /// `--tmpfs P`, remounted read-only after every mount below it: `/run` rebuilt without the
    /// host daemons' sockets ([`daemon_sockets::Rebuild`]).
    RunTmpfs,
    /// `--dir P`: a directory of the rebuilt `/run` with a daemon socket below it, made anew.
    RunDir,
    /// `--ro-bind-try P P`: an entry of the rebuilt `/run`, the host's, read-only; skipped when
    /// it is gone by the launch.
    RunEntry,
    /// No argument: a daemon socket the rebuilt `/run` leaves out.
    LeftOut,
}

impl MountKind {
    /// Whether bwrap needs `path` on the host: as the source of a bind, or as a mount point on
    /// the read-only host tree. Not for what is made in a tmpfs or skipped when missing.
    fn needs_host_path(self) -> bool {
        !matches!(
            self,
            MountKind::Symlink | MountKind::RunDir | MountKind::RunEntry | MountKind::LeftOut
        )
    }
}

/// One planned mount with the reason it is there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Mount {
    pub kind: MountKind,
    pub path: PathBuf,
    /// The link's target, for [`MountKind::Symlink`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<PathBuf>,
    pub reason: String,
}

/// Facts about the user that decide which locations are hidden.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostFacts {
    /// Home directories whose credential locations are hidden (agentdiff's and the command's).
    pub homes: Vec<PathBuf>,
    /// agentdiff's per-user state directory (its seal key lives there), resolved only by the
    /// store's own rule (`StateDir::from_env`); `None` when it cannot be resolved (the store then
    /// refuses to seal as well).
    pub state_dir: Option<PathBuf>,
    /// Whether agentdiff's stdin is a terminal: an interactive run keeps the caller's session
    /// (so the terminal, Ctrl-C and job control work) and relies on the exec shim's TIOCSTI
    /// filter; otherwise the sandbox gets a new session as well.
    pub interactive: bool,
    /// Container engine API sockets (the engine's own candidate list, `DOCKER_HOST` included,
    /// plus [`RUNTIME_SOCKETS`]): hidden from the command, because a container started through
    /// one can bind-mount and write any host path.
    pub engine_sockets: Vec<PathBuf>,
    /// Credential locations named by the command's environment and agentdiff's default key
    /// directories ([`env_credential_locations`]), hidden like the home ones.
    pub env_credentials: Vec<(PathBuf, String)>,
    /// The runtime directory and agent sockets agentdiff's and the command's environments name:
    /// hidden under the home allowlist.
    pub agent_sockets: Vec<(PathBuf, String)>,
    /// Host daemons' sockets below `/run` ([`daemon_sockets`]): hidden unless
    /// `host-sockets: allow`.
    pub daemon_sockets: daemon_sockets::Found,
}

/// Credential files a tool keeps below the directory an environment variable names.
const CREDENTIAL_DIR_VARS: &[(&str, &[&str])] = &[
    ("CARGO_HOME", &["credentials.toml", "credentials"]),
    ("DOCKER_CONFIG", &[""]),
    ("GNUPGHOME", &[""]),
];
/// Variables naming a credential file each (`KUBECONFIG` a `:`-separated list of them).
const CREDENTIAL_FILE_VARS: &[&str] = &[
    "KUBECONFIG",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
];

/// The credential locations `env` relocates away from the home ones (each with the variable
/// that names it), and agentdiff's default key directories (`HOME/.local/state/agentdiff` for
/// each of `homes`, `$XDG_STATE_HOME/agentdiff`), which hold a key even when
/// `AGENTDIFF_STATE_DIR` points the store elsewhere. Relative values are ignored: the tools
/// read them against a working directory inside the (readable) project.
pub fn env_credential_locations(
    env: &[(OsString, OsString)],
    homes: &[PathBuf],
) -> Vec<(PathBuf, String)> {
    let var = |name: &str| {
        env.iter()
            .rev()
            .find(|(k, _)| k.as_os_str() == OsStr::new(name))
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    let mut push = |p: PathBuf, why: String| {
        if p.is_absolute() && !has_parent_refs(&p) && !out.iter().any(|(q, _)| *q == p) {
            out.push((p, why));
        }
    };
    for (name, subpaths) in CREDENTIAL_DIR_VARS {
        if let Some(dir) = var(name) {
            for sub in *subpaths {
                let p = PathBuf::from(&dir);
                let p = if sub.is_empty() { p } else { p.join(sub) };
                push(p, format!("credential location (${name})"));
            }
        }
    }
    if let Some(config) = var("XDG_CONFIG_HOME") {
        for rel in CREDENTIAL_LOCATIONS.iter() {
            if let Some(sub) = rel.strip_prefix(".config/") {
                push(
                    PathBuf::from(&config).join(sub),
                    "credential location ($XDG_CONFIG_HOME)".into(),
                );
            }
        }
    }
    for name in CREDENTIAL_FILE_VARS {
        if let Some(list) = var(name) {
            for file in std::env::split_paths(&list) {
                push(file, format!("credential location (${name})"));
            }
        }
    }
    let key_dir = "agentdiff key directory (default location)".to_string();
    for home in homes {
        push(home.join(".local/state/agentdiff"), key_dir.clone());
    }
    if let Some(state) = var("XDG_STATE_HOME") {
        push(PathBuf::from(state).join("agentdiff"), key_dir);
    }
    out
}

/// Why a mount covers a container engine socket.
pub const ENGINE_SOCKET_REASON: &str = "container engine socket";

/// Container runtime sockets beyond the engine's API candidates that start containers as root.
pub const RUNTIME_SOCKETS: &[&str] = &[
    "/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/run/buildkit/buildkitd.sock",
];

impl HostFacts {
    /// From agentdiff's own environment and the command's.
    pub fn current(command_env: &[(OsString, OsString)]) -> HostFacts {
        let own: Vec<(OsString, OsString)> = std::env::vars_os().collect();
        let mut facts = HostFacts {
            state_dir: agentdiff_host::state_dir::locate().ok(),
            interactive: std::io::IsTerminal::is_terminal(&std::io::stdin()),
            engine_sockets: agentdiff_process::containers::candidate_sockets(command_env)
                .into_iter()
                .chain(RUNTIME_SOCKETS.iter().map(PathBuf::from))
                .collect(),
            daemon_sockets: daemon_sockets::find(
                Path::new(daemon_sockets::DAEMON_SOCKET_DIR),
                &daemon_sockets::SKIPPED,
            ),
            ..HostFacts::default()
        };
        let env_homes = [own.as_slice(), command_env].map(|env| {
            env.iter()
                .rev()
                .find(|(k, _)| k.as_os_str() == OsStr::new("HOME"))
                .map(|(_, v)| PathBuf::from(v))
                .filter(|p| p.is_absolute())
        });
        // The user database's home of the user the command runs as, too: under sudo or su
        // `$HOME` can name another user's home while the command reads this one's (root's).
        let own_user = agentdiff_host::system::effective_user_home();
        for h in env_homes.into_iter().chain([own_user]).flatten() {
            if !facts.homes.contains(&h) {
                facts.homes.push(h);
            }
        }
        // The command's variables say where its tools look; agentdiff's own XDG_STATE_HOME says
        // where its default key directory is.
        let mut creds = env_credential_locations(command_env, &facts.homes);
        for (p, why) in env_credential_locations(&own, &facts.homes) {
            if why.starts_with("agentdiff") && !creds.iter().any(|(q, _)| *q == p) {
                creds.push((p, why));
            }
        }
        facts.env_credentials = creds;
        for env in [own.as_slice(), command_env] {
            for (p, why) in home::agent_locations(env) {
                if !facts.agent_sockets.iter().any(|(q, _)| *q == p) {
                    facts.agent_sockets.push((p, why));
                }
            }
        }
        // Under su, runuser, sudo, cron and many CI runners no variable names the runtime
        // directory, yet gpg-agent, the session bus and keyrings keep their sockets there.
        let runtime_dirs = PathBuf::from(home::RUNTIME_DIRS);
        if !facts.agent_sockets.iter().any(|(q, _)| *q == runtime_dirs) {
            let why = "per-user runtime directories (agent, keyring and session-bus sockets, \
                       named by a variable or not)";
            facts.agent_sockets.push((runtime_dirs, why.into()));
        }
        facts
    }
}

/// Everything `prepare` decides; `launch` runs exactly this.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub bwrap: PathBuf,
    pub shim: PathBuf,
    pub marker: PathBuf,
    /// The start gate, next to the marker.
    pub gate: PathBuf,
    pub root: PathBuf,
    pub workdir: PathBuf,
    pub network: Network,
    /// The egress proxy's socket, bound into the sandbox (`Network::Filtered` only).
    pub egress: Option<PathBuf>,
    /// How the homes are shown (`home` option).
    pub home: HomeMode,
    /// `home-sockets: allow`: the runtime directory and agent sockets were left reachable.
    pub agent_sockets_allowed: bool,
    /// `host-sockets: allow`: the host daemons' sockets below `/run` were left reachable.
    pub daemon_sockets_allowed: bool,
    /// `--new-session` (non-interactive runs).
    pub new_session: bool,
    /// Mounts after the fixed base (`/`, `/dev`, `/proc`, `/tmp`), in order.
    pub mounts: Vec<Mount>,
    /// Hide requests and deny patterns that name nothing on this host, or that a mount cannot
    /// express (wildcards): they stay decided by the policy after the run.
    pub not_applied: Vec<String>,
    /// Environment variable names dropped here (runtime-injection variables).
    pub env_dropped: Vec<String>,
    /// The environment bwrap (and through it the command) gets.
    pub env: Vec<(OsString, OsString)>,
    /// bwrap's arguments (after the program).
    pub args: Vec<OsString>,
}

impl Plan {
    /// The first planned mount point that no longer exists on the host: removed after the plan
    /// (a daemon's socket that came and went), so bwrap could not make the mount over it on the
    /// read-only host tree. Asked only after a sandbox failed to start, to name the cause.
    pub fn vanished_mount_point(&self) -> Option<&Path> {
        let rebuilt: Vec<&Path> = self
            .mounts
            .iter()
            .filter(|m| m.kind == MountKind::RunTmpfs)
            .map(|m| m.path.as_path())
            .collect();
        // A cover below the rebuilt `/run` has its mount point made in the tmpfs.
        let in_tmpfs = |m: &Mount| {
            matches!(m.kind, MountKind::HiddenDir | MountKind::HiddenFile)
                && rebuilt
                    .iter()
                    .any(|r| m.path != *r && is_within(&m.path, r))
        };
        self.mounts
            .iter()
            .filter(|m| m.kind.needs_host_path() && !in_tmpfs(m))
            .map(|m| m.path.as_path())
            .find(|p| {
                std::fs::symlink_metadata(p)
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            })
    }

    /// What the command can reach of the container engine APIs agentdiff would query: nothing,
    /// when its network is unshared (no TCP engine, and abstract Unix sockets belong to the
    /// network namespace) and the engine sockets that exist are covered; the covered sockets are
    /// recorded as they are now, so a socket replaced later is noticed. With the host network the
    /// engines are queried as for any backend.
    pub fn engine_reach(&self) -> EngineReach {
        if !self.network.unshared() {
            return EngineReach::Unrestricted;
        }
        let sockets = self
            .mounts
            .iter()
            .filter(|m| m.kind == MountKind::HiddenFile && m.reason == ENGINE_SOCKET_REASON)
            .filter_map(|m| HiddenSocket::of(&m.path))
            .collect();
        EngineReach::Hidden {
            sockets,
            how: "the command has a network namespace of its own (no TCP engine, no abstract \
                  Unix socket of the host)"
                .into(),
        }
    }
}

/// The executables the plan names, resolved by the caller (the only host lookups besides
/// existence checks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Programs {
    pub bwrap: PathBuf,
    pub shim: PathBuf,
}

/// `~/x` against `home`, an absolute path as is; anything else is refused by the caller.
fn expand(p: &str, home: Option<&Path>) -> Option<PathBuf> {
    if let Some(rest) = p.strip_prefix("~/") {
        home.map(|h| h.join(rest))
    } else if p.starts_with('/') {
        Some(PathBuf::from(p))
    } else {
        None
    }
}

fn is_within(path: &Path, dir: &Path) -> bool {
    path.starts_with(dir)
}

fn has_parent_refs(p: &Path) -> bool {
    p.components().any(|c| matches!(c, Component::ParentDir))
}

/// Kernel filesystems the sandbox provides itself (`/sys` stays the host's, read-only): never
/// writable by option.
const KERNEL_FILESYSTEMS: [&str; 3] = ["/proc", "/sys", "/dev"];

/// Read the options into (network, writable, hide) after refusing unknown keys.
fn read_options(
    spec: &LaunchSpec,
    home: Option<&Path>,
) -> Result<(Network, Vec<PathBuf>, Vec<String>), PlanError> {
    let o = &spec.options;
    if let Some(k) = o.keys().find(|k| !OPTION_KEYS.contains(k)) {
        return Err(PlanError::UnknownOption(k.to_string()));
    }
    let network = match (o.get(OPT_NETWORK), &spec.egress_proxy) {
        (None, None) | (Some("none"), _) => Network::None,
        (None, Some(_)) | (Some("filtered"), Some(_)) => Network::Filtered,
        (Some("host"), _) => Network::Host,
        (Some("filtered"), None) => {
            return Err(PlanError::BadOption {
                key: OPT_NETWORK,
                message: "`filtered` needs agentdiff's egress proxy, which a run has only when \
                          the policy's network.egress allows a host: add `network.egress.allow` \
                          (or `--allow-host`), or use `none`"
                    .into(),
            })
        }
        (Some(v), _) => {
            return Err(PlanError::BadOption {
                key: OPT_NETWORK,
                message: format!("`{v}` is not `none`, `filtered` or `host`"),
            })
        }
    };
    let mut writable = Vec::new();
    for w in o.get_all(OPT_WRITABLE) {
        let path = expand(w, home)
            .filter(|p| !has_parent_refs(p))
            .ok_or_else(|| PlanError::BadOption {
                key: OPT_WRITABLE,
                message: format!("{w:?} must be an absolute path or start with `~/`, without `..`"),
            })?;
        let canonical = path.canonicalize().map_err(|e| PlanError::BadOption {
            key: OPT_WRITABLE,
            message: format!("{}: {e}; create it before the run", path.display()),
        })?;
        if canonical == Path::new("/") {
            return Err(PlanError::BadOption {
                key: OPT_WRITABLE,
                message: "`/` would make the whole host writable; name the directories the \
                          command needs"
                    .into(),
            });
        }
        if let Some(base) = KERNEL_FILESYSTEMS
            .iter()
            .find(|b| is_within(&canonical, Path::new(b)))
        {
            return Err(PlanError::BadOption {
                key: OPT_WRITABLE,
                message: format!(
                    "{} is {base} or below it: kernel filesystems are never bound writable (the \
                     sandbox has its own /proc and /dev, the host's /sys stays read-only; a host \
                     /proc would show the host's processes); name a directory of files",
                    canonical.display()
                ),
            });
        }
        writable.push(canonical);
    }
    let mut hide = Vec::new();
    for h in o.get_all(OPT_HIDE) {
        if expand(h, home).is_none() {
            return Err(PlanError::BadOption {
                key: OPT_HIDE,
                message: format!("{h:?} must be an absolute path or start with `~/`"),
            });
        }
        hide.push(h.clone());
    }
    for key in [OPT_EXECUTABLE, OPT_EXEC_SHIM] {
        if o.get(key) == Some("") {
            return Err(PlanError::BadOption {
                key,
                message: "is empty".into(),
            });
        }
    }
    Ok((network, writable, hide))
}

/// `host-sockets`: whether the daemon sockets below `/run` are covered (`hide`, the default).
fn hide_daemon_sockets(spec: &LaunchSpec) -> Result<bool, PlanError> {
    match spec.options.get(OPT_HOST_SOCKETS) {
        None | Some("hide") => Ok(true),
        Some("allow") => Ok(false),
        Some(v) => Err(PlanError::BadOption {
            key: OPT_HOST_SOCKETS,
            message: format!("`{v}` is not `hide` or `allow`"),
        }),
    }
}

/// The hidden locations: credential locations under every home, agentdiff's key directory,
/// and the `hide` option. Absent ones are listed in `not_applied`.
fn hidden(
    facts: &HostFacts,
    extra: &[String],
    (hide_agents, hide_daemons): (bool, bool),
    not_applied: &mut Vec<String>,
) -> Vec<(PathBuf, String)> {
    let mut wanted: Vec<(PathBuf, String)> = Vec::new();
    if hide_agents {
        wanted.extend(facts.agent_sockets.iter().cloned());
    }
    for home in &facts.homes {
        for rel in CREDENTIAL_LOCATIONS.iter() {
            wanted.push((home.join(rel), "credential location".into()));
        }
    }
    for l in SYSTEM_CREDENTIAL_LOCATIONS {
        wanted.push((PathBuf::from(l), "system credential location".into()));
    }
    if let Some(k) = &facts.state_dir {
        wanted.push((k.clone(), "agentdiff key directory".into()));
    }
    wanted.extend(facts.env_credentials.iter().cloned());
    for sock in &facts.engine_sockets {
        wanted.push((sock.clone(), ENGINE_SOCKET_REASON.into()));
    }
    for h in extra {
        let reason = format!("hide option {h:?}");
        if h.starts_with("~/") {
            for home in &facts.homes {
                wanted.extend(expand(h, Some(home)).map(|p| (p, reason.clone())));
            }
        } else {
            wanted.push((PathBuf::from(h), reason));
        }
    }
    // Last: a socket listed above keeps its own reason (the engine sockets' is read back). A
    // rebuilt `/run` leaves its sockets out ([`run_rebuild`]) instead.
    if hide_daemons {
        let daemons = &facts.daemon_sockets;
        if daemons.rebuild.is_none() {
            let reason = daemon_sockets::DAEMON_SOCKET_REASON;
            wanted.extend(daemons.sockets.iter().map(|p| (p.clone(), reason.into())));
        }
        not_applied.extend(daemons.incomplete.iter().cloned());
    }
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for (p, reason) in wanted {
        match canonical_if_present(&p) {
            Ok(c) => {
                if !out.iter().any(|(q, _)| *q == c) {
                    out.push((c, reason));
                }
            }
            Err(_) if reason.starts_with("hide option") => {
                not_applied.push(format!("{}: does not exist, nothing to hide", p.display()));
            }
            Err(_) => {}
        }
    }
    // Inside a hidden directory a path is hidden already, and its mount point could not be
    // created in that directory's read-only tmpfs (a socket under `$XDG_RUNTIME_DIR`).
    let dirs: Vec<PathBuf> = out
        .iter()
        .filter(|(p, _)| p.is_dir())
        .map(|(p, _)| p.clone())
        .collect();
    out.retain(|(p, _)| !dirs.iter().any(|d| p != d && is_within(p, d)));
    out
}

/// The mounts that rebuild `/run` without its daemon sockets ([`daemon_sockets::Rebuild`]);
/// none when the sockets are allowed or covered one by one.
fn run_rebuild(rebuild: Option<&daemon_sockets::Rebuild>) -> Vec<Mount> {
    use daemon_sockets::Entry;
    let Some(rebuild) = rebuild else {
        return Vec::new();
    };
    let mount = |kind, path: &Path, target: Option<&Path>, reason: &str| Mount {
        kind,
        path: path.to_path_buf(),
        target: target.map(Path::to_path_buf),
        reason: reason.to_string(),
    };
    let shown = "rebuilt without the host daemon sockets";
    let mut out = vec![mount(MountKind::RunTmpfs, &rebuild.dir, None, shown)];
    out.extend(rebuild.entries.iter().map(|e| match e {
        Entry::Dir(p) => mount(MountKind::RunDir, p, None, shown),
        Entry::Shown(p) => mount(MountKind::RunEntry, p, None, shown),
        Entry::Symlink { path, target } => mount(MountKind::Symlink, path, Some(target), shown),
        Entry::Socket(p) => mount(
            MountKind::LeftOut,
            p,
            None,
            daemon_sockets::DAEMON_SOCKET_REASON,
        ),
    }));
    out
}

/// The read-only re-binds inside writable paths: `.git`, every git directory and `.git` file the
/// engine found in the tree (`LaunchSpec::git_dirs`), `.agentdiff`, the capsule and every literal
/// deny path that exists.
fn protected(
    spec: &LaunchSpec,
    root: &Path,
    writable: &[PathBuf],
    denies: &[String],
    not_applied: &mut Vec<String>,
) -> Vec<(PathBuf, String)> {
    let mut wanted: Vec<(PathBuf, String)> =
        agentdiff_backend_api::protected::read_only_paths(spec)
            .into_iter()
            .map(|(p, why)| (p, why.to_string()))
            .collect();
    for d in denies {
        match literal_path(d) {
            Some(rel) => wanted.push((root.join(rel), format!("deny pattern {d:?}"))),
            None => not_applied.push(format!(
                "deny pattern {d:?}: a wildcard pattern cannot be a mount; decided after the run"
            )),
        }
    }
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for (p, reason) in wanted {
        let Ok(c) = canonical_if_present(&p) else {
            if reason.starts_with("deny pattern") {
                not_applied.push(format!(
                    "{reason}: {} does not exist at the start; what the command creates there is \
                     decided after the run",
                    p.display()
                ));
            }
            continue;
        };
        // Outside every writable path, or inside one already re-bound, it is read-only already.
        if !writable.iter().any(|w| is_within(&c, w)) || out.iter().any(|(q, _)| is_within(&c, q)) {
            continue;
        }
        out.push((c, reason));
    }
    out
}

/// The home mounts, the mode the run is labelled with and the mode asked for. A home a writable
/// path shows whole is not hidden: such a run is labelled as the denylist.
fn home_plan(
    spec: &LaunchSpec,
    facts: &HostFacts,
    writable: &[PathBuf],
    not_applied: &mut Vec<String>,
) -> Result<(Vec<Mount>, HomeMode, home::HomeOptions), PlanError> {
    let opts = home::read_options(&spec.options)?;
    let mounts = match opts.mode {
        HomeMode::Allowlist => home::mounts(
            &facts.homes,
            &opts,
            facts.state_dir.as_deref(),
            writable,
            not_applied,
        )?,
        HomeMode::Denylist => Vec::new(),
    };
    let whole = |h: &PathBuf| {
        let h = h.canonicalize().unwrap_or_else(|_| h.clone());
        writable.iter().any(|w| h.starts_with(w))
    };
    let mode = match opts.mode {
        HomeMode::Allowlist if facts.homes.iter().any(whole) => HomeMode::Denylist,
        mode => mode,
    };
    Ok((mounts, mode, opts))
}

/// Plan the sandbox for `spec`. `denies` are the policy's filesystem deny patterns.
pub fn plan(
    spec: &LaunchSpec,
    facts: &HostFacts,
    programs: Programs,
    denies: &[String],
) -> Result<Plan, PlanError> {
    if spec.argv.is_empty() {
        return Err(PlanError::NoCommand);
    }
    let (network, extra_writable, extra_hide) =
        read_options(spec, facts.homes.first().map(PathBuf::as_path))?;
    let layout = |m: String| PlanError::Layout(m);
    let root = spec
        .root
        .canonicalize()
        .map_err(|e| layout(format!("project root {}: {e}", spec.root.display())))?;
    let workdir = spec
        .workdir
        .canonicalize()
        .map_err(|e| layout(format!("working directory {}: {e}", spec.workdir.display())))?;
    if root == Path::new("/") {
        return Err(layout(
            "the project root is `/`: the sandbox would make the whole host writable; run in a \
             project directory"
                .into(),
        ));
    }
    let mut writable = vec![root.clone()];
    writable.extend(extra_writable);
    let mut not_applied = Vec::new();
    let (home_mounts, home_mode, home_opts) = home_plan(spec, facts, &writable, &mut not_applied)?;
    let mut checked = writable.clone();
    checked.extend(
        home_mounts
            .iter()
            .filter(|m| m.kind == MountKind::Writable)
            .map(|m| m.path.clone()),
    );
    check_bwrap_location(&programs.bwrap, &checked)?;
    let hide_daemons = hide_daemon_sockets(spec)?;
    let hide = hidden(
        facts,
        &extra_hide,
        (home_opts.hide_agents(), hide_daemons),
        &mut not_applied,
    );
    let protect = protected(spec, &root, &checked, denies, &mut not_applied);
    for (h, reason) in &hide {
        if is_within(&root, h) || is_within(&workdir, h) {
            return Err(layout(format!(
                "the project root {} is inside a hidden location {} ({reason}); run from \
                 another directory",
                root.display(),
                h.display()
            )));
        }
    }
    // The rebuilt `/run` first (every other mount below it goes on top), then the homes: the
    // root and the writable paths are bound over them.
    let rebuild = facts.daemon_sockets.rebuild.as_ref();
    let mut mounts: Vec<Mount> = run_rebuild(rebuild.filter(|_| hide_daemons));
    mounts.extend(home_mounts);
    mounts.extend(writable.iter().enumerate().map(|(i, p)| Mount {
        kind: MountKind::Writable,
        path: p.clone(),
        target: None,
        reason: if i == 0 {
            "project root".into()
        } else {
            "writable option".into()
        },
    }));
    mounts.extend(protect.into_iter().map(|(path, reason)| Mount {
        kind: MountKind::ReadOnly,
        path,
        target: None,
        reason,
    }));
    mounts.extend(hide.into_iter().map(|(path, reason)| Mount {
        kind: if path.is_dir() {
            MountKind::HiddenDir
        } else {
            MountKind::HiddenFile
        },
        path,
        target: None,
        reason,
    }));

    let marker = spec.capsule_dir.join(START_MARKER_FILE);
    let gate = spec.capsule_dir.join(START_GATE_FILE);
    let (mut env, mut env_dropped) = sandbox_env(&spec.env);
    if home_opts.hide_agents() {
        // The sockets are hidden; their variables would only point at nothing.
        env.retain(|(k, _)| {
            let agent = AGENT_VARS.iter().any(|v| k.as_os_str() == OsStr::new(v));
            if agent {
                env_dropped.push(k.to_string_lossy().into_owned());
            }
            !agent
        });
    }
    let egress = with_egress(network, spec, &mut env);
    let new_session = !facts.interactive;
    let shim = ShimMount {
        path: &programs.shim,
        bind: !shown_read_only(&programs.shim, &mounts),
    };
    // The marker and the gate do not exist yet (the launch creates them in the capsule
    // directory): their directory decides whether they are shown.
    let marker_mount = MarkerMount {
        path: &marker,
        gate: &gate,
        bind: !marker
            .parent()
            .is_some_and(|dir| shown_read_only(dir, &mounts)),
    };
    let args = build_args(
        &mounts,
        Sandboxing {
            network,
            egress: egress.as_deref(),
        },
        new_session,
        shim,
        marker_mount,
        &workdir,
        &spec.argv,
    );
    Ok(Plan {
        bwrap: programs.bwrap,
        shim: programs.shim,
        marker,
        gate,
        root,
        workdir,
        network,
        egress,
        home: home_mode,
        agent_sockets_allowed: home_opts.sockets_allowed,
        daemon_sockets_allowed: !hide_daemons,
        new_session,
        mounts,
        not_applied,
        env_dropped,
        env,
        args,
    })
}

/// The proxy's socket for a filtered sandbox, whose environment then gets the proxy variables
/// (after the scrub: the caller's own proxy settings never reach a filtered sandbox).
fn with_egress(
    network: Network,
    spec: &LaunchSpec,
    env: &mut Vec<(OsString, OsString)>,
) -> Option<PathBuf> {
    let socket = spec
        .egress_proxy
        .clone()
        .filter(|_| network == Network::Filtered)?;
    agentdiff_backend_api::egress::with_proxy_env(env);
    Some(socket)
}

/// Refuse a bwrap the command could replace: one inside the project root or a writable path
/// (after resolving symlinks), where a command run in this sandbox could plant its own.
fn check_bwrap_location(bwrap: &Path, writable: &[PathBuf]) -> Result<(), PlanError> {
    let canonical = bwrap.canonicalize().unwrap_or_else(|_| bwrap.to_path_buf());
    match writable.iter().find(|w| is_within(&canonical, w)) {
        Some(w) => Err(PlanError::UntrustedBwrap(format!(
            "refusing the bwrap executable {}: it is inside {}, which the sandbox makes \
             writable, so a command could replace it with one that builds no sandbox",
            canonical.display(),
            w.display(),
        ))),
        None => Ok(()),
    }
}

/// The `/proc/self/ns` names of the namespaces the sandbox unshares, which the exec shim must
/// find different from agentdiff's own.
pub fn unshared_namespaces(network: Network) -> Vec<&'static str> {
    let mut n = vec!["mnt", "pid", "ipc", "uts"];
    if network.unshared() {
        n.push("net");
    }
    n
}

/// The command's environment minus runtime-injection variables (always dropped, even when the
/// transaction was told to pass them) and minus the shim's own variables.
fn sandbox_env(env: &[(OsString, OsString)]) -> (Vec<(OsString, OsString)>, Vec<String>) {
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for (k, v) in env {
        let name = k.to_string_lossy();
        if exec_shim::SHIM_ENV_VARS
            .iter()
            .any(|v| k.as_os_str() == OsStr::new(v))
        {
            continue;
        }
        if is_runtime_injection(&name) {
            dropped.push(name.into_owned());
        } else {
            kept.push((k.clone(), v.clone()));
        }
    }
    (kept, dropped)
}

/// Whether the sandbox already shows the host's `path`, read-only, at its own path: `path` has
/// no symlink in it, and the last planned mount covering it (mounts cover the base and the
/// mounts before them) is a read-only re-bind of the host path at itself; with no planned mount
/// covering it, the base `--ro-bind / /` shows it unless it lies in what the base replaces
/// (`/dev`, `/proc`, `/tmp`). Anything else is not assumed.
fn shown_read_only(path: &Path, mounts: &[Mount]) -> bool {
    if path.canonicalize().ok().as_deref() != Some(path) {
        return false;
    }
    match mounts.iter().rev().find(|m| is_within(path, &m.path)) {
        // Not a re-shown entry of the rebuilt `/run`: it is skipped when gone by the launch.
        Some(last) => last.kind == MountKind::ReadOnly,
        None => !["/dev", "/proc", "/tmp"]
            .iter()
            .any(|base| is_within(path, Path::new(base))),
    }
}

/// The exec shim, and whether it needs a read-only bind of its own to be reachable.
#[derive(Debug, Clone, Copy)]
pub struct ShimMount<'a> {
    pub path: &'a Path,
    pub bind: bool,
}

/// The start marker and the start gate (in the same directory, with the secret FIFO beside the
/// marker), and whether they need read-only binds of their own to be reachable.
#[derive(Debug, Clone, Copy)]
pub struct MarkerMount<'a> {
    pub path: &'a Path,
    pub gate: &'a Path,
    pub bind: bool,
}

/// The network mode and, when filtered, the egress proxy's socket to bind into the sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Sandboxing<'a> {
    pub network: Network,
    pub egress: Option<&'a Path>,
}

/// The memory files of the sandbox's pid 1 (bwrap's init), covered by the null device.
pub const PID1_MEMORY: [&str; 2] = ["/proc/1/mem", "/proc/1/task/1/mem"];

/// bwrap's arguments for these mounts and this command.
pub fn build_args(
    mounts: &[Mount],
    sandboxing: Sandboxing<'_>,
    new_session: bool,
    shim: ShimMount<'_>,
    marker: MarkerMount<'_>,
    workdir: &Path,
    argv: &[OsString],
) -> Vec<OsString> {
    let mut a: Vec<OsString> = Vec::new();
    let mut push = |items: &[&OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
    let s = |t: &'static str| OsStr::new(t);
    push(&[s("--ro-bind"), s("/"), s("/")]);
    push(&[s("--dev"), s("/dev")]);
    push(&[s("--proc"), s("/proc")]);
    // Pid 1 is bwrap's init, outside the exec shim's seccomp filter: its memory files would let
    // the command drive it past the filter (agentdiff_process::seccomp_guard).
    for mem in PID1_MEMORY {
        push(&[s("--ro-bind"), s("/dev/null"), s(mem)]);
    }
    push(&[s("--tmpfs"), s("/tmp")]);
    for m in mounts {
        let p = m.path.as_os_str();
        match m.kind {
            MountKind::Writable => push(&[s("--bind"), p, p]),
            MountKind::ReadOnly => push(&[s("--ro-bind"), p, p]),
            MountKind::HiddenDir => push(&[s("--tmpfs"), p, s("--remount-ro"), p]),
            MountKind::HiddenFile => push(&[s("--ro-bind"), s("/dev/null"), p]),
            MountKind::HomeTmpfs | MountKind::RunTmpfs => push(&[s("--tmpfs"), p]),
            MountKind::RunDir => push(&[s("--dir"), p]),
            MountKind::RunEntry => push(&[s("--ro-bind-try"), p, p]),
            MountKind::LeftOut => {}
            MountKind::Symlink => {
                let t = m.target.as_deref().unwrap_or(Path::new("/nonexistent"));
                push(&[s("--symlink"), t.as_os_str(), p]);
            }
        }
    }
    if shim.bind {
        push(&[s("--ro-bind"), shim.path.as_os_str(), shim.path.as_os_str()]);
    }
    if marker.bind {
        let secret = exec_shim::secret_path(marker.path);
        let (m, g, k) = (
            marker.path.as_os_str(),
            marker.gate.as_os_str(),
            secret.as_os_str(),
        );
        push(&[s("--ro-bind"), m, m, s("--ro-bind"), g, g]);
        push(&[s("--ro-bind"), k, k]);
    }
    if let Some(sock) = sandboxing.egress {
        // Read-only: the command can connect to the socket but not replace it.
        push(&[s("--ro-bind"), sock.as_os_str(), sock.as_os_str()]);
    }
    // A home's tmpfs and the rebuilt `/run` turn read-only only now: every mount point below
    // them had to be created.
    for m in mounts
        .iter()
        .filter(|m| matches!(m.kind, MountKind::HomeTmpfs | MountKind::RunTmpfs))
    {
        push(&[s("--remount-ro"), m.path.as_os_str()]);
    }
    push(&[s("--unshare-pid"), s("--unshare-ipc"), s("--unshare-uts")]);
    if sandboxing.network.unshared() {
        push(&[s("--unshare-net")]);
    }
    push(&[s("--die-with-parent")]);
    if new_session {
        push(&[s("--new-session")]);
    }
    push(&[
        s("--cap-drop"),
        s("ALL"),
        s("--chdir"),
        workdir.as_os_str(),
        // `--` ends bwrap's options: nothing of the command is read as one.
        s("--"),
        shim.path.as_os_str(),
        s(exec_shim::SHIM_SUBCOMMAND),
    ]);
    a.extend(exec_shim::shim_args(marker.path, argv));
    a
}

#[cfg(test)]
mod tests {
    use agentdiff_backend_api::BackendOptions;

    use super::*;

    struct Fixture {
        _dir: tempfile::TempDir,
        root: PathBuf,
        home: PathBuf,
        capsule: PathBuf,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        let root = base.join("proj");
        let home = base.join("home");
        let capsule = root.join(".agentdiff/runs/r1");
        for d in [
            root.join(".git"),
            capsule.clone(),
            root.join("secrets"),
            home.join(".ssh"),
            home.join(".local/state/agentdiff"),
        ] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(home.join(".npmrc"), "//registry/:_authToken=x\n").unwrap();
        std::fs::write(root.join(".env"), "A=1\n").unwrap();
        Fixture {
            _dir: dir,
            root,
            home,
            capsule,
        }
    }

    fn spec(f: &Fixture, options: BackendOptions) -> LaunchSpec {
        agentdiff_conformance::testing::launch_spec(&f.root, ["tool", "--", "a b", "", "-c"])
            .run_id("r1")
            .capsule_dir(&f.capsule)
            .env([
                ("PATH", "/usr/bin:/bin"),
                ("LD_PRELOAD", "/tmp/evil.so"),
                ("NODE_OPTIONS", "--require x"),
                (exec_shim::ENV_ARGV_DIGEST, "forged"),
            ])
            .options(options)
            .build()
    }

    fn facts(f: &Fixture) -> HostFacts {
        HostFacts {
            homes: vec![f.home.clone()],
            state_dir: Some(f.home.join(".local/state/agentdiff")),
            interactive: false,
            engine_sockets: vec![f.home.join("engine.sock"), f.home.join("absent.sock")],
            env_credentials: Vec::new(),
            agent_sockets: Vec::new(),
            daemon_sockets: daemon_sockets::Found {
                sockets: vec![f.home.join("daemon.sock")],
                incomplete: vec!["/run/huge: more than 20000 entries".into()],
                rebuild: None,
            },
        }
    }

    fn programs() -> Programs {
        Programs {
            bwrap: "/usr/bin/bwrap".into(),
            shim: "/opt/agentdiff".into(),
        }
    }

    fn plan_with(f: &Fixture, options: BackendOptions, denies: &[&str]) -> Result<Plan, PlanError> {
        let denies: Vec<String> = denies.iter().map(|s| s.to_string()).collect();
        plan(&spec(f, options), &facts(f), programs(), &denies)
    }

    fn strs(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    /// Index of the window `seq` in `args`.
    fn find(args: &[String], seq: &[&str]) -> Option<usize> {
        args.windows(seq.len())
            .position(|w| w.iter().zip(seq).all(|(a, b)| a == b))
    }

    /// The paths the plan re-binds read-only.
    fn read_only(p: &Plan) -> Vec<&PathBuf> {
        p.mounts
            .iter()
            .filter(|m| m.kind == MountKind::ReadOnly)
            .map(|m| &m.path)
            .collect()
    }

    /// Git directories the engine found (a separate git dir, a `.git` file) are re-bound
    /// read-only inside the root; one outside every writable path is read-only already.
    #[test]
    fn git_directories_from_the_spec_are_read_only() {
        let f = fixture();
        let repo = f.root.join(".repo");
        std::fs::create_dir_all(&repo).unwrap();
        let pointer = f.root.join("sub/.git");
        std::fs::create_dir_all(f.root.join("sub")).unwrap();
        std::fs::write(&pointer, "gitdir: ../.repo\n").unwrap();
        let outside = f.home.join("elsewhere.git");
        std::fs::create_dir_all(&outside).unwrap();
        let mut s = spec(&f, BackendOptions::new());
        s.git_dirs = vec![repo.clone(), pointer.clone(), outside.clone()];
        let p = plan(&s, &facts(&f), programs(), &[]).unwrap();
        let ro = read_only(&p);
        assert!(ro.contains(&&repo) && ro.contains(&&pointer), "{ro:?}");
        assert!(!ro.contains(&&outside), "{ro:?}");
    }

    /// The configuration later runs and sessions read is read-only when it exists; what does
    /// not exist gets no mount (a placeholder would be left in the user's tree).
    #[test]
    fn the_projects_configuration_is_read_only() {
        let f = fixture();
        std::fs::create_dir_all(f.root.join(".claude")).unwrap();
        std::fs::write(f.root.join(".claude/settings.json"), "{}").unwrap();
        std::fs::write(f.root.join("agentdiff.yaml"), "version: 2\n").unwrap();
        let p = plan(
            &spec(&f, BackendOptions::new()),
            &facts(&f),
            programs(),
            &[],
        )
        .unwrap();
        let ro = read_only(&p);
        for name in [".claude", "agentdiff.yaml"] {
            assert!(ro.contains(&&f.root.join(name)), "{name}: {ro:?}");
        }
        for name in [".agentdiffignore", "agentdiff.yml", "agentdiff.json"] {
            assert!(!ro.contains(&&f.root.join(name)), "{name}: {ro:?}");
        }
    }

    /// Under the default allowlist the home is a tmpfs made before the root's bind and
    /// remounted read-only after every mount below it; allowlisted entries are shown read-only;
    /// agent variables are dropped. The state directory is never allowed; `denylist` makes no
    /// home mount.
    #[test]
    fn the_home_allowlist_is_mounted_in_order_and_refuses_the_state_dir() {
        let f = fixture();
        std::fs::create_dir_all(f.home.join(".cargo/bin")).unwrap();
        let mut s = spec(&f, BackendOptions::new());
        s.env
            .push(("SSH_AUTH_SOCK".into(), "/run/user/1/agent.sock".into()));
        let p = plan(&s, &facts(&f), programs(), &[]).unwrap();
        let a = strs(&p.args);
        let home = f.home.display().to_string();
        let cargo = f.home.join(".cargo").display().to_string();
        let root = f.root.display().to_string();
        let at = |seq: &[&str]| find(&a, seq).unwrap_or_else(|| panic!("{seq:?} not in {a:?}"));
        let tmpfs = at(&["--tmpfs", &home]);
        let ro_cargo = at(&["--ro-bind", &cargo, &cargo]);
        let bind_root = at(&["--bind", &root, &root]);
        let remount = at(&["--remount-ro", &home]);
        let shim = at(&["--ro-bind", "/opt/agentdiff", "/opt/agentdiff"]);
        assert!(
            tmpfs < ro_cargo && ro_cargo < bind_root && shim < remount,
            "{a:?}"
        );
        assert_eq!(p.home, HomeMode::Allowlist);
        assert!(p.env.iter().all(|(k, _)| k != "SSH_AUTH_SOCK"));
        assert!(p.env_dropped.contains(&"SSH_AUTH_SOCK".to_string()));

        let mut o = BackendOptions::new();
        o.push(crate::OPT_HOME_READ, "~/.local/state");
        let err = plan(&spec(&f, o), &facts(&f), programs(), &[]).unwrap_err();
        assert!(err.to_string().contains("state directory"), "{err}");
        let mut o = BackendOptions::new();
        o.push(crate::OPT_HOME_WRITE, "~/../etc");
        assert!(plan(&spec(&f, o), &facts(&f), programs(), &[]).is_err());

        let mut o = BackendOptions::new();
        o.push(crate::OPT_HOME, "denylist");
        let p = plan(&spec(&f, o), &facts(&f), programs(), &[]).unwrap();
        assert_eq!(p.home, HomeMode::Denylist);
        assert!(find(&strs(&p.args), &["--tmpfs", &home]).is_none());
    }

    #[test]
    fn the_argv_holds_every_control_in_mount_order() {
        let f = fixture();
        let p = plan_with(
            &f,
            BackendOptions::new(),
            &[".env", "secrets/**", "**/*.pem", "certs/**"],
        )
        .unwrap();
        let a = strs(&p.args);
        let root = f.root.display().to_string();
        let git = f.root.join(".git").display().to_string();
        let store = f.root.join(".agentdiff").display().to_string();
        let ssh = f.home.join(".ssh").display().to_string();
        let npmrc = f.home.join(".npmrc").display().to_string();
        let keys = f.home.join(".local/state/agentdiff").display().to_string();
        let at = |seq: &[&str]| find(&a, seq).unwrap_or_else(|| panic!("{seq:?} not in {a:?}"));
        assert_eq!(at(&["--ro-bind", "/", "/"]), 0);
        let dev = at(&["--dev", "/dev"]);
        let proc_ = at(&["--proc", "/proc"]);
        let tmp = at(&["--tmpfs", "/tmp"]);
        for mem in PID1_MEMORY {
            assert!(
                at(&["--ro-bind", "/dev/null", mem]) > proc_,
                "{mem} after /proc"
            );
        }
        let bind_root = at(&["--bind", &root, &root]);
        let ro_git = at(&["--ro-bind", &git, &git]);
        let ro_store = at(&["--ro-bind", &store, &store]);
        let env_file = f.root.join(".env").display().to_string();
        let secrets = f.root.join("secrets").display().to_string();
        let ro_env = at(&["--ro-bind", &env_file, &env_file]);
        let ro_secrets = at(&["--ro-bind", &secrets, &secrets]);
        let hide_ssh = at(&["--tmpfs", &ssh, "--remount-ro", &ssh]);
        let hide_npmrc = at(&["--ro-bind", "/dev/null", &npmrc]);
        let hide_keys = at(&["--tmpfs", &keys, "--remount-ro", &keys]);
        assert!(dev < tmp && proc_ < tmp && tmp < bind_root, "{a:?}");
        for ro in [ro_git, ro_store, ro_env, ro_secrets] {
            assert!(bind_root < ro, "{a:?}");
        }
        for hide in [hide_ssh, hide_npmrc, hide_keys] {
            assert!(ro_secrets < hide, "{a:?}");
        }
        for flag in [
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-net",
            "--die-with-parent",
            "--new-session",
        ] {
            assert!(a.contains(&flag.to_string()), "{flag} missing: {a:?}");
        }
        at(&["--cap-drop", "ALL"]);
        at(&["--chdir", &root]);
        // The wildcard pattern is reported, not silently dropped.
        assert!(
            p.not_applied.iter().any(|n| n.contains("**/*.pem")),
            "{:?}",
            p.not_applied
        );
        // A literal deny path that does not exist yet cannot be a mount: reported as well.
        assert!(
            p.not_applied
                .iter()
                .any(|n| n.contains("certs/**") && n.contains("does not exist")),
            "{:?}",
            p.not_applied
        );
        // The capsule is inside the (read-only) store: no separate mount for it.
        assert!(!p.mounts.iter().any(|m| m.path == f.capsule));
    }

    #[test]
    fn the_command_follows_the_separator_verbatim_through_the_shim() {
        let f = fixture();
        let p = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        let a = strs(&p.args);
        let sep = find(&a, &["--", "/opt/agentdiff"]).unwrap();
        let marker = f.capsule.join(START_MARKER_FILE).display().to_string();
        assert_eq!(
            &a[sep + 1..],
            [
                "/opt/agentdiff",
                exec_shim::SHIM_SUBCOMMAND,
                exec_shim::SHIM_PROTOCOL,
                &marker,
                "5",
                "tool",
                "--",
                "a b",
                "",
                "-c"
            ]
        );
        // The shim is reachable inside the sandbox wherever it lives; the marker, in the capsule
        // below the read-only store, is shown by the store's re-bind.
        assert!(find(&a, &["--ro-bind", "/opt/agentdiff", "/opt/agentdiff"]).is_some());
        assert!(find(&a, &["--ro-bind", &marker, &marker]).is_none());
        let store = f.root.join(".agentdiff").display().to_string();
        assert!(find(&a, &["--ro-bind", &store, &store]).is_some());
    }

    #[test]
    fn a_marker_the_sandbox_does_not_show_read_only_gets_a_mount_of_its_own() {
        let f = fixture();
        let base = f.root.parent().unwrap().to_path_buf();
        let with_capsule = |capsule: PathBuf| {
            std::fs::create_dir_all(&capsule).unwrap();
            let s = agentdiff_conformance::testing::launch_spec(&f.root, ["tool"])
                .capsule_dir(&capsule)
                .build();
            let p = plan(&s, &facts(&f), programs(), &[]).unwrap();
            let marker = capsule.join(START_MARKER_FILE).display().to_string();
            let gate = capsule.join(START_GATE_FILE);
            assert_eq!(p.gate, gate);
            let gate = gate.display().to_string();
            let a = strs(&p.args);
            assert!(find(&a, &["--", "/opt/agentdiff"]).is_some_and(|i| a[i..].contains(&marker)));
            // The gate is reachable exactly where the marker is.
            let bound = find(&a, &["--ro-bind", &marker, &marker]).is_some();
            assert_eq!(find(&a, &["--ro-bind", &gate, &gate]).is_some(), bound);
            bound
        };
        // In a hidden directory, below /tmp, through a symlink: bound.
        assert!(with_capsule(f.home.join(".ssh/r1")));
        assert!(with_capsule(
            PathBuf::from("/tmp").join(format!("agentdiff-plan-test-{}", std::process::id()))
        ));
        std::os::unix::fs::symlink(f.root.join(".agentdiff"), base.join("link")).unwrap();
        assert!(with_capsule(base.join("link/runs/r2")));
        // Below the read-only store, in a capsule the plan re-binds read-only in the writable
        // root, or outside every mount and the base's replacements: shown.
        assert!(!with_capsule(f.root.join(".agentdiff/runs/r3")));
        assert!(!with_capsule(f.root.join("capsules/r1")));
        assert!(!with_capsule(PathBuf::from("/")));
        let _ = std::fs::remove_dir_all(format!("/tmp/agentdiff-plan-test-{}", std::process::id()));
    }

    #[test]
    fn a_shim_the_host_root_already_shows_read_only_gets_no_mount_of_its_own() {
        let f = fixture();
        let s = spec(&f, BackendOptions::new());
        let with_shim = |shim: PathBuf| {
            let programs = Programs {
                bwrap: "/usr/bin/bwrap".into(),
                shim: shim.clone(),
            };
            let p = plan(&s, &facts(&f), programs, &[]).unwrap();
            let a = strs(&p.args);
            let shim = shim.display().to_string();
            assert!(find(&a, &["--", &shim, exec_shim::SHIM_SUBCOMMAND]).is_some());
            find(&a, &["--ro-bind", &shim, &shim]).is_some()
        };
        // A system binary (no symlink in its path): shown read-only by `--ro-bind / /`.
        let system = PathBuf::from("/bin/sh").canonicalize().unwrap();
        assert!(!with_shim(system.clone()), "{system:?}");
        // Inside the writable root, named through a symlink, or below /tmp: bound read-only.
        let in_root = f.root.join("agentdiff");
        std::fs::write(&in_root, b"").unwrap();
        assert!(with_shim(in_root));
        if Path::new("/bin/sh") != system {
            assert!(with_shim("/bin/sh".into()));
        }
        assert!(with_shim("/tmp/agentdiff".into()));
    }

    #[test]
    fn an_interactive_run_keeps_the_session_and_only_then() {
        let f = fixture();
        let s = spec(&f, BackendOptions::new());
        let mut facts = facts(&f);
        let batch = plan(&s, &facts, programs(), &[]).unwrap();
        assert!(strs(&batch.args).contains(&"--new-session".to_string()));
        facts.interactive = true;
        let tty = plan(&s, &facts, programs(), &[]).unwrap();
        assert!(!strs(&tty.args).contains(&"--new-session".to_string()));
        assert!(!tty.new_session);
    }

    #[test]
    fn host_network_is_opt_in_and_drops_only_unshare_net() {
        let f = fixture();
        let mut o = BackendOptions::new();
        o.push(crate::OPT_NETWORK, "host");
        let p = plan_with(&f, o, &[]).unwrap();
        let a = strs(&p.args);
        assert_eq!(p.network, Network::Host);
        assert!(!a.contains(&"--unshare-net".to_string()));
        assert!(a.contains(&"--unshare-pid".to_string()));
        let mut o = BackendOptions::new();
        o.push(crate::OPT_NETWORK, "bridge");
        assert!(matches!(
            plan_with(&f, o, &[]),
            Err(PlanError::BadOption { key: "network", .. })
        ));
    }

    #[test]
    fn the_egress_proxy_makes_filtered_the_default_and_is_bound_with_its_variables() {
        let f = fixture();
        let sock = PathBuf::from("/tmp/agentdiff-egress-1-2/egress.sock");
        let with_proxy = |options: BackendOptions| {
            let mut s = spec(&f, options);
            s.egress_proxy = Some(sock.clone());
            s.env
                .push(("HTTPS_PROXY".into(), "http://caller.example:8080".into()));
            plan(&s, &facts(&f), programs(), &[])
        };
        let p = with_proxy(BackendOptions::new()).unwrap();
        let a = strs(&p.args);
        assert_eq!(
            (p.network, p.egress.as_ref()),
            (Network::Filtered, Some(&sock))
        );
        let sock_s = sock.display().to_string();
        assert!(find(&a, &["--ro-bind", &sock_s, &sock_s]).is_some());
        assert!(a.contains(&"--unshare-net".to_string()));
        let env = |k: &str| {
            p.env
                .iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(env("HTTPS_PROXY"), ["http://127.0.0.1:3128"]);
        assert_eq!(env("all_proxy"), ["socks5h://127.0.0.1:3128"]);
        assert_eq!(env("NO_PROXY"), ["localhost,127.0.0.1,::1"]);
        assert_eq!(env("CARGO_HTTP_PROXY"), ["http://127.0.0.1:3128"]);
        assert!(unshared_namespaces(Network::Filtered).contains(&"net"));
        // `none` stays none (no socket, no variables); `host` is the host's network.
        let mut o = BackendOptions::new();
        o.push(crate::OPT_NETWORK, "none");
        let none = with_proxy(o).unwrap();
        assert_eq!((none.network, none.egress), (Network::None, None));
        assert!(!strs(&none.args).contains(&sock_s));
        // `filtered` without a proxy is refused, never a sandbox without a route.
        let mut o = BackendOptions::new();
        o.push(crate::OPT_NETWORK, "filtered");
        assert!(matches!(
            plan_with(&f, o, &[]),
            Err(PlanError::BadOption { key: "network", .. })
        ));
        // Without a proxy the default stays `none`.
        assert_eq!(
            plan_with(&f, BackendOptions::new(), &[]).unwrap().network,
            Network::None
        );
    }

    #[test]
    fn injection_variables_and_a_forged_digest_never_reach_the_sandbox() {
        let f = fixture();
        let p = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        let names: Vec<String> = p
            .env
            .iter()
            .map(|(k, _)| k.to_string_lossy().into())
            .collect();
        assert_eq!(names, ["PATH"]);
        assert_eq!(p.env_dropped, ["LD_PRELOAD", "NODE_OPTIONS"]);
    }

    #[test]
    fn options_are_checked() {
        let f = fixture();
        let bad = |k: &str, v: &str| {
            let mut o = BackendOptions::new();
            o.push(k, v);
            plan_with(&f, o, &[]).unwrap_err()
        };
        assert!(matches!(bad("image", "x"), PlanError::UnknownOption(k) if k == "image"));
        assert!(bad("writable", "/")
            .to_string()
            .contains("whole host writable"));
        assert!(bad("writable", "/nonexistent-agentdiff-dir")
            .to_string()
            .contains("create it before the run"));
        assert!(bad("writable", "relative").to_string().contains("absolute"));
        assert!(bad("hide", "relative").to_string().contains("absolute"));
        let mut o = BackendOptions::new();
        o.push("writable", f.home.join(".ssh").display().to_string());
        o.push("hide", "~/.config/absent");
        o.push("hide", "~/.npmrc");
        let p = plan_with(&f, o, &[]).unwrap();
        // A writable path inside a hidden one stays hidden: the hide comes later.
        let a = strs(&p.args);
        let ssh = f.home.join(".ssh").display().to_string();
        let w = find(&a, &["--bind", &ssh, &ssh]).unwrap();
        let h = find(&a, &["--tmpfs", &ssh, "--remount-ro", &ssh]).unwrap();
        assert!(w < h);
        assert!(p.not_applied.iter().any(|n| n.contains(".config/absent")));
    }

    #[test]
    fn symlinked_credentials_are_hidden_at_their_target() {
        let f = fixture();
        let real = f.home.join("real-aws");
        std::fs::create_dir_all(&real).unwrap();
        std::os::unix::fs::symlink(&real, f.home.join(".aws")).unwrap();
        let p = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        assert!(p
            .mounts
            .iter()
            .any(|m| m.path == real && m.kind == MountKind::HiddenDir));
    }

    #[test]
    fn a_root_that_is_slash_or_inside_a_hidden_location_is_refused() {
        let f = fixture();
        let mut s = spec(&f, BackendOptions::new());
        s.root = "/".into();
        assert!(plan(&s, &facts(&f), programs(), &[])
            .unwrap_err()
            .to_string()
            .contains("`/`"));
        let inside = f.home.join(".ssh/proj");
        std::fs::create_dir_all(&inside).unwrap();
        let mut s = spec(&f, BackendOptions::new());
        s.root = inside.clone();
        s.workdir = inside;
        assert!(plan(&s, &facts(&f), programs(), &[])
            .unwrap_err()
            .to_string()
            .contains("inside a hidden location"));
        let mut s = spec(&f, BackendOptions::new());
        s.argv.clear();
        assert_eq!(
            plan(&s, &facts(&f), programs(), &[]).unwrap_err(),
            PlanError::NoCommand
        );
    }

    #[test]
    fn every_shared_credential_location_that_exists_is_hidden() {
        let f = fixture();
        for rel in CREDENTIAL_LOCATIONS.iter() {
            let p = f.home.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            if !p.exists() {
                std::fs::write(&p, "secret").unwrap();
            }
        }
        let plan = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        for rel in CREDENTIAL_LOCATIONS.iter() {
            let p = f.home.join(rel);
            let hidden = plan.mounts.iter().any(|m| {
                m.path == p && matches!(m.kind, MountKind::HiddenDir | MountKind::HiddenFile)
            });
            assert!(hidden, "{} not hidden: {:?}", p.display(), plan.mounts);
        }
    }

    #[test]
    fn host_daemon_sockets_are_covered_unless_allowed() {
        let f = fixture();
        let _listener = std::os::unix::net::UnixListener::bind(f.home.join("daemon.sock")).unwrap();
        let sock = f.home.join("daemon.sock").display().to_string();
        let hidden = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        let args = strs(&hidden.args);
        assert!(
            find(&args, &["--ro-bind", "/dev/null", &sock]).is_some(),
            "{args:?}"
        );
        assert!(hidden
            .mounts
            .iter()
            .any(|m| m.reason == daemon_sockets::DAEMON_SOCKET_REASON
                && m.kind == MountKind::HiddenFile));
        assert!(!hidden.daemon_sockets_allowed);
        // What the walk could not search is said, not passed over.
        assert!(
            hidden.not_applied.iter().any(|n| n.contains("/run/huge")),
            "{:?}",
            hidden.not_applied
        );
        let mut o = BackendOptions::new();
        o.push(crate::OPT_HOST_SOCKETS, "allow");
        let allowed = plan_with(&f, o, &[]).unwrap();
        assert!(!strs(&allowed.args).contains(&sock));
        assert!(allowed.daemon_sockets_allowed);
        let mut o = BackendOptions::new();
        o.push(crate::OPT_HOST_SOCKETS, "show");
        assert!(matches!(
            plan_with(&f, o, &[]),
            Err(PlanError::BadOption {
                key: crate::OPT_HOST_SOCKETS,
                ..
            })
        ));
    }

    /// A rebuilt `/run` (here a directory of the fixture's): a tmpfs first, made read-only after
    /// every mount below it; no cover for its sockets, so a socket and its directory removed
    /// after the plan leave no mount point missing.
    #[test]
    fn a_rebuilt_run_leaves_its_sockets_out_and_survives_their_removal() {
        let f = fixture();
        let run = f.home.join("run");
        std::fs::create_dir_all(run.join("d")).unwrap();
        std::fs::write(run.join("file"), "").unwrap();
        let sock = run.join("d/daemon.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let mut facts = facts(&f);
        facts.daemon_sockets = daemon_sockets::find(&run, &[]);
        let spec = spec(&f, BackendOptions::new());
        let plan = plan(&spec, &facts, programs(), &[]).unwrap();
        let args = strs(&plan.args);
        let (run_s, sock_s) = (run.display().to_string(), sock.display().to_string());
        let (d_s, file_s) = (
            run.join("d").display().to_string(),
            run.join("file").display().to_string(),
        );
        let tmpfs = find(&args, &["--tmpfs", &run_s]).unwrap();
        let dir = find(&args, &["--dir", &d_s]).unwrap();
        let shown = find(&args, &["--ro-bind-try", &file_s, &file_s]).unwrap();
        let remount = find(&args, &["--remount-ro", &run_s]).unwrap();
        assert!(tmpfs < dir && dir < remount && shown < remount, "{args:?}");
        assert!(!args.contains(&sock_s), "{args:?}");
        assert!(plan.mounts.iter().any(|m| m.path == sock
            && m.kind == MountKind::LeftOut
            && m.reason == daemon_sockets::DAEMON_SOCKET_REASON));
        drop(listener);
        std::fs::remove_dir_all(run.join("d")).unwrap();
        std::fs::remove_file(run.join("file")).unwrap();
        assert_eq!(plan.vanished_mount_point(), None);
    }

    #[test]
    fn a_covered_socket_removed_after_the_plan_is_named() {
        let f = fixture();
        let path = f.home.join("daemon.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let plan = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        assert_eq!(plan.vanished_mount_point(), None);
        drop(listener);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(plan.vanished_mount_point(), Some(path.as_path()));
    }

    #[test]
    fn container_engine_sockets_that_exist_are_covered_with_an_empty_file() {
        let f = fixture();
        let _listener = std::os::unix::net::UnixListener::bind(f.home.join("engine.sock")).unwrap();
        let plan = plan_with(&f, BackendOptions::new(), &[]).unwrap();
        let args = strs(&plan.args);
        let sock = f.home.join("engine.sock").display().to_string();
        assert!(
            find(&args, &["--ro-bind", "/dev/null", &sock]).is_some(),
            "{args:?}"
        );
        let absent = f.home.join("absent.sock").display().to_string();
        assert!(!args.contains(&absent), "{args:?}");
        assert!(plan
            .mounts
            .iter()
            .any(|m| m.reason == "container engine socket" && m.kind == MountKind::HiddenFile));
    }

    #[test]
    fn engine_sockets_come_from_docker_host_and_the_usual_places() {
        let env = vec![(
            OsString::from("DOCKER_HOST"),
            OsString::from("unix:///srv/custom/docker.sock"),
        )];
        let facts = HostFacts::current(&env);
        for p in [
            "/srv/custom/docker.sock",
            "/var/run/docker.sock",
            "/run/podman/podman.sock",
            "/run/containerd/containerd.sock",
        ] {
            assert!(
                facts.engine_sockets.contains(&PathBuf::from(p)),
                "{p}: {:?}",
                facts.engine_sockets
            );
        }
    }

    #[test]
    fn host_facts_take_homes_from_both_environments_and_the_state_dir_from_the_store() {
        let env = vec![
            (OsString::from("HOME"), OsString::from("/home/cmd")),
            (
                OsString::from("XDG_STATE_HOME"),
                OsString::from("/var/state"),
            ),
        ];
        let f = HostFacts::current(&env);
        assert!(f.homes.contains(&PathBuf::from("/home/cmd")));
        // The command's XDG_STATE_HOME does not move agentdiff's key: only the store's rule does.
        let store = agentdiff_host::state_dir::locate().ok();
        assert_eq!(f.state_dir, store);
    }

    #[test]
    fn a_bwrap_inside_the_root_or_a_writable_path_is_refused() {
        let f = fixture();
        let s = spec(&f, BackendOptions::new());
        for fake in [
            f.root.join("node_modules/.bin/bwrap"),
            f.root.join(".venv/bin/bwrap"),
        ] {
            std::fs::create_dir_all(fake.parent().unwrap()).unwrap();
            std::fs::write(&fake, "#!/bin/sh\n").unwrap();
            let programs = Programs {
                bwrap: fake.clone(),
                shim: "/opt/agentdiff".into(),
            };
            let e = plan(&s, &facts(&f), programs, &[]).unwrap_err();
            assert!(matches!(e, PlanError::UntrustedBwrap(_)), "{e}");
            assert!(
                e.to_string().contains("refusing the bwrap executable"),
                "{e}"
            );
        }
        // Named through a symlink outside, it is still the file inside the root.
        let link = f.home.join("bwrap");
        std::os::unix::fs::symlink(f.root.join(".venv/bin/bwrap"), &link).unwrap();
        let programs = Programs {
            bwrap: link,
            shim: "/opt/agentdiff".into(),
        };
        assert!(plan(&s, &facts(&f), programs, &[]).is_err());
        // Inside a writable option.
        let cache = f.home.join("cache");
        std::fs::create_dir_all(&cache).unwrap();
        std::fs::write(cache.join("bwrap"), "").unwrap();
        let mut o = BackendOptions::new();
        o.push("writable", cache.display().to_string());
        let programs = Programs {
            bwrap: cache.join("bwrap"),
            shim: "/opt/agentdiff".into(),
        };
        assert!(plan(&spec(&f, o), &facts(&f), programs, &[]).is_err());
    }

    #[test]
    fn kernel_filesystems_are_never_writable() {
        let f = fixture();
        for path in [
            "/proc",
            "/proc/self",
            "/sys",
            "/sys/kernel",
            "/dev",
            "/dev/shm",
        ] {
            if !Path::new(path).exists() {
                continue;
            }
            let mut o = BackendOptions::new();
            o.push("writable", path);
            let e = plan_with(&f, o, &[]).unwrap_err().to_string();
            assert!(
                e.contains("kernel filesystems are never bound writable"),
                "{path}: {e}"
            );
        }
    }

    #[test]
    fn credentials_relocated_by_the_environment_are_hidden() {
        let f = fixture();
        let alt = f.home.join("alt");
        let files = [
            "cargo/credentials.toml",
            "cargo/credentials",
            "xdg/gh/hosts.yml",
            "xdg/gcloud/x",
            "xdg/git/credentials",
            "docker/config.json",
            "kube/a",
            "kube/b",
            "gnupg/pubring.kbx",
            "aws/creds",
            "aws/config",
            "state/agentdiff/seal.key",
        ];
        for rel in files {
            let p = alt.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, "secret").unwrap();
        }
        let a = |rel: &str| alt.join(rel).into_os_string();
        let kube = std::env::join_paths([alt.join("kube/a"), alt.join("kube/b")]).unwrap();
        let env: Vec<(OsString, OsString)> = vec![
            ("CARGO_HOME".into(), a("cargo")),
            ("XDG_CONFIG_HOME".into(), a("xdg")),
            ("DOCKER_CONFIG".into(), a("docker")),
            ("KUBECONFIG".into(), kube),
            ("GNUPGHOME".into(), a("gnupg")),
            ("AWS_SHARED_CREDENTIALS_FILE".into(), a("aws/creds")),
            ("AWS_CONFIG_FILE".into(), a("aws/config")),
            ("XDG_STATE_HOME".into(), a("state")),
            ("GNUPGHOME".into(), "relative/ignored".into()),
        ];
        let mut facts = facts(&f);
        // The store is elsewhere (AGENTDIFF_STATE_DIR): the default key directory still hides.
        facts.state_dir = Some(f.home.join("elsewhere"));
        facts.env_credentials = env_credential_locations(&env, &facts.homes);
        let p = plan(&spec(&f, BackendOptions::new()), &facts, programs(), &[]).unwrap();
        let hidden = |path: PathBuf| {
            p.mounts.iter().any(|m| {
                m.path == path && matches!(m.kind, MountKind::HiddenDir | MountKind::HiddenFile)
            })
        };
        for rel in [
            "cargo/credentials.toml",
            "cargo/credentials",
            "xdg/gh",
            "xdg/gcloud",
            "xdg/git/credentials",
            "docker",
            "kube/a",
            "kube/b",
            "aws/creds",
            "aws/config",
            "state/agentdiff",
        ] {
            assert!(hidden(alt.join(rel)), "{rel} not hidden: {:?}", p.mounts);
        }
        // The later GNUPGHOME is relative: ignored, not resolved against the working directory.
        assert!(!hidden(alt.join("gnupg")));
        assert!(
            hidden(f.home.join(".local/state/agentdiff")),
            "{:?}",
            p.mounts
        );
        let env: Vec<(OsString, OsString)> = vec![("GNUPGHOME".into(), a("gnupg"))];
        let found = env_credential_locations(&env, &[]);
        assert_eq!(
            found,
            [(alt.join("gnupg"), "credential location ($GNUPGHOME)".into())]
        );
    }

    #[test]
    fn shim_variables_from_the_caller_never_reach_the_sandbox() {
        let f = fixture();
        let mut s = spec(&f, BackendOptions::new());
        s.env
            .push((exec_shim::ENV_HOST_NAMESPACES.into(), "net:1".into()));
        s.env
            .push((exec_shim::ENV_SECCOMP_GUARD.into(), "0".into()));
        let p = plan(&s, &facts(&f), programs(), &[]).unwrap();
        for var in exec_shim::SHIM_ENV_VARS {
            assert!(!p.env.iter().any(|(k, _)| k == var), "{var}");
        }
        assert_eq!(
            unshared_namespaces(Network::None),
            ["mnt", "pid", "ipc", "uts", "net"]
        );
        assert_eq!(
            unshared_namespaces(Network::Host),
            ["mnt", "pid", "ipc", "uts"]
        );
    }
}
