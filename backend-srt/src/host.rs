//! What srt needs on this host, checked without starting anything: the srt executable itself,
//! and on Linux bubblewrap, socat, ripgrep and usable user namespaces.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// How to install srt and its Linux prerequisites (Debian/Ubuntu names).
pub const INSTALL_SRT: &str = "install it with `npm install -g @anthropic-ai/sandbox-runtime` \
     (Node.js 18 or later), or name it with --srt-executable PATH";

/// Why the srt executable cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecutableError {
    #[error("`{name}` was not found on PATH")]
    NotOnPath { name: String },
    #[error("{path} does not exist")]
    Missing { path: PathBuf },
    #[error("{path} is not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path} is not executable")]
    NotExecutable { path: PathBuf },
    #[error("{path} cannot be inspected: {message}")]
    Unreadable { path: PathBuf, message: String },
}

impl ExecutableError {
    /// What to do about it.
    pub fn remedy(&self) -> String {
        match self {
            ExecutableError::NotOnPath { .. } | ExecutableError::Missing { .. } => {
                INSTALL_SRT.to_string()
            }
            ExecutableError::NotAFile { path } | ExecutableError::NotExecutable { path } => {
                format!(
                    "point --srt-executable at the srt program itself, or make {} executable \
                     (chmod +x)",
                    path.display()
                )
            }
            ExecutableError::Unreadable { .. } => {
                "check the permissions of the path and its parent directories".to_string()
            }
        }
    }
}

/// The PATH srt will run with: the one in the command's environment, else agentdiff's own.
pub fn search_path(env: &[(OsString, OsString)]) -> Option<OsString> {
    env.iter()
        .rev()
        .find(|(k, _)| k.as_os_str() == OsStr::new("PATH"))
        .map(|(_, v)| v.clone())
        .or_else(|| std::env::var_os("PATH"))
}

/// Find `program` (a bare name looked up on `path`, or a path) and check that it is an
/// executable regular file. Symlinks are followed (npm installs srt as a link to its script).
pub fn resolve_executable(
    program: &OsStr,
    path: Option<&OsStr>,
    cwd: &Path,
) -> Result<PathBuf, ExecutableError> {
    let as_path = Path::new(program);
    let candidate = if as_path.components().count() > 1 || as_path.is_absolute() {
        if as_path.is_absolute() {
            as_path.to_path_buf()
        } else {
            cwd.join(as_path)
        }
    } else {
        let name = program.to_string_lossy().into_owned();
        which::which_in(program, path, cwd).map_err(|_| ExecutableError::NotOnPath { name })?
    };
    check_executable(&candidate)?;
    Ok(candidate)
}

fn check_executable(path: &Path) -> Result<(), ExecutableError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ExecutableError::Missing {
                path: path.to_path_buf(),
            })
        }
        Err(e) => {
            return Err(ExecutableError::Unreadable {
                path: path.to_path_buf(),
                message: e.to_string(),
            })
        }
    };
    if !meta.is_file() {
        return Err(ExecutableError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    if meta.permissions().mode() & 0o111 == 0 {
        return Err(ExecutableError::NotExecutable {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// One program srt needs on Linux.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Prerequisite {
    /// Package-level name (`bubblewrap`).
    pub name: &'static str,
    /// Program looked up on PATH (`bwrap`).
    pub program: &'static str,
    pub path: Option<PathBuf>,
    /// Debian/Ubuntu package to install when it is missing.
    pub package: &'static str,
}

impl Prerequisite {
    pub fn found(&self) -> bool {
        self.path.is_some()
    }
}

/// The programs srt uses on Linux: bubblewrap for the namespaces and mounts, socat for the
/// network bridge, ripgrep for the mandatory-deny scan.
pub const LINUX_PROGRAMS: [(&str, &str, &str); 3] = [
    ("bubblewrap", "bwrap", "bubblewrap"),
    ("socat", "socat", "socat"),
    ("ripgrep", "rg", "ripgrep"),
];

/// Look each Linux prerequisite up on `path`.
pub fn linux_prerequisites(path: Option<&OsStr>, cwd: &Path) -> Vec<Prerequisite> {
    LINUX_PROGRAMS
        .iter()
        .map(|(name, program, package)| Prerequisite {
            name,
            program,
            path: which::which_in(program, path, cwd)
                .ok()
                .filter(|p| check_executable(p).is_ok()),
            package,
        })
        .collect()
}

/// Whether user namespaces can be created, from the kernel's switches (no process started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UserNamespaces {
    /// `false` only when a switch says they are off for this user.
    pub allowed: bool,
    pub detail: String,
    pub remedy: Option<String>,
}

/// Read the sysctls that switch user namespaces off. `proc_sys` is `/proc/sys` (a parameter so
/// tests can point it at a fake tree).
pub fn user_namespaces(proc_sys: &Path, euid: u32) -> UserNamespaces {
    let read = |rel: &str| -> Option<i64> {
        std::fs::read_to_string(proc_sys.join(rel))
            .ok()
            .and_then(|s| s.trim().parse().ok())
    };
    if read("user/max_user_namespaces") == Some(0) {
        return UserNamespaces {
            allowed: false,
            detail: "user namespaces are disabled (user.max_user_namespaces = 0)".into(),
            remedy: Some("enable them: `sysctl -w user.max_user_namespaces=15000`".into()),
        };
    }
    if euid != 0 && read("kernel/unprivileged_userns_clone") == Some(0) {
        return UserNamespaces {
            allowed: false,
            detail: "unprivileged user namespaces are disabled \
                     (kernel.unprivileged_userns_clone = 0)"
                .into(),
            remedy: Some("enable them: `sysctl -w kernel.unprivileged_userns_clone=1`".into()),
        };
    }
    let mut detail = "no kernel switch disables user namespaces".to_string();
    if euid != 0 && read("kernel/apparmor_restrict_unprivileged_userns") == Some(1) {
        // Not a refusal: bwrap may have its own AppArmor profile. The doctor probe decides.
        detail.push_str(
            "; AppArmor restricts unprivileged user namespaces \
             (kernel.apparmor_restrict_unprivileged_userns = 1), bwrap needs a profile",
        );
    }
    UserNamespaces {
        allowed: true,
        detail,
        remedy: None,
    }
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// What is missing for srt on this host, as (reason, remedy), or `None` when nothing is.
pub fn missing_linux_prerequisites(
    prerequisites: &[Prerequisite],
    userns: &UserNamespaces,
) -> Option<(String, String)> {
    let missing: Vec<&Prerequisite> = prerequisites.iter().filter(|p| !p.found()).collect();
    let mut reasons = Vec::new();
    let mut remedies = Vec::new();
    if !missing.is_empty() {
        reasons.push(format!(
            "srt's Linux prerequisites are missing: {}",
            missing
                .iter()
                .map(|p| format!("{} (`{}` not on PATH)", p.name, p.program))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        remedies.push(format!(
            "install them: `apt-get install -y {}`",
            missing
                .iter()
                .map(|p| p.package)
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    if !userns.allowed {
        reasons.push(userns.detail.clone());
        if let Some(r) = &userns.remedy {
            remedies.push(r.clone());
        }
    }
    if reasons.is_empty() {
        None
    } else {
        Some((reasons.join("; "), remedies.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_exec(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn resolves_on_the_given_path_and_checks_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let srt = write_exec(dir.path(), "srt", 0o755);
        let path = dir.path().as_os_str().to_os_string();
        assert_eq!(
            resolve_executable(OsStr::new("srt"), Some(&path), dir.path()).unwrap(),
            srt
        );
        assert_eq!(
            resolve_executable(srt.as_os_str(), None, Path::new("/")).unwrap(),
            srt
        );
        let err = resolve_executable(OsStr::new("srt-nope"), Some(&path), dir.path()).unwrap_err();
        assert!(matches!(err, ExecutableError::NotOnPath { .. }));
        assert!(err
            .remedy()
            .contains("npm install -g @anthropic-ai/sandbox-runtime"));
    }

    #[test]
    fn refuses_missing_directory_and_non_executable_paths() {
        let dir = tempfile::tempdir().unwrap();
        let plain = write_exec(dir.path(), "plain", 0o644);
        assert!(matches!(
            resolve_executable(plain.as_os_str(), None, dir.path()),
            Err(ExecutableError::NotExecutable { .. })
        ));
        assert!(matches!(
            resolve_executable(dir.path().as_os_str(), None, dir.path()),
            Err(ExecutableError::NotAFile { .. })
        ));
        let gone = dir.path().join("gone");
        assert!(matches!(
            resolve_executable(gone.as_os_str(), None, dir.path()),
            Err(ExecutableError::Missing { .. })
        ));
        // A relative path is taken relative to the working directory, not looked up on PATH.
        assert_eq!(
            resolve_executable(OsStr::new("./plain"), None, dir.path()).unwrap_err(),
            ExecutableError::NotExecutable {
                path: dir.path().join("./plain")
            }
        );
    }

    #[test]
    fn missing_prerequisites_are_named_with_their_packages() {
        let dir = tempfile::tempdir().unwrap();
        write_exec(dir.path(), "bwrap", 0o755);
        let path = dir.path().as_os_str().to_os_string();
        let prereqs = linux_prerequisites(Some(&path), dir.path());
        assert_eq!(prereqs.len(), 3);
        assert!(prereqs[0].found());
        let ok = UserNamespaces {
            allowed: true,
            detail: String::new(),
            remedy: None,
        };
        let (reason, remedy) = missing_linux_prerequisites(&prereqs, &ok).unwrap();
        assert!(
            reason.contains("socat") && reason.contains("ripgrep"),
            "{reason}"
        );
        assert!(!reason.contains("bubblewrap"), "{reason}");
        assert_eq!(remedy, "install them: `apt-get install -y socat ripgrep`");
        write_exec(dir.path(), "socat", 0o755);
        write_exec(dir.path(), "rg", 0o755);
        let prereqs = linux_prerequisites(Some(&path), dir.path());
        assert_eq!(missing_linux_prerequisites(&prereqs, &ok), None);
    }

    #[test]
    fn user_namespace_switches_are_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("user")).unwrap();
        std::fs::create_dir_all(dir.path().join("kernel")).unwrap();
        assert!(user_namespaces(dir.path(), 1000).allowed);
        std::fs::write(dir.path().join("kernel/unprivileged_userns_clone"), "0\n").unwrap();
        let u = user_namespaces(dir.path(), 1000);
        assert!(!u.allowed);
        assert!(u.remedy.unwrap().contains("unprivileged_userns_clone=1"));
        // root is not subject to that switch
        assert!(user_namespaces(dir.path(), 0).allowed);
        std::fs::write(dir.path().join("user/max_user_namespaces"), "0\n").unwrap();
        let u = user_namespaces(dir.path(), 0);
        assert!(!u.allowed);
        let (reason, remedy) = missing_linux_prerequisites(&[], &u).unwrap();
        assert!(reason.contains("max_user_namespaces"));
        assert!(remedy.contains("sysctl"));
    }
}
