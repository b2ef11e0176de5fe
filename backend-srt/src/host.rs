//! What srt needs on this host, checked without starting anything: the srt executable itself,
//! and on Linux bubblewrap, socat, ripgrep and usable user namespaces.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

pub use agentdiff_host::system::{
    check_executable, euid, resolve_executable, search_path, user_namespaces, ExecutableError,
    UserNamespaces,
};
use serde::Serialize;

/// How to install srt and its Linux prerequisites (Debian/Ubuntu names).
pub const INSTALL_SRT: &str = "install it with `npm install -g @anthropic-ai/sandbox-runtime` \
     (Node.js 18 or later), or name it with --srt-executable PATH";

/// What to do about an unusable srt executable.
pub fn remedy(e: &ExecutableError) -> String {
    e.remedy(INSTALL_SRT, "--srt-executable")
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
            path: agentdiff_host::system::find_program(OsStr::new(program), path, cwd)
                .filter(|p| check_executable(p).is_ok()),
            package,
        })
        .collect()
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
        agentdiff_test_support::write_executable(&p, "#!/bin/sh\nexit 0\n", mode);
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
        assert!(remedy(&err).contains("npm install -g @anthropic-ai/sandbox-runtime"));
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
}
