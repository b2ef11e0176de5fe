//! Driving a backend through its public contract: a scratch project (root, private workspace,
//! capsule directory, and a directory *outside* the root for sentinels and canaries), a
//! [`LaunchSpec`], `prepare`, `launch` with stdio redirected to files, `wait`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agentdiff_backend_api::{
    BackendError, BackendOptions, DynRuntimeBackend, LaunchContext, LaunchSpec, PreparedLaunch,
    RunEvidence, RunningCommand, StdioMode, WorkspaceMode,
};

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("could not create the scratch directory: {0}")]
    Scratch(std::io::Error),
    #[error("could not write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
}

/// Default `PATH` handed to commands when the host has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Temporary directories for one check. Dropped (and removed) after the check.
#[derive(Debug)]
pub struct Scratch {
    _dir: tempfile::TempDir,
    /// The host project root.
    pub root: PathBuf,
    /// Where the command works: `root` for in-place backends, a copy for private-workspace ones.
    pub workdir: PathBuf,
    pub capsule: PathBuf,
    /// Outside the root: sentinels, canaries, stdio files.
    pub outside: PathBuf,
    pub workspace: WorkspaceMode,
}

impl Scratch {
    pub fn new(base: Option<&Path>, workspace: WorkspaceMode) -> Result<Self, HarnessError> {
        let dir = match base {
            Some(b) => tempfile::Builder::new()
                .prefix("agentdiff-conformance-")
                .tempdir_in(b),
            None => tempfile::Builder::new()
                .prefix("agentdiff-conformance-")
                .tempdir(),
        }
        .map_err(HarnessError::Scratch)?;
        let base = dir.path().canonicalize().map_err(HarnessError::Scratch)?;
        let root = base.join("root");
        let workdir = match workspace {
            WorkspaceMode::InPlace => root.clone(),
            WorkspaceMode::Private => base.join("workspace"),
        };
        let capsule = base.join("capsule");
        let outside = base.join("outside");
        for d in [&root, &workdir, &capsule, &outside] {
            std::fs::create_dir_all(d).map_err(HarnessError::Scratch)?;
        }
        // Private workspaces and container users may run as another uid: keep the tree open.
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for d in [&base, &root, &workdir, &capsule, &outside] {
                let _ = std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777));
            }
        }
        Ok(Self {
            _dir: dir,
            root,
            workdir,
            capsule,
            outside,
            workspace,
        })
    }

    /// Write a file in the project root (and in the private workspace, which starts as a copy of
    /// the root, as the transaction materialises it).
    pub fn seed_file(&self, rel: &str, contents: &[u8]) -> Result<(), HarnessError> {
        let mut targets = vec![self.root.join(rel)];
        if self.workdir != self.root {
            targets.push(self.workdir.join(rel));
        }
        for t in targets {
            std::fs::write(&t, contents).map_err(|source| HarnessError::Write {
                path: t.display().to_string(),
                source,
            })?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let _ = std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o666));
            }
        }
        Ok(())
    }

    /// A file in the working directory (what the command sees as `./rel`).
    pub fn work_file(&self, rel: &str) -> PathBuf {
        self.workdir.join(rel)
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub argv: Vec<OsString>,
    /// Extra environment on top of `PATH`.
    pub env: Vec<(OsString, OsString)>,
    pub stdin: Option<Vec<u8>>,
    /// A host file or directory opened as the command's stdin (instead of `stdin`).
    pub stdin_path: Option<PathBuf>,
    pub timeout: Option<Duration>,
    pub grace: Duration,
    pub options: BackendOptions,
    /// Launch with [`LaunchContext::hold_start`]: the caller releases (or aborts) the command.
    pub held: bool,
    /// The egress proxy's socket handed to the backend ([`LaunchSpec::egress_proxy`]).
    pub egress_proxy: Option<PathBuf>,
}

impl Invocation {
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Self {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            stdin: None,
            stdin_path: None,
            timeout: Some(Duration::from_secs(60)),
            grace: Duration::from_millis(500),
            options: BackendOptions::new(),
            held: false,
            egress_proxy: None,
        }
    }

    /// `sh -c SCRIPT sh ARGS…`
    pub fn sh(script: &str) -> Self {
        Self::new(["sh", "-c", script])
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn stdin(mut self, bytes: &[u8]) -> Self {
        self.stdin = Some(bytes.to_vec());
        self
    }

    /// Open `path` (a file or a directory of the host) as the command's stdin.
    pub fn stdin_from(mut self, path: &Path) -> Self {
        self.stdin_path = Some(path.to_path_buf());
        self
    }

    pub fn timeout(mut self, t: Option<Duration>) -> Self {
        self.timeout = t;
        self
    }

    pub fn options(mut self, o: &BackendOptions) -> Self {
        self.options = o.clone();
        self
    }

    /// Launched held: nothing of the command may run before `release()`.
    pub fn held(mut self) -> Self {
        self.held = true;
        self
    }
}

/// The environment every suite command gets: the host `PATH` (so `sh`, `cat` resolve) and the
/// invocation's own variables. Nothing else of the host's environment is handed over.
pub fn base_env(extra: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    let mut env = vec![(OsString::from("PATH"), path)];
    env.extend(extra.iter().cloned());
    env
}

pub fn spec_for(scratch: &Scratch, inv: &Invocation, run_id: &str) -> LaunchSpec {
    LaunchSpec {
        run_id: run_id.to_string(),
        root: scratch.root.clone(),
        workdir: scratch.workdir.clone(),
        capsule_dir: scratch.capsule.clone(),
        argv: inv.argv.clone(),
        env: base_env(&inv.env),
        env_plan: Default::default(),
        timeout: inv.timeout,
        grace: inv.grace,
        poll_interval: Duration::from_millis(50),
        observe_ports: false,
        options: inv.options.clone(),
        deny_patterns: Vec::new(),
        git_dirs: Vec::new(),
        egress_proxy: inv.egress_proxy.clone(),
    }
}

/// Where a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum Stage {
    #[error("prepare failed: {0}")]
    Prepare(#[source] BackendError),
    #[error("launch failed: scratch: {0}")]
    Scratch(#[source] std::io::Error),
    #[error("launch failed: {0}")]
    Launch(#[source] BackendError),
    #[error("wait failed: {0}")]
    Wait(#[source] BackendError),
}

/// A finished run.
#[derive(Debug)]
pub struct Ran {
    pub prepared: PreparedLaunch,
    pub evidence: RunEvidence,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub pid: Option<u32>,
    pub elapsed: Duration,
}

impl Ran {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
    /// Exit facts for diagnostics.
    pub fn exit_details(&self) -> serde_json::Value {
        serde_json::json!({
            "exit": self.evidence.exit,
            "failure": self.evidence.failure,
            "stderr": excerpt(&self.stderr),
        })
    }
}

/// The first bytes of an output, lossily decoded, for diagnostics.
pub fn excerpt(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(600)];
    String::from_utf8_lossy(cut).into_owned()
}

/// A launched command and the files its output goes to.
pub struct Started {
    pub prepared: PreparedLaunch,
    pub running: Box<dyn RunningCommand>,
    stdout: PathBuf,
    stderr: PathBuf,
    started: Instant,
}

impl Started {
    pub async fn finish(self) -> Result<Ran, Stage> {
        let pid = self.running.pid();
        let evidence = self.running.wait().await.map_err(Stage::Wait)?;
        Ok(Ran {
            prepared: self.prepared,
            evidence,
            stdout: std::fs::read(&self.stdout).unwrap_or_default(),
            stderr: std::fs::read(&self.stderr).unwrap_or_default(),
            pid,
            elapsed: self.started.elapsed(),
        })
    }
}

/// Prepare and launch; the caller waits (so it can look at the host while the command runs).
pub async fn start(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    inv: &Invocation,
) -> Result<Started, Stage> {
    let io_dir = scratch
        .outside
        .join(format!("io-{}", crate::host::random_token()));
    std::fs::create_dir_all(&io_dir).map_err(Stage::Scratch)?;
    let stdout = io_dir.join("stdout");
    let stderr = io_dir.join("stderr");
    let stdin = match &inv.stdin {
        _ if inv.stdin_path.is_some() => inv.stdin_path.clone(),
        Some(bytes) => {
            let p = io_dir.join("stdin");
            std::fs::write(&p, bytes).map_err(Stage::Scratch)?;
            Some(p)
        }
        None => None,
    };
    let spec = spec_for(
        scratch,
        inv,
        &format!("conformance-{}", crate::host::random_token()),
    );
    let prepared = backend.prepare(&spec).map_err(Stage::Prepare)?;
    let mut ctx = LaunchContext::new(StdioMode::Files {
        stdin,
        stdout: stdout.clone(),
        stderr: stderr.clone(),
    });
    ctx.hold_start = inv.held;
    let started = Instant::now();
    let running = backend
        .launch(prepared.clone(), ctx)
        .await
        .map_err(Stage::Launch)?;
    Ok(Started {
        prepared,
        running,
        stdout,
        stderr,
        started,
    })
}

/// Prepare, launch and wait.
pub async fn run(
    backend: &dyn DynRuntimeBackend,
    scratch: &Scratch,
    inv: &Invocation,
) -> Result<Ran, Stage> {
    start(backend, scratch, inv).await?.finish().await
}

/// Split NUL-terminated records.
pub fn split_nul(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = bytes.split(|b| *b == 0).map(<[u8]>::to_vec).collect();
    // A trailing NUL leaves one empty tail that is not a record.
    if out.last().is_some_and(Vec::is_empty) {
        out.pop();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_records_keep_empty_arguments() {
        assert_eq!(
            split_nul(b"a b\0\0-n\0"),
            vec![b"a b".to_vec(), b"".to_vec(), b"-n".to_vec()]
        );
        assert!(split_nul(b"").is_empty());
    }

    #[test]
    fn private_scratch_separates_root_and_workdir() {
        let s = Scratch::new(None, WorkspaceMode::Private).unwrap();
        assert_ne!(s.root, s.workdir);
        s.seed_file("a.txt", b"x").unwrap();
        assert_eq!(std::fs::read(s.root.join("a.txt")).unwrap(), b"x");
        assert_eq!(std::fs::read(s.workdir.join("a.txt")).unwrap(), b"x");
        let s2 = Scratch::new(None, WorkspaceMode::InPlace).unwrap();
        assert_eq!(s2.root, s2.workdir);
        assert!(!s2.outside.starts_with(&s2.root));
    }
}
