//! The generic fake wrapper: a POSIX `sh` script standing in for a third party's sandbox or
//! launcher. It records exactly what it received (argv with NUL separators, its environment from
//! `/proc/self/environ`) and then runs, refuses or misbehaves as asked, so a backend's tests can
//! check argv boundaries, labels and exit-code propagation exactly, and the suite can be shown to
//! catch each misbehaviour.
//!
//! Calling convention: `WRAPPER [ANY FLAGS…] -- COMMAND [ARGS…]`. Everything before the first
//! `--` is the wrapper's own; without `--` it refuses with exit 125 (usage).
//!
//! The behaviour is read on every call from `behaviour` in the wrapper's directory, so a test can
//! switch it without reinstalling.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum FakeWrapperError {
    #[error("could not install the fake wrapper in {dir}: {source}")]
    Install { dir: String, source: std::io::Error },
    #[error("could not read the fake wrapper's records in {dir}: {source}")]
    Records { dir: String, source: std::io::Error },
    #[cfg(unix)]
    #[error("could not install the fake wrapper: {0}")]
    Script(#[from] agentdiff_host::program_file::ProgramFileError),
}

/// What the fake wrapper does after recording its invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// `exec` the command.
    Run,
    /// Print a refusal and exit 125 without running anything.
    Refuse,
    /// Exit 71 as if its own setup failed (bad settings), without running anything.
    FailSetup,
    /// Drop the command's last argument, then run it.
    DropLastArgument,
    /// Run the command and exit 0 whatever it returned.
    SwallowExitCode,
    /// Announce a sandbox on stderr, then run the command with no confinement at all.
    PretendSandbox,
    /// Whatever its arguments, fail as a namespace sandbox does when the kernel refuses it user
    /// namespaces (`setting up uid map: Permission denied`, exit 1), without running anything.
    NamespacesRefused,
}

impl Behaviour {
    pub fn as_str(self) -> &'static str {
        match self {
            Behaviour::Run => "run",
            Behaviour::Refuse => "refuse",
            Behaviour::FailSetup => "fail-setup",
            Behaviour::DropLastArgument => "drop-last-argument",
            Behaviour::SwallowExitCode => "swallow-exit-code",
            Behaviour::PretendSandbox => "pretend-sandbox",
            Behaviour::NamespacesRefused => "namespaces-refused",
        }
    }
}

/// Exit code of a refusal (usage error or `Refuse`).
pub const REFUSE_EXIT: i32 = 125;
/// Exit code of `FailSetup`.
pub const SETUP_FAILED_EXIT: i32 = 71;

const SCRIPT: &str = r#"#!/bin/sh
# Generic fake wrapper: records its invocation, then behaves as configured.
here=$(dirname "$0")
rec="$here/records/$$"
mkdir -p "$here/records" 2>/dev/null
for a in "$0" "$@"; do printf '%s\0' "$a"; done > "$rec.argv.tmp" && mv "$rec.argv.tmp" "$rec.argv"
cat /proc/$$/environ > "$rec.env" 2>/dev/null
behaviour=$(cat "$here/behaviour" 2>/dev/null || echo run)
if [ "$behaviour" = namespaces-refused ]; then
  echo "fake-wrapper: setting up uid map: Permission denied" >&2; exit 1
fi
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then shift; break; fi
  case "$1" in
    -*) shift ;;
    *) echo "fake-wrapper: expected -- before the command" >&2; exit 125 ;;
  esac
done
case "$behaviour" in
  refuse) echo "fake-wrapper: refusing to run the command" >&2; exit 125 ;;
  fail-setup) echo "fake-wrapper: setup failed" >&2; exit 71 ;;
  drop-last-argument)
    n=$#; i=0
    for a do
      i=$((i+1))
      if [ "$i" -eq 1 ]; then set --; fi
      if [ "$i" -lt "$n" ]; then set -- "$@" "$a"; fi
    done
    exec "$@" ;;
  swallow-exit-code) "$@"; exit 0 ;;
  pretend-sandbox) echo "fake-wrapper: sandbox enabled" >&2; exec "$@" ;;
  *) exec "$@" ;;
esac
"#;

/// One recorded invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The wrapper's own pid.
    pub pid: u32,
    /// argv as received, program first.
    pub argv: Vec<OsString>,
    /// The environment as received.
    pub env: Vec<(OsString, OsString)>,
}

impl Recorded {
    /// Arguments after the first `--`: the wrapped command as the wrapper received it.
    pub fn command(&self) -> Vec<OsString> {
        match self.argv.iter().position(|a| a == "--") {
            Some(i) => self.argv[i + 1..].to_vec(),
            None => Vec::new(),
        }
    }
}

/// An installed fake wrapper.
#[derive(Debug, Clone)]
pub struct FakeWrapper {
    dir: PathBuf,
    path: PathBuf,
}

impl FakeWrapper {
    /// Write the wrapper as `dir/name` (mode 0755) with the given behaviour.
    pub fn install(dir: &Path, name: &str, behaviour: Behaviour) -> Result<Self, FakeWrapperError> {
        let err = |source| FakeWrapperError::Install {
            dir: dir.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(err)?;
        let path = dir.join(name);
        // Written so that it can be executed at once while other threads fork (ETXTBSY).
        #[cfg(unix)]
        agentdiff_host::program_file::write(&path, SCRIPT.as_bytes(), 0o755)?;
        #[cfg(not(unix))]
        std::fs::write(&path, SCRIPT).map_err(err)?;
        let w = Self {
            dir: dir.to_path_buf(),
            path,
        };
        w.set_behaviour(behaviour)?;
        Ok(w)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn set_behaviour(&self, behaviour: Behaviour) -> Result<(), FakeWrapperError> {
        std::fs::write(self.dir.join("behaviour"), behaviour.as_str()).map_err(|source| {
            FakeWrapperError::Install {
                dir: self.dir.display().to_string(),
                source,
            }
        })
    }

    /// Every invocation recorded so far, oldest first.
    pub fn invocations(&self) -> Result<Vec<Recorded>, FakeWrapperError> {
        let dir = self.dir.join("records");
        let err = |source| FakeWrapperError::Records {
            dir: dir.display().to_string(),
            source,
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(err(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(err)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_suffix(".argv")
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let modified = entry.metadata().and_then(|m| m.modified()).map_err(err)?;
            let argv = crate::harness::split_nul(&std::fs::read(entry.path()).map_err(err)?)
                .into_iter()
                .map(bytes_to_os)
                .collect();
            let env = std::fs::read(dir.join(format!("{pid}.env")))
                .map(|b| {
                    crate::harness::split_nul(&b)
                        .into_iter()
                        .filter_map(|kv| {
                            let i = kv.iter().position(|b| *b == b'=')?;
                            Some((
                                bytes_to_os(kv[..i].to_vec()),
                                bytes_to_os(kv[i + 1..].to_vec()),
                            ))
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push((modified, Recorded { pid, argv, env }));
        }
        out.sort_by_key(|a| a.0);
        Ok(out.into_iter().map(|(_, r)| r).collect())
    }

    /// Forget recorded invocations.
    pub fn clear(&self) -> Result<(), FakeWrapperError> {
        match std::fs::remove_dir_all(self.dir.join("records")) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(FakeWrapperError::Records {
                dir: self.dir.display().to_string(),
                source,
            }),
        }
    }
}

#[cfg(unix)]
fn bytes_to_os(b: Vec<u8>) -> OsString {
    use std::os::unix::ffi::OsStringExt;
    OsString::from_vec(b)
}

#[cfg(not(unix))]
fn bytes_to_os(b: Vec<u8>) -> OsString {
    OsString::from(String::from_utf8_lossy(&b).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// Runs the wrapper (`install` returned once it was no longer "text file busy").
    fn call(w: &FakeWrapper, args: &[&str]) -> std::process::Output {
        Command::new(w.path())
            .args(args)
            .env("FAKE_SEEN", "yes")
            .output()
            .unwrap()
    }

    #[test]
    fn records_exact_argv_and_env_then_runs() {
        let dir = tempfile::tempdir().unwrap();
        let w = FakeWrapper::install(dir.path(), "wrap", Behaviour::Run).unwrap();
        let out = call(
            &w,
            &["--flag", "--", "printf", "%s|", "a b", "", "-n", "x\ny"],
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a b||-n|x\ny|");
        let rec = w.invocations().unwrap();
        assert_eq!(rec.len(), 1);
        assert_eq!(
            rec[0].command(),
            ["printf", "%s|", "a b", "", "-n", "x\ny"]
                .map(OsString::from)
                .to_vec()
        );
        assert!(rec[0].env.contains(&("FAKE_SEEN".into(), "yes".into())));
    }

    #[test]
    fn misbehaviours_do_what_they_say() {
        let dir = tempfile::tempdir().unwrap();
        let w = FakeWrapper::install(dir.path(), "wrap", Behaviour::Refuse).unwrap();
        let marker = dir.path().join("ran");
        let touch = ["--", "touch", marker.to_str().unwrap()];
        let out = call(&w, &touch);
        assert_eq!(out.status.code(), Some(REFUSE_EXIT));
        assert!(!marker.exists());
        w.set_behaviour(Behaviour::FailSetup).unwrap();
        assert_eq!(call(&w, &touch).status.code(), Some(SETUP_FAILED_EXIT));
        assert!(!marker.exists());
        // No `--`: usage refusal.
        assert_eq!(call(&w, &["touch", "x"]).status.code(), Some(REFUSE_EXIT));
        w.set_behaviour(Behaviour::SwallowExitCode).unwrap();
        assert_eq!(
            call(&w, &["--", "sh", "-c", "exit 42"]).status.code(),
            Some(0)
        );
        w.set_behaviour(Behaviour::DropLastArgument).unwrap();
        let out = call(&w, &["--", "printf", "%s|", "a", "b"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "a|");
        w.set_behaviour(Behaviour::PretendSandbox).unwrap();
        let out = call(&w, &["--", "sh", "-c", "exit 3"]);
        assert_eq!(out.status.code(), Some(3));
        assert!(String::from_utf8_lossy(&out.stderr).contains("sandbox enabled"));
        // A namespace refusal does not depend on the arguments (bwrap's have no `--` first).
        w.set_behaviour(Behaviour::NamespacesRefused).unwrap();
        let out = call(
            &w,
            &[
                "--ro-bind",
                "/",
                "/",
                "--",
                "touch",
                marker.to_str().unwrap(),
            ],
        );
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stderr).contains("uid map: Permission denied"));
        assert!(!marker.exists());
    }
}
