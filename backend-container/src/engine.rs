//! Talking to the container engine CLI (podman or docker) for everything except the run itself:
//! discovery, version, image presence and identity, start events, removal by label.
//!
//! Every call has a deadline and an explicit environment, and reports the engine's own message on
//! failure so the user sees what the engine said.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Label carrying the run's identity (run id and root digest, [`crate::argv::RunIdentity`]);
/// `agentdiff cleanup` finds a crashed run's containers by it.
pub const RUN_LABEL: &str = "agentdiff.run";

/// Deadline of one auxiliary engine call (version, inspect, rm…).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Variables the engine client itself needs (socket location, config, credentials paths). They are
/// given to the client process only; the container receives nothing but `--env NAME` variables.
pub const ENGINE_CLIENT_VARS: [&str; 17] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "XDG_RUNTIME_DIR",
    "XDG_CONFIG_HOME",
    "XDG_DATA_HOME",
    "TMPDIR",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
    "CONTAINER_HOST",
    "CONTAINER_CONNECTION",
    "CONTAINERS_CONF",
    "CONTAINERS_STORAGE_CONF",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    Podman,
    Docker,
}

impl EngineKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Podman => "podman",
            EngineKind::Docker => "docker",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("could not run `{program}`: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{program} {args}` did not finish within {secs} s")]
    TimedOut {
        program: String,
        args: String,
        secs: u64,
    },
    #[error("`{program} {args}` failed (exit {code:?}): {stderr}")]
    Failed {
        program: String,
        args: String,
        code: Option<i32>,
        stderr: String,
    },
}

/// The output of one finished engine call.
#[derive(Debug, Clone)]
pub struct CallOutput {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// One engine CLI: which kind, which binary, and the environment its client runs with.
#[derive(Debug, Clone)]
pub struct Engine {
    pub kind: EngineKind,
    pub program: PathBuf,
    pub env: Vec<(OsString, OsString)>,
}

impl Engine {
    /// Run `program args…` with a deadline; a non-zero exit is returned, not an error.
    pub async fn call(&self, args: &[&str]) -> Result<CallOutput, EngineError> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(args)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let child = cmd.spawn().map_err(|source| EngineError::Spawn {
            program: self.program.display().to_string(),
            source,
        })?;
        match tokio::time::timeout(CALL_TIMEOUT, child.wait_with_output()).await {
            Err(_) => Err(EngineError::TimedOut {
                program: self.program.display().to_string(),
                args: args.join(" "),
                secs: CALL_TIMEOUT.as_secs(),
            }),
            Ok(Err(source)) => Err(EngineError::Spawn {
                program: self.program.display().to_string(),
                source,
            }),
            Ok(Ok(out)) => Ok(CallOutput {
                code: out.status.code(),
                stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
                stderr: one_line(&String::from_utf8_lossy(&out.stderr)),
            }),
        }
    }

    /// Like [`Engine::call`], but a non-zero exit is an error carrying the engine's message.
    pub async fn call_ok(&self, args: &[&str]) -> Result<String, EngineError> {
        let out = self.call(args).await?;
        if out.code == Some(0) {
            Ok(out.stdout)
        } else {
            Err(EngineError::Failed {
                program: self.program.display().to_string(),
                args: args.join(" "),
                code: out.code,
                stderr: out.stderr,
            })
        }
    }

    /// `--version`: needs no daemon, so it works even when the docker socket is down.
    pub async fn version(&self) -> Result<String, EngineError> {
        let out = self.call_ok(&["--version"]).await?;
        Ok(out.lines().next().unwrap_or("").trim().to_string())
    }

    /// For docker: the API server (daemon or podman socket) answers. podman needs no daemon.
    pub async fn server_version(&self) -> Result<Option<String>, EngineError> {
        match self.kind {
            EngineKind::Podman => Ok(None),
            EngineKind::Docker => self
                .call_ok(&["version", "--format", "{{.Server.Version}}"])
                .await
                .map(Some),
        }
    }

    /// The local image's id (`sha256:…`, the digest of its configuration), or `None` when the image
    /// is not present locally. Never pulls.
    pub async fn local_image_id(&self, image: &str) -> Result<Option<String>, EngineError> {
        if self.kind == EngineKind::Podman {
            // `image exists` separates "absent" (1) from an engine failure (125).
            let out = self.call(&["image", "exists", "--", image]).await?;
            match out.code {
                Some(0) => {}
                Some(1) => return Ok(None),
                code => {
                    return Err(EngineError::Failed {
                        program: self.program.display().to_string(),
                        args: format!("image exists -- {image}"),
                        code,
                        stderr: out.stderr,
                    })
                }
            }
        }
        let out = self
            .call(&["image", "inspect", "--format", "{{.Id}}", "--", image])
            .await?;
        if out.code != Some(0) {
            // docker: the daemon was reached before (server_version), so a failure here means the
            // image is absent; podman: it vanished between the two calls.
            return Ok(None);
        }
        let id = out.stdout.lines().next().unwrap_or("").trim().to_string();
        if id.is_empty() {
            return Ok(None);
        }
        Ok(Some(if id.starts_with("sha256:") {
            id
        } else {
            format!("sha256:{id}")
        }))
    }

    /// Whether the engine recorded a `start` event for this container since `since_unix` (used only
    /// when the exit code is ambiguous: 125–127 come from the engine or from the command).
    pub async fn container_started(
        &self,
        container_id: &str,
        since_unix: u64,
    ) -> Result<bool, EngineError> {
        let since = since_unix.to_string();
        let filter = format!("container={container_id}");
        let args: Vec<&str> = match self.kind {
            EngineKind::Podman => vec![
                "events",
                "--stream=false",
                "--since",
                &since,
                "--filter",
                &filter,
                "--filter",
                "event=start",
                "--format",
                "{{.Status}}",
            ],
            EngineKind::Docker => vec![
                "events",
                "--since",
                &since,
                "--until",
                "0s",
                "--filter",
                &filter,
                "--filter",
                "event=start",
                "--format",
                "{{.Status}}",
            ],
        };
        let out = self.call_ok(&args).await?;
        Ok(out.lines().any(|l| l.trim() == "start"))
    }

    /// Ids of containers (running or not) labelled with this run of this root.
    /// `key`: [`crate::argv::RunIdentity::key`], the label's value.
    pub async fn containers_of_run(&self, key: &str) -> Result<Vec<String>, EngineError> {
        let filter = format!("label={RUN_LABEL}={key}");
        let out = self
            .call_ok(&["ps", "-a", "-q", "--no-trunc", "--filter", &filter])
            .await?;
        Ok(out
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// Stop a container: TERM to its init, KILL after `grace`.
    pub async fn stop(&self, name: &str, grace: Duration) -> Result<(), EngineError> {
        let secs = grace.as_secs().max(1).to_string();
        self.call_ok(&["stop", "--time", &secs, "--", name])
            .await
            .map(|_| ())
    }

    /// `podman init`: the container's namespaces exist and its init process waits for `start`;
    /// returns that process's host pid (the key to its network namespace).
    pub async fn init_pid(&self, id: &str) -> Result<u32, EngineError> {
        self.call_ok(&["init", "--", id]).await?;
        let out = self
            .call_ok(&[
                "inspect",
                "--type",
                "container",
                "--format",
                "{{.State.Pid}}",
                "--",
                id,
            ])
            .await?;
        out.trim()
            .parse::<u32>()
            .ok()
            .filter(|p| *p > 1)
            .ok_or_else(|| EngineError::Failed {
                program: self.program.display().to_string(),
                args: format!("inspect {id}"),
                code: Some(0),
                stderr: format!("no process id for the initialised container (it printed {out:?})"),
            })
    }

    /// Force-remove a container (kills it if it still runs) with its anonymous volumes: a remote
    /// run's workspace volume holds a copy of the project.
    pub async fn remove(&self, name_or_id: &str) -> Result<(), EngineError> {
        self.call_ok(&["rm", "-f", "-v", "--", name_or_id])
            .await
            .map(|_| ())
    }

    /// Names of the engine volumes mounted into a container (empty when it has none or the
    /// engine cannot say).
    pub async fn container_volumes(&self, id: &str) -> Vec<String> {
        let format = "{{range .Mounts}}{{if eq .Type \"volume\"}}{{.Name}} {{end}}{{end}}";
        match self
            .call_ok(&[
                "inspect",
                "--type",
                "container",
                "--format",
                format,
                "--",
                id,
            ])
            .await
        {
            Ok(out) => out
                .split_whitespace()
                .filter(|n| {
                    n.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                })
                .map(str::to_string)
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Whether the engine still has this volume.
    pub async fn volume_exists(&self, name: &str) -> Result<bool, EngineError> {
        let out = self.call(&["volume", "inspect", "--", name]).await?;
        Ok(out.code == Some(0))
    }
}

/// Where to find an engine binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramSource {
    /// Look the name up on PATH when needed.
    SearchPath,
    /// This exact binary (embedders, tests with a fake engine).
    Fixed(PathBuf),
}

impl ProgramSource {
    /// The binary to run, if one exists.
    pub fn resolve(&self, kind: EngineKind) -> Option<PathBuf> {
        match self {
            // As a shell finds it: on agentdiff's PATH, relative entries under its directory.
            ProgramSource::SearchPath => std::env::current_dir().ok().and_then(|cwd| {
                agentdiff_host::system::find_program(
                    OsStr::new(kind.as_str()),
                    std::env::var_os("PATH").as_deref(),
                    &cwd,
                )
            }),
            ProgramSource::Fixed(p) => is_executable(p).then(|| p.clone()),
        }
    }
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

/// The last non-empty line of an engine's stderr (engines print the decisive message last), with
/// control characters escaped and a length bound.
fn one_line(stderr: &str) -> String {
    let line = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let mut s = agentdiff_host::redact::escape_terminal(line);
    if s.len() > 400 {
        let mut cut = 400;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    if s.is_empty() {
        "no message".to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_keeps_the_last_message_and_escapes_it() {
        assert_eq!(one_line("a\nError: boom\n\n"), "Error: boom");
        assert_eq!(one_line(""), "no message");
        assert!(!one_line("x\u{1b}[31m").contains('\u{1b}'));
    }

    #[test]
    fn fixed_program_must_be_executable() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("engine");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        assert_eq!(
            ProgramSource::Fixed(p.clone()).resolve(EngineKind::Podman),
            None
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            assert_eq!(
                ProgramSource::Fixed(p.clone()).resolve(EngineKind::Podman),
                Some(p)
            );
        }
    }
}
