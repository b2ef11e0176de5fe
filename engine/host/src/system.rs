//! Host checks shared by wrapping backends, done without starting anything: resolving an
//! executable on PATH, and the kernel switches that turn user namespaces off.

use std::ffi::{OsStr, OsString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Why an executable (a wrapper, the exec shim) cannot be used.
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
    /// What to do about it: `install` says how to get the program when it is missing;
    /// `option` names the flag or option that points at it.
    pub fn remedy(&self, install: &str, option: &str) -> String {
        match self {
            ExecutableError::NotOnPath { .. } | ExecutableError::Missing { .. } => {
                install.to_string()
            }
            ExecutableError::NotAFile { path } | ExecutableError::NotExecutable { path } => {
                format!(
                    "point {option} at the program itself, or make {} executable (chmod +x)",
                    path.display()
                )
            }
            ExecutableError::Unreadable { .. } => {
                "check the permissions of the path and its parent directories".to_string()
            }
        }
    }
}

/// A path from an option, absolute against agentdiff's own working directory (where the user
/// typed it), not the command's.
pub fn absolute_from_cwd(p: &str) -> PathBuf {
    let path = PathBuf::from(p);
    if path.is_absolute() {
        path
    } else {
        std::env::current_dir()
            .map(|d| d.join(&path))
            .unwrap_or(path)
    }
}

/// `path` with every symlink resolved, as [`Path::canonicalize`] gives it, or the error that
/// says nothing is there. A `stat` comes first: canonicalizing reads every component's link
/// (one `readlink` each), and most of the locations a backend asks about (credential
/// directories, engine sockets) do not exist. The answer is the same either way, since a path
/// that cannot be `stat`ed cannot be canonicalized.
pub fn canonical_if_present(path: &Path) -> std::io::Result<PathBuf> {
    std::fs::metadata(path)?;
    path.canonicalize()
}

/// The PATH a wrapper is looked up on: the one in the command's environment, else agentdiff's own.
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

pub fn check_executable(path: &Path) -> Result<(), ExecutableError> {
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
        // Not a refusal: bwrap may have its own AppArmor profile. A probe decides.
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

/// Directory names excluded by default at any depth, because they are regenerated by tools and can
/// be huge: VCS metadata (`.git`), dependency trees (`node_modules`, `.venv`, `venv`), build output
/// (`target`, `build`, `dist`, `.next`, `.gradle`) and caches (`__pycache__`, `.mypy_cache`,
/// `.pytest_cache`, `.ruff_cache`, `.tox`, `.cache`).
///
/// Only directories are excluded (a regular file named `build` is scanned). A default-excluded
/// directory is scanned after all when a deny glob of the policy names it through its literal
/// leading segments (`.git/**`, `.git/config`, `node_modules/evil/**`, `pkg/build/out.bin`); see
/// `agentdiff_scan::ScanOptions::reinclude`. A glob that starts with a wildcard
/// (`**/*.key`, `*/target/x`) re-includes nothing: honouring it would mean scanning every
/// `node_modules` and `target` in the tree, which is what the default exclusion exists to avoid.
pub const DEFAULT_EXCLUDED_DIRS: &[&str] = &[
    ".git",
    "node_modules",
    "target",
    "build",
    "dist",
    ".venv",
    "venv",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".gradle",
    ".next",
    ".cache",
];

/// Why `canonical` (a path without symlinks) could be changed by someone other than `owners`:
/// the file or a directory above it is owned by another user, or is writable by group or
/// others (a sticky directory, like `/tmp`, only lets each owner replace its own entries, so it
/// is accepted). `None` when only `owners` can change it. bwrap's own executable must be root's
/// (`&[0]`); a plugin may be its user's or root's.
pub fn untrusted_component(canonical: &Path, owners: &[u32]) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    for p in canonical.ancestors() {
        let meta = match std::fs::symlink_metadata(p) {
            Ok(m) => m,
            Err(e) => return Some(format!("{}: {e}", p.display())),
        };
        let sticky_dir = meta.is_dir() && meta.mode() & 0o1000 != 0;
        if !owners.contains(&meta.uid()) {
            return Some(format!(
                "{} is owned by uid {}, not {}",
                p.display(),
                meta.uid(),
                if owners == [0] {
                    "root"
                } else {
                    "the trusted owner"
                }
            ));
        }
        if meta.mode() & 0o022 != 0 && !sticky_dir {
            return Some(format!(
                "{} is writable by group or others (mode {:o})",
                p.display(),
                meta.mode() & 0o7777
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_if_present_answers_as_canonicalize_does() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        std::os::unix::fs::symlink(base.join("gone"), base.join("dangling")).unwrap();
        for rel in [
            "real",
            "link",
            "link/.",
            "dangling",
            "absent",
            "link/absent",
            "real/../real",
        ] {
            let p = base.join(rel);
            let (ours, std) = (canonical_if_present(&p).ok(), p.canonicalize().ok());
            assert_eq!(ours, std, "{rel}");
        }
        assert_eq!(
            canonical_if_present(&base.join("link")).unwrap(),
            base.join("real")
        );
    }

    fn write_exec(dir: &Path, name: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        agentdiff_test_support::write_executable(&p, "#!/bin/sh\nexit 0\n", mode);
        p
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
    fn resolves_on_the_given_path_and_checks_the_mode() {
        let dir = tempfile::tempdir().unwrap();
        let tool = write_exec(dir.path(), "tool", 0o755);
        let path = dir.path().as_os_str().to_os_string();
        assert_eq!(
            resolve_executable(OsStr::new("tool"), Some(&path), dir.path()).unwrap(),
            tool
        );
        let err = resolve_executable(OsStr::new("tool-nope"), Some(&path), dir.path()).unwrap_err();
        assert!(matches!(err, ExecutableError::NotOnPath { .. }));
        let plain = write_exec(dir.path(), "plain", 0o644);
        assert!(matches!(
            resolve_executable(plain.as_os_str(), None, dir.path()),
            Err(ExecutableError::NotExecutable { .. })
        ));
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
        assert!(u.detail.contains("max_user_namespaces"));
        assert!(u.remedy.unwrap().contains("sysctl"));
    }
}
