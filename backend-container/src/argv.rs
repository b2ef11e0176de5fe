//! The pure transform from a validated request to the engine's `run` argv.
//!
//! Layout (argv boundaries of the command are preserved exactly; `--` ends the engine's flags
//! before the image or rootfs, because after the image every word, `--` included, belongs to the
//! command):
//!
//! ```text
//! run [--rm] --name agentdiff-<key> --label agentdiff.run=<key> --label agentdiff.managed=true
//!     --network none --cap-drop ALL --security-opt no-new-privileges --read-only
//!     --tmpfs /tmp:rw,size=64m,mode=1777 --user 65532:65532 [--userns keep-id]
//!     --memory 512m --memory-swap 512m --cpus 1 --pids-limit 64 --init --interactive
//!     [--env NAME]… -v <workspace>:/workspace -w /workspace
//!     (--pull never|missing -- IMAGE | --rootfs -- DIR) ARGV…
//! ```
//!
//! Nothing else is mounted: not the host project tree, not the engine's socket.
//!
//! `<key>` is `<run>-<digest>` ([`RunIdentity`]): run ids are unique only within one project's
//! store (and `--run-id` lets the caller choose one), so the name and the label also carry a
//! digest of the canonical project root. Two roots using the same run id never share a name or a
//! label, and every sweep by label finds only its own root's run.
//!
//! Remote mode (an engine that may run on another machine) builds `create` instead of `run`,
//! without `--rm` (the workspace is copied out of the stopped container before agentdiff removes
//! it) and with `--mount type=volume,destination=/workspace` instead of `-v <workspace>:…`: an
//! anonymous volume on the engine's side, filled and emptied through the engine's archive API.
//! No host path appears in a remote argv.
//!
//! `--rm` is given to podman only. Through podman's Docker-compatible API, the docker CLI with
//! `--rm` reports exit code 0 whatever the command returned (the container is removed before
//! its exit code is read), so for docker agentdiff removes the container itself after the run.

use std::ffi::OsString;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::engine::{EngineKind, RUN_LABEL};
use crate::options::{ContainerOptions, Source, UserSpec, TMPFS_TMP};

/// Label marking every container agentdiff starts.
pub const MANAGED_LABEL: &str = "agentdiff.managed=true";
/// Where the private workspace appears inside the container.
pub const CONTAINER_WORKDIR: &str = "/workspace";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgvError {
    #[error("run id {0:?} cannot name a container; run ids are letters, digits, `-`, `_` and `.`")]
    RunId(String),
    #[error("the workspace path {0:?} cannot be bind-mounted: it must be absolute UTF-8 without `:`, `,` or control characters")]
    WorkspacePath(String),
    #[error("the command is empty; give the command after `--`")]
    EmptyCommand,
    #[error("argument {0} of the command is not valid UTF-8; container engines carry the command in JSON, which would replace those bytes, so it is refused rather than changed")]
    NonUtf8Argument(usize),
}

/// Everything the run argv depends on.
#[derive(Debug, Clone)]
pub struct RunRequest<'a> {
    pub kind: EngineKind,
    pub run_id: &'a str,
    /// The project root: with the run id, what makes the container's name and label unique.
    pub root: &'a Path,
    pub workspace: &'a Path,
    /// Workspace entries bound read-only over the workspace's own mount, relative to it,
    /// parents first (`crate::protected`); local runs only.
    pub read_only: &'a [String],
    pub options: &'a ContainerOptions,
    /// The container user actually used (explicit or the invoker's default).
    pub user: UserSpec,
    /// Rootless podman: map the invoking user to itself so the workspace it owns is writable.
    pub userns_keep_id: bool,
    pub command: &'a [OsString],
    /// Remote mode: `create` with an engine-side volume, no host path.
    pub remote: bool,
}

/// The engine-side anonymous volume a remote container's workspace lives in.
pub const REMOTE_WORKSPACE_MOUNT: &str = "type=volume,destination=/workspace";

/// One run of one project root, as the engine sees it: what the backend's container names and
/// labels carry, and what every sweep matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIdentity {
    run_id: String,
    /// 16 hex digits of SHA-256 over the canonical root, a NUL and the run id.
    digest: String,
}

impl RunIdentity {
    /// The identity of run `run_id` of the project at `root` (canonicalised when it exists, so
    /// that the run and a later cleanup agree however the root was spelled).
    pub fn new(root: &Path, run_id: &str) -> Result<Self, ArgvError> {
        let ok = !run_id.is_empty()
            && run_id.len() <= 128
            && run_id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && run_id.as_bytes()[0].is_ascii_alphanumeric();
        if !ok {
            return Err(ArgvError::RunId(run_id.to_string()));
        }
        let canonical = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        let mut hash = Sha256::new();
        hash.update(canonical.as_os_str().as_encoded_bytes());
        hash.update([0u8]);
        hash.update(run_id.as_bytes());
        let digest = hex::encode(&hash.finalize()[..8]);
        Ok(Self {
            run_id: run_id.to_string(),
            digest,
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// `<run>-<digest>`: the value of the run label and the suffix of the container name.
    pub fn key(&self) -> String {
        format!("{}-{}", self.run_id, self.digest)
    }

    /// The container's name.
    pub fn container_name(&self) -> String {
        format!("agentdiff-{}", self.key())
    }

    /// The run label, `agentdiff.run=<key>`.
    pub fn label(&self) -> String {
        format!("{RUN_LABEL}={}", self.key())
    }

    /// Prefix of the directories this run creates next to its private workspace (ship-out
    /// staging, the `--cidfile` directory): `.<run>.`; the workspace is the run's own already.
    pub fn sibling_prefix(&self) -> String {
        format!(".{}.", self.run_id)
    }
}

/// The arguments after the engine program.
pub fn run_args(req: &RunRequest<'_>) -> Result<Vec<OsString>, ArgvError> {
    let identity = RunIdentity::new(req.root, req.run_id)?;
    let name = identity.container_name();
    if req.command.is_empty() {
        return Err(ArgvError::EmptyCommand);
    }
    if let Some(i) = req.command.iter().position(|a| a.to_str().is_none()) {
        return Err(ArgvError::NonUtf8Argument(i));
    }
    let workspace = req
        .workspace
        .to_str()
        .filter(|w| {
            req.workspace.is_absolute()
                && !w.contains([':', ','])
                && !w.chars().any(char::is_control)
        })
        .ok_or_else(|| ArgvError::WorkspacePath(req.workspace.display().to_string()))?;
    let o = req.options;
    let filtered = req.options.network == crate::options::Network::Filtered;
    // Created first when agentdiff must act between the container's creation and the command's
    // start: shipping the workspace in (remote), starting the egress forwarder (filtered).
    let create = req.remote || filtered;
    let mut a: Vec<String> = vec![if create { "create" } else { "run" }.into()];
    if req.kind == EngineKind::Podman && !req.remote {
        a.push("--rm".into());
    }
    a.extend([
        "--name".into(),
        name,
        "--label".into(),
        identity.label(),
        "--label".into(),
        MANAGED_LABEL.into(),
        "--network".into(),
        o.network.engine_value().into(),
        "--cap-drop".into(),
        "ALL".into(),
        "--security-opt".into(),
        "no-new-privileges".into(),
        "--read-only".into(),
        "--tmpfs".into(),
        TMPFS_TMP.into(),
        "--user".into(),
        req.user.render(),
    ]);
    if req.userns_keep_id && req.kind == EngineKind::Podman {
        a.extend(["--userns".into(), "keep-id".into()]);
    }
    a.extend([
        "--memory".into(),
        o.memory.clone(),
        // Equal to --memory: the limit is not silently doubled by swap.
        "--memory-swap".into(),
        o.memory.clone(),
        "--cpus".into(),
        o.cpus.clone(),
        "--pids-limit".into(),
        o.pids_limit.to_string(),
        "--init".into(),
        // Keep stdin open: the command reads what agentdiff's stdin (or a file) provides.
        "--interactive".into(),
    ]);
    let proxy_env = agentdiff_backend_api::egress::proxy_env();
    let ours = |name: &str| filtered && proxy_env.iter().any(|(k, _)| k == name);
    for name in o.env.iter().filter(|n| !ours(n)) {
        // Name only: the engine copies the value from its own environment, so values never
        // appear on a command line or in evidence.
        a.extend(["--env".into(), name.clone()]);
    }
    if filtered {
        // The proxy variables replace the caller's own (as bwrap does); their values name only
        // the container's loopback, so they may appear on the command line.
        for (k, v) in &proxy_env {
            a.extend([
                "--env".into(),
                format!("{}={}", k.to_string_lossy(), v.to_string_lossy()),
            ]);
        }
    }
    if req.remote {
        a.extend(["--mount".into(), REMOTE_WORKSPACE_MOUNT.into()]);
    } else {
        a.extend(["-v".into(), format!("{workspace}:{CONTAINER_WORKDIR}")]);
        for rel in req.read_only {
            a.extend([
                "-v".into(),
                format!("{workspace}/{rel}:{CONTAINER_WORKDIR}/{rel}:ro"),
            ]);
        }
    }
    a.extend(["-w".into(), CONTAINER_WORKDIR.into()]);
    match &o.source {
        Source::Image(image) => {
            let pull = if o.pull { "missing" } else { "never" };
            a.extend(["--pull".into(), pull.into(), "--".into(), image.clone()]);
        }
        Source::Rootfs(dir) => {
            a.extend(["--rootfs".into(), "--".into(), dir.clone()]);
        }
    }
    let mut out: Vec<OsString> = a.into_iter().map(OsString::from).collect();
    out.extend(req.command.iter().cloned());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentdiff_backend_api::BackendOptions;

    fn options(pairs: &[(&str, &str)]) -> ContainerOptions {
        let mut o = BackendOptions::new();
        for (k, v) in pairs {
            o.push(*k, *v);
        }
        ContainerOptions::parse(&o).unwrap()
    }

    #[test]
    fn default_image_argv_is_exact() {
        let o = options(&[("image", "localhost/x:1")]);
        let cmd: Vec<OsString> = vec!["sh".into(), "-c".into(), "echo a  b".into(), "--".into()];
        let args = run_args(&RunRequest {
            kind: EngineKind::Podman,
            run_id: "r1",
            root: Path::new("/nonexistent-root"),
            workspace: Path::new("/p/.agentdiff/workspaces/r1"),
            read_only: &[],
            options: &o,
            user: UserSpec {
                uid: 65532,
                gid: 65532,
            },
            userns_keep_id: false,
            command: &cmd,
            remote: false,
        })
        .unwrap();
        let key = RunIdentity::new(Path::new("/nonexistent-root"), "r1")
            .unwrap()
            .key();
        let expected = format!("run --rm --name agentdiff-{key} --label agentdiff.run={key} --label agentdiff.managed=true \
            --network none --cap-drop ALL --security-opt no-new-privileges --read-only \
            --tmpfs /tmp:rw,size=64m,mode=1777 --user 65532:65532 --memory 512m --memory-swap 512m \
            --cpus 1 --pids-limit 64 --init --interactive -v /p/.agentdiff/workspaces/r1:/workspace -w /workspace \
            --pull never -- localhost/x:1");
        let got: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let split: Vec<&str> = expected.split_whitespace().collect();
        assert_eq!(&got[..split.len()], &split[..]);
        assert_eq!(&args[split.len()..], &cmd[..]);
    }

    #[test]
    fn the_same_run_id_in_two_roots_names_and_labels_two_containers() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let ia = RunIdentity::new(&a, "shared-1").unwrap();
        let ib = RunIdentity::new(&b, "shared-1").unwrap();
        assert_ne!(ia.container_name(), ib.container_name());
        assert_ne!(ia.label(), ib.label());
        assert!(ia.container_name().starts_with("agentdiff-shared-1-"));
        // The same root however it is spelled (a cleanup may be given another path to it).
        let spelled = a.join("..").join("a");
        assert_eq!(RunIdentity::new(&spelled, "shared-1").unwrap(), ia);
        std::os::unix::fs::symlink(&a, dir.path().join("link")).unwrap();
        assert_eq!(
            RunIdentity::new(&dir.path().join("link"), "shared-1").unwrap(),
            ia
        );
        assert_ne!(RunIdentity::new(&a, "shared-2").unwrap().key(), ia.key());
    }

    #[test]
    fn rootfs_env_and_keep_id() {
        let o = options(&[
            ("engine", "podman"),
            ("rootfs", "/srv/rfs"),
            ("env", "LANG"),
            ("network", "bridge"),
        ]);
        let cmd: Vec<OsString> = vec!["-x".into()];
        let args = run_args(&RunRequest {
            kind: EngineKind::Podman,
            run_id: "r2",
            root: Path::new("/nonexistent-root"),
            workspace: Path::new("/w"),
            read_only: &[".git".into(), ".claude".into()],
            options: &o,
            user: UserSpec {
                uid: 1000,
                gid: 1000,
            },
            userns_keep_id: true,
            command: &cmd,
            remote: false,
        })
        .unwrap();
        let s: Vec<String> = args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = s.join(" ");
        // The protected entries go over the workspace's mount, read-only, after it.
        assert!(
            joined.contains(
                "-v /w:/workspace -v /w/.git:/workspace/.git:ro -v /w/.claude:/workspace/.claude:ro -w"
            ),
            "{joined}"
        );
        assert!(joined.contains("--user 1000:1000 --userns keep-id"));
        assert!(joined.contains("--network bridge"));
        assert!(joined.contains("--env LANG -v /w:/workspace"));
        assert!(joined.ends_with("--rootfs -- /srv/rfs -x"));
        assert!(!joined.contains("--pull"));
    }

    #[test]
    fn remote_creates_with_an_engine_volume_and_no_host_path() {
        let o = options(&[("image", "localhost/x:1"), ("engine-host", "tcp://h:1")]);
        let cmd: Vec<OsString> = vec!["true".into()];
        for kind in [EngineKind::Podman, EngineKind::Docker] {
            let args = run_args(&RunRequest {
                kind,
                run_id: "r",
                root: Path::new("/nonexistent-root"),
                workspace: Path::new("/p/.agentdiff/workspaces/r"),
                read_only: &[],
                options: &o,
                user: UserSpec { uid: 1, gid: 1 },
                userns_keep_id: false,
                command: &cmd,
                remote: true,
            })
            .unwrap();
            let s: Vec<String> = args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            assert_eq!(s[0], "create");
            assert!(!s.contains(&"--rm".to_string()));
            assert!(!s.contains(&"-v".to_string()));
            assert!(!s.iter().any(|a| a.contains("/p/")), "{s:?}");
            let joined = s.join(" ");
            assert!(joined.contains("--mount type=volume,destination=/workspace -w /workspace"));
        }
    }

    #[test]
    fn docker_gets_no_rm_so_its_exit_code_survives() {
        let o = options(&[("image", "localhost/x:1")]);
        let cmd: Vec<OsString> = vec!["true".into()];
        let req = |kind| RunRequest {
            kind,
            run_id: "r",
            root: Path::new("/nonexistent-root"),
            workspace: Path::new("/w"),
            read_only: &[],
            options: &o,
            user: UserSpec { uid: 1, gid: 1 },
            userns_keep_id: false,
            command: &cmd,
            remote: false,
        };
        let docker = run_args(&req(EngineKind::Docker)).unwrap();
        assert_eq!(docker[1], OsString::from("--name"));
        assert!(!docker.contains(&OsString::from("--rm")));
        let podman = run_args(&req(EngineKind::Podman)).unwrap();
        assert_eq!(podman[1], OsString::from("--rm"));
    }

    #[test]
    fn refuses_unmountable_workspaces_and_bad_ids() {
        let o = options(&[("image", "a")]);
        let cmd: Vec<OsString> = vec!["true".into()];
        for (run, ws) in [
            ("r", "relative"),
            ("r", "/a:b"),
            ("r", "/a,b"),
            ("r", "/a\nb"),
            ("-r", "/w"),
            ("r/x", "/w"),
            ("", "/w"),
        ] {
            let res = run_args(&RunRequest {
                kind: EngineKind::Docker,
                run_id: run,
                root: Path::new("/nonexistent-root"),
                workspace: Path::new(ws),
                read_only: &[],
                options: &o,
                user: UserSpec { uid: 1, gid: 1 },
                userns_keep_id: false,
                command: &cmd,
                remote: false,
            });
            assert!(res.is_err(), "{run:?} {ws:?}");
        }
        let res = run_args(&RunRequest {
            kind: EngineKind::Docker,
            run_id: "r",
            root: Path::new("/nonexistent-root"),
            workspace: Path::new("/w"),
            read_only: &[],
            options: &o,
            user: UserSpec { uid: 1, gid: 1 },
            userns_keep_id: false,
            command: &[],
            remote: false,
        });
        assert_eq!(res.unwrap_err(), ArgvError::EmptyCommand);
        #[cfg(unix)]
        {
            use std::os::unix::ffi::OsStringExt;
            let bad = vec![OsString::from("echo"), OsString::from_vec(vec![0xff, b'a'])];
            let res = run_args(&RunRequest {
                kind: EngineKind::Podman,
                run_id: "r",
                root: Path::new("/nonexistent-root"),
                workspace: Path::new("/w"),
                read_only: &[],
                options: &o,
                user: UserSpec { uid: 1, gid: 1 },
                userns_keep_id: false,
                command: &bad,
                remote: false,
            });
            assert_eq!(res.unwrap_err(), ArgvError::NonUtf8Argument(1));
        }
    }
}
