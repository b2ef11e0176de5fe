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
        find_program(program, path, cwd).ok_or_else(|| ExecutableError::NotOnPath {
            name: program.to_string_lossy().into_owned(),
        })?
    };
    check_executable(&candidate)?;
    Ok(candidate)
}

/// Find `program` as a shell's command search does: a name with a `/` is a path (a relative one
/// under `cwd`); a bare name is looked for in each entry of the colon-separated `path` in order,
/// an empty entry meaning `cwd`, a relative entry a directory under `cwd`, and a leading `~` the
/// home directory. The first candidate that is a regular file (after symlinks) this process may
/// execute (`access(X_OK)`) is the answer, as the path it was found at (a symlink is not
/// resolved). `None` when nothing qualifies or there is no `path`.
pub fn find_program(program: &OsStr, path: Option<&OsStr>, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if program.as_bytes().contains(&b'/') {
        let candidate = cwd.join(program);
        return may_execute(&candidate).then_some(candidate);
    }
    if program.is_empty() {
        return None;
    }
    std::env::split_paths(path?)
        .map(|dir| cwd.join(expand_tilde(&dir, home_dir)).join(program))
        .find(|candidate| may_execute(candidate))
}

/// `dir` with a first component `~` replaced by `home()` (nothing when there is no home); `~user`
/// and a `~` further in are left alone, as shells leave them.
fn expand_tilde(dir: &Path, home: impl FnOnce() -> Option<PathBuf>) -> PathBuf {
    let mut components = dir.components();
    match components.next() {
        Some(std::path::Component::Normal(first)) if first == "~" => {
            let mut expanded = home().unwrap_or_default();
            expanded.extend(components);
            expanded
        }
        _ => dir.to_path_buf(),
    }
}

/// The home directory `~` stands for: `$HOME` when it is absolute (what shells and Claude
/// Code's `os.homedir()` read), else the user database's entry for this process's user.
pub fn home_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute())
        .or_else(|| user_home(nix::unistd::getuid()))
}

/// The home directory the user database gives the process's effective user (the one whose
/// files it reads), whatever `$HOME` says.
pub fn effective_user_home() -> Option<PathBuf> {
    user_home(nix::unistd::geteuid())
}

fn user_home(uid: nix::unistd::Uid) -> Option<PathBuf> {
    nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.dir)
        .filter(|d| d.is_absolute())
}

/// A regular file, symlinks followed, that this process's real user may execute.
fn may_execute(candidate: &Path) -> bool {
    std::fs::metadata(candidate).is_ok_and(|m| m.is_file())
        && nix::unistd::access(candidate, nix::unistd::AccessFlags::X_OK).is_ok()
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
    fn find_program_answers_none_when_nothing_qualifies() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let path = std::env::join_paths([&a, &b]).unwrap();
        let find = |name: &str, path: Option<&OsStr>| find_program(OsStr::new(name), path, &a);
        assert_eq!(find("tool", Some(&path)), None);
        write_exec(&b, "tool", 0o755);
        assert_eq!(find("tool", None), None, "no PATH, no search");
        assert_eq!(find("", Some(&path)), None);
        assert_eq!(find("tool", Some(OsStr::new("/nonexistent"))), None);
        assert_eq!(find("tool", Some(&path)), Some(b.join("tool")));
    }

    #[test]
    fn find_program_skips_what_is_not_an_executable_file() {
        let dir = tempfile::tempdir().unwrap();
        let [plain, directory, link_to_plain, dangling, good] =
            ["plain", "directory", "link-to-plain", "dangling", "good"].map(|d| {
                let p = dir.path().join(d);
                std::fs::create_dir(&p).unwrap();
                p
            });
        write_exec(&plain, "tool", 0o644);
        std::fs::create_dir(directory.join("tool")).unwrap();
        std::os::unix::fs::symlink(plain.join("tool"), link_to_plain.join("tool")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("gone"), dangling.join("tool")).unwrap();
        write_exec(&good, "tool", 0o700);
        let path =
            std::env::join_paths([&plain, &directory, &link_to_plain, &dangling, &good]).unwrap();
        assert_eq!(
            find_program(OsStr::new("tool"), Some(&path), dir.path()),
            Some(good.join("tool"))
        );
    }

    #[test]
    fn find_program_takes_a_symlink_to_an_executable_as_found() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, lib) = (dir.path().join("bin"), dir.path().join("lib"));
        std::fs::create_dir(&bin).unwrap();
        std::fs::create_dir(&lib).unwrap();
        write_exec(&lib, "cli.js", 0o755);
        std::os::unix::fs::symlink("../lib/cli.js", bin.join("tool")).unwrap();
        assert_eq!(
            find_program(OsStr::new("tool"), Some(bin.as_os_str()), dir.path()),
            Some(bin.join("tool"))
        );
    }

    #[test]
    fn find_program_resolves_relative_and_empty_entries_against_cwd() {
        let dir = tempfile::tempdir().unwrap();
        let cwd = dir.path();
        std::fs::create_dir_all(cwd.join("node_modules/.bin")).unwrap();
        write_exec(&cwd.join("node_modules/.bin"), "local", 0o755);
        write_exec(cwd, "here", 0o755);
        let find =
            |name: &str, path: &str| find_program(OsStr::new(name), Some(OsStr::new(path)), cwd);
        assert_eq!(
            find("local", "/nonexistent:node_modules/.bin"),
            Some(cwd.join("node_modules/.bin").join("local"))
        );
        // An empty entry, leading, inside or trailing, is the working directory.
        for path in [":/nonexistent", "/nonexistent::/x", "/nonexistent:", ""] {
            let found = find("here", path).map(|p| p.canonicalize().unwrap());
            assert_eq!(
                found,
                Some(cwd.join("here").canonicalize().unwrap()),
                "{path:?}"
            );
        }
        assert_eq!(find("here", "/nonexistent"), None);
        // A name with a slash is a path under cwd, never looked up on PATH.
        assert_eq!(
            find("node_modules/.bin/local", "/nonexistent"),
            Some(cwd.join("node_modules/.bin/local"))
        );
        assert_eq!(find("./here", "/nonexistent"), Some(cwd.join("./here")));
        assert_eq!(find("./local", "node_modules/.bin"), None);
    }

    #[test]
    fn a_leading_tilde_is_the_home_directory() {
        let home = || Some(PathBuf::from("/home/u"));
        assert_eq!(
            expand_tilde(Path::new("~/bin"), home),
            Path::new("/home/u/bin")
        );
        assert_eq!(expand_tilde(Path::new("~"), home), Path::new("/home/u"));
        assert_eq!(
            expand_tilde(Path::new("~user/bin"), home),
            Path::new("~user/bin")
        );
        assert_eq!(
            expand_tilde(Path::new("/opt/~/bin"), home),
            Path::new("/opt/~/bin")
        );
        assert_eq!(
            expand_tilde(Path::new("./~/bin"), home),
            Path::new("./~/bin")
        );
        assert_eq!(expand_tilde(Path::new("~/bin"), || None), Path::new("bin"));
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
