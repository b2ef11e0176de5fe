//! What bwrap needs on this host and what to do when it is missing: the executable, and user
//! namespaces (the kernel switches, and Ubuntu's AppArmor restriction, which only a real bwrap
//! start can reveal).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_engine::host::{self, UserNamespaces};

/// How to install bubblewrap.
pub const INSTALL_BWRAP: &str = "install bubblewrap (`apt-get install -y bubblewrap` on \
     Debian/Ubuntu, `dnf install bubblewrap` on Fedora), or name the program with \
     `--backend-option bwrap-executable=PATH`";

/// What to do when AppArmor refuses bwrap its user namespace (Ubuntu 23.10 and later).
pub const APPARMOR_REMEDY: &str = "AppArmor restricts unprivileged user namespaces \
     (kernel.apparmor_restrict_unprivileged_userns = 1): give bwrap a profile that allows them \
     (write /etc/apparmor.d/bwrap with `abi <abi/4.0>, include <tunables/global> profile bwrap \
     /usr/bin/bwrap flags=(unconfined) { userns, }` and run `apparmor_parser -r \
     /etc/apparmor.d/bwrap`), or lift the restriction with `sysctl -w \
     kernel.apparmor_restrict_unprivileged_userns=0`";

/// How long the start check may take.
const SMOKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why bwrap cannot be used, with the remedy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct Unusable {
    pub reason: String,
    pub remedy: String,
}

/// Find bwrap: `requested` (a name looked up on `path`, or a path).
pub fn resolve_bwrap(requested: &str, path: Option<&OsStr>) -> Result<PathBuf, Unusable> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    host::resolve_executable(OsStr::new(requested), path, &cwd).map_err(|e| Unusable {
        reason: format!("bubblewrap (bwrap) is not usable: {e}"),
        remedy: e.remedy(INSTALL_BWRAP, "bwrap-executable"),
    })
}

/// The PATH bwrap is looked up on for the command (its own PATH, else agentdiff's).
pub fn search_path(env: &[(OsString, OsString)]) -> Option<OsString> {
    host::search_path(env)
}

/// The kernel switches, read from `/proc/sys`.
pub fn user_namespaces() -> UserNamespaces {
    host::user_namespaces(Path::new("/proc/sys"), host::euid())
}

/// Whether AppArmor's restriction applies to this user (only a real start can tell whether
/// bwrap has a profile that lifts it).
pub fn apparmor_restricted(proc_sys: &Path, euid: u32) -> bool {
    euid != 0
        && std::fs::read_to_string(proc_sys.join("kernel/apparmor_restrict_unprivileged_userns"))
            .is_ok_and(|s| s.trim() == "1")
}

/// Map bwrap's own error output to a remedy.
pub fn remedy_for_stderr(stderr: &str, apparmor: bool) -> String {
    let lower = stderr.to_ascii_lowercase();
    let namespace_refused = lower.contains("namespace")
        || lower.contains("uid map")
        || lower.contains("setting up uid")
        || lower.contains("operation not permitted")
        || lower.contains("permission denied");
    if namespace_refused && apparmor {
        APPARMOR_REMEDY.to_string()
    } else if namespace_refused {
        "allow unprivileged user namespaces (`sysctl -w kernel.unprivileged_userns_clone=1`, \
         `sysctl -w user.max_user_namespaces=15000`), or run bwrap setuid as your distribution \
         packages it"
            .to_string()
    } else {
        "run `bwrap --ro-bind / / --unshare-net --unshare-pid -- true` to see bwrap's own error, \
         and `agentdiff doctor --runtime bwrap --probe`"
            .to_string()
    }
}

/// Start bwrap once with the namespaces a run uses; `Err` carries bwrap's message and a remedy.
pub async fn smoke_test(bwrap: &Path) -> Result<(), Unusable> {
    let mut cmd = tokio::process::Command::new(bwrap);
    cmd.args([
        "--ro-bind",
        "/",
        "/",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--die-with-parent",
        "--",
        "true",
    ])
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true);
    let apparmor = apparmor_restricted(Path::new("/proc/sys"), host::euid());
    let out = match tokio::time::timeout(SMOKE_TIMEOUT, cmd.output()).await {
        Err(_) => {
            return Err(Unusable {
                reason: format!("bwrap did not start a sandbox within {SMOKE_TIMEOUT:?}"),
                remedy: remedy_for_stderr("", apparmor),
            })
        }
        Ok(Err(e)) => {
            return Err(Unusable {
                reason: format!("cannot run {}: {e}", bwrap.display()),
                remedy: INSTALL_BWRAP.to_string(),
            })
        }
        Ok(Ok(out)) => out,
    };
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap_or("no message").trim();
    Err(Unusable {
        reason: format!(
            "bwrap could not set up a sandbox on this host ({}): {}",
            out.status,
            first.chars().take(200).collect::<String>()
        ),
        remedy: remedy_for_stderr(&stderr, apparmor),
    })
}

/// What a run's setup failure message adds: what the host says about user namespaces, and
/// `diagnosis`, the outcome of one more bwrap start after the failure (`None` when that start
/// worked, so the failure was specific to the run's mounts).
pub fn setup_hint(diagnosis: Option<&Unusable>) -> String {
    let userns = user_namespaces();
    let mut hint = String::from("see bwrap's message above");
    if let Some(d) = diagnosis {
        hint.push_str(&format!("; {}: {}", d.reason, d.remedy));
    } else if !userns.allowed {
        hint.push_str(&format!(
            "; {} ({})",
            userns.detail,
            userns.remedy.unwrap_or_default()
        ));
    } else if apparmor_restricted(Path::new("/proc/sys"), host::euid()) {
        hint.push_str("; ");
        hint.push_str(APPARMOR_REMEDY);
    }
    hint.push_str("; `agentdiff doctor --runtime bwrap --probe` checks the sandbox on this host");
    hint
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_bwrap_names_bubblewrap_and_the_package() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().as_os_str().to_os_string();
        let e = resolve_bwrap("bwrap", Some(&path)).unwrap_err();
        assert!(e.reason.contains("bubblewrap"), "{}", e.reason);
        assert!(
            e.remedy.contains("apt-get install -y bubblewrap"),
            "{}",
            e.remedy
        );
    }

    #[test]
    fn namespace_refusals_get_the_apparmor_or_sysctl_remedy() {
        let msg = "bwrap: setting up uid map: Permission denied";
        assert!(remedy_for_stderr(msg, true).contains("apparmor_parser"));
        assert!(remedy_for_stderr(msg, false).contains("unprivileged_userns_clone=1"));
        assert!(remedy_for_stderr("bwrap: Can't mount proc", false).contains("doctor"));
    }

    #[test]
    fn a_diagnosed_setup_failure_names_its_remedy() {
        let d = Unusable {
            reason: "bwrap could not set up a sandbox on this host".into(),
            remedy: remedy_for_stderr("bwrap: setting up uid map: Permission denied", false),
        };
        let hint = setup_hint(Some(&d));
        assert!(hint.contains("unprivileged_userns_clone=1"), "{hint}");
        assert!(hint.contains("doctor"), "{hint}");
    }

    #[test]
    fn apparmor_restriction_is_read_for_unprivileged_users_only() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("kernel")).unwrap();
        assert!(!apparmor_restricted(dir.path(), 1000));
        std::fs::write(
            dir.path()
                .join("kernel/apparmor_restrict_unprivileged_userns"),
            "1\n",
        )
        .unwrap();
        assert!(apparmor_restricted(dir.path(), 1000));
        assert!(!apparmor_restricted(dir.path(), 0));
    }
}
