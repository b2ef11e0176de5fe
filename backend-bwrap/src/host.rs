//! What bwrap needs on this host and what to do when it is missing: the executable, and user
//! namespaces (the kernel switches, and Ubuntu's AppArmor restriction, which only a real bwrap
//! start can reveal, and whose successful start is remembered per boot, kernel, user and bwrap
//! binary).

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_host::cache_file::{self, FileIdentity};
use agentdiff_host::system::{self as host, UserNamespaces};
use serde::{Deserialize, Serialize};

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

/// What to do when the bwrap found is not trusted.
pub const TRUSTED_BWRAP_REMEDY: &str = "name a bwrap that only root can change with \
     `--backend-option bwrap-executable=PATH` (the distribution's, e.g. \
     `--backend-option bwrap-executable=/usr/bin/bwrap`), or remove the other `bwrap` from the \
     command's PATH";

/// Find bwrap: `requested` (a name looked up on `path`, or a path), as its canonical path, and
/// only when it is trusted ([`untrusted_component`] with root as the owner): a bwrap that
/// anyone but root can change (a `bwrap` planted in `node_modules/.bin` or `.venv/bin`, on the
/// PATH of an activated environment) would run the command with no sandbox at all.
pub fn resolve_bwrap(requested: &str, path: Option<&OsStr>) -> Result<PathBuf, Unusable> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let found =
        host::resolve_executable(OsStr::new(requested), path, &cwd).map_err(|e| Unusable {
            reason: format!("bubblewrap (bwrap) is not usable: {e}"),
            remedy: e.remedy(INSTALL_BWRAP, "bwrap-executable"),
        })?;
    let canonical = found.canonicalize().map_err(|e| Unusable {
        reason: format!("bubblewrap (bwrap) at {}: {e}", found.display()),
        remedy: INSTALL_BWRAP.to_string(),
    })?;
    if let Some(why) = untrusted_component(&canonical, 0) {
        return Err(Unusable {
            reason: format!(
                "refusing the bwrap executable {} (found as {}): {why}; a bwrap that is not \
                 root's could run the command without any sandbox",
                canonical.display(),
                found.display()
            ),
            remedy: TRUSTED_BWRAP_REMEDY.to_string(),
        });
    }
    Ok(canonical)
}

/// Why `canonical` could be changed by anyone but `owner` (the rule lives in the host crate, where
/// plugin discovery applies it too).
pub fn untrusted_component(canonical: &Path, owner: u32) -> Option<String> {
    host::untrusted_component(canonical, &[owner])
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

/// Cache file, in agentdiff's state directory, of bwrap starts that worked under AppArmor's
/// restriction.
pub const VERDICT_CACHE_FILE: &str = "bwrap-start.json";
/// Entries kept (one per bwrap binary, kernel and boot seen; old ones fall off).
const MAX_VERDICTS: usize = 8;

/// What a cached "bwrap started a sandbox" is valid for: this boot, this kernel, this user and
/// this bwrap binary. A reboot, a kernel update, another user or a changed bwrap misses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerdictKey {
    pub boot_id: String,
    pub kernel: String,
    pub euid: u32,
    pub bwrap: FileIdentity,
}

impl VerdictKey {
    /// The key for `bwrap` now, read from `proc_sys`; `None` when a part cannot be read (then
    /// nothing is cached).
    pub fn current(bwrap: &Path, proc_sys: &Path, euid: u32) -> Option<VerdictKey> {
        let read = |rel: &str| {
            std::fs::read_to_string(proc_sys.join(rel))
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        };
        Some(VerdictKey {
            boot_id: read("kernel/random/boot_id")?,
            kernel: read("kernel/osrelease")?,
            euid,
            bwrap: FileIdentity::of(bwrap).ok()?,
        })
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct VerdictCache {
    started: Vec<VerdictKey>,
}

/// Where a "bwrap starts here" came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartCheck {
    /// bwrap was started now.
    Probed,
    /// The same bwrap started a sandbox earlier on this boot and kernel.
    Cached,
}

/// [`smoke_test`], skipped when the same bwrap already started a sandbox on this boot and
/// kernel for this user (the entry is in `state_dir`). Only a start that worked is cached: a
/// failure is probed again each time, so its message is always current. A cached start that no
/// longer holds (an AppArmor profile removed since) still fails closed: bwrap then refuses at
/// launch and the start marker shows the command never ran.
pub async fn smoke_test_cached(
    bwrap: &Path,
    proc_sys: &Path,
    euid: u32,
    state_dir: Option<&Path>,
) -> Result<StartCheck, Unusable> {
    let key = VerdictKey::current(bwrap, proc_sys, euid);
    let file = state_dir.map(|d| d.join(VERDICT_CACHE_FILE));
    if let (Some(key), Some(file)) = (&key, &file) {
        if cache_file::read::<VerdictCache>(file).started.contains(key) {
            return Ok(StartCheck::Cached);
        }
    }
    smoke_test(bwrap).await?;
    if let (Some(key), Some(file), Some(dir)) = (key, file, state_dir) {
        let mut cache: VerdictCache = cache_file::read(&file);
        cache.started.retain(|k| *k != key);
        cache.started.insert(0, key);
        cache.started.truncate(MAX_VERDICTS);
        cache_file::write(dir, VERDICT_CACHE_FILE, &cache);
    }
    Ok(StartCheck::Probed)
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
    fn a_bwrap_only_its_owner_can_change_is_trusted_and_no_other() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().canonicalize().unwrap();
        // The tempdir's parents (/tmp, /) belong to root; the test's own files to this user.
        let me = std::fs::metadata(&base).unwrap().uid();
        let bin = base.join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::fs::set_permissions(&bin, PermissionsExt::from_mode(0o755)).unwrap();
        let bwrap = bin.join("bwrap");
        std::fs::write(&bwrap, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&bwrap, PermissionsExt::from_mode(0o755)).unwrap();
        let parents_are_root = base
            .parent()
            .is_some_and(|p| untrusted_component(p, 0).is_none());
        if me != 0 {
            let why = untrusted_component(&bwrap, 0).unwrap_or_default();
            assert!(why.contains("owned by uid"), "{why}");
        } else if parents_are_root {
            assert_eq!(untrusted_component(&bwrap, 0), None);
        }
        std::fs::set_permissions(&bwrap, PermissionsExt::from_mode(0o775)).unwrap();
        let why = untrusted_component(&bwrap, me).unwrap_or_default();
        assert!(why.contains("writable by group or others"), "{why}");
        std::fs::set_permissions(&bwrap, PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&bin, PermissionsExt::from_mode(0o777)).unwrap();
        let why = untrusted_component(&bwrap, me).unwrap_or_default();
        assert!(why.contains("bin is writable"), "{why}");
        std::fs::set_permissions(&bin, PermissionsExt::from_mode(0o1777)).unwrap();
        // A sticky directory only lets each owner replace its own entries.
        assert!(!untrusted_component(&bwrap, me)
            .unwrap_or_default()
            .contains("bin is writable"));
        // The system's bwrap (root's, in root's directories) is trusted.
        if let Ok(system) = Path::new("/usr/bin/bwrap").canonicalize() {
            assert_eq!(untrusted_component(&system, 0), None);
        }
    }

    #[test]
    fn an_untrusted_bwrap_on_path_is_refused_with_the_option_as_remedy() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("node_modules/.bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::set_permissions(&bin, PermissionsExt::from_mode(0o777)).unwrap();
        let fake = bin.join("bwrap");
        std::fs::write(&fake, "#!/bin/sh\nshift\nexec \"$@\"\n").unwrap();
        std::fs::set_permissions(&fake, PermissionsExt::from_mode(0o755)).unwrap();
        let path = bin.as_os_str().to_os_string();
        let e = resolve_bwrap("bwrap", Some(&path)).unwrap_err();
        assert!(
            e.reason.contains("refusing the bwrap executable"),
            "{}",
            e.reason
        );
        assert!(e.remedy.contains("bwrap-executable=PATH"), "{}", e.remedy);
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

    fn fake_proc_sys(dir: &Path, boot: &str) -> PathBuf {
        let p = dir.join("proc-sys");
        std::fs::create_dir_all(p.join("kernel/random")).unwrap();
        std::fs::write(p.join("kernel/random/boot_id"), format!("{boot}\n")).unwrap();
        std::fs::write(p.join("kernel/osrelease"), "6.1.0-test\n").unwrap();
        p
    }

    /// A bwrap that counts its starts and exits with `code`.
    fn counting_bwrap(dir: &Path, code: i32) -> PathBuf {
        let p = dir.join(format!("bwrap-{code}"));
        let calls = dir.join("calls");
        agentdiff_test_support::write_executable(
            &p,
            &format!("#!/bin/sh\necho x >> '{}'\nexit {code}\n", calls.display()),
            0o755,
        );
        p
    }

    fn calls(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("calls"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    #[tokio::test]
    async fn a_working_start_is_cached_per_boot_kernel_user_and_binary() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let proc_sys = fake_proc_sys(dir.path(), "boot-1");
        let bwrap = counting_bwrap(dir.path(), 0);
        let check = |p: PathBuf, euid| {
            let (b, s) = (bwrap.clone(), state.clone());
            async move { smoke_test_cached(&b, &p, euid, Some(&s)).await }
        };
        assert_eq!(check(proc_sys.clone(), 1000).await, Ok(StartCheck::Probed));
        assert_eq!(check(proc_sys.clone(), 1000).await, Ok(StartCheck::Cached));
        assert_eq!(calls(dir.path()), 1);
        // Another user, another boot, another kernel, another bwrap: probed again.
        assert_eq!(check(proc_sys.clone(), 1001).await, Ok(StartCheck::Probed));
        let rebooted = fake_proc_sys(&dir.path().join("b2"), "boot-2");
        assert_eq!(check(rebooted, 1000).await, Ok(StartCheck::Probed));
        std::fs::write(proc_sys.join("kernel/osrelease"), "6.2.0-test\n").unwrap();
        assert_eq!(check(proc_sys.clone(), 1000).await, Ok(StartCheck::Probed));
        assert_eq!(check(proc_sys.clone(), 1000).await, Ok(StartCheck::Cached));
        std::thread::sleep(std::time::Duration::from_millis(20));
        let body = std::fs::read_to_string(&bwrap).unwrap();
        agentdiff_test_support::write_executable(&bwrap, &format!("{body}# replaced\n"), 0o755);
        assert_eq!(check(proc_sys.clone(), 1000).await, Ok(StartCheck::Probed));
        assert_eq!(calls(dir.path()), 5);
    }

    #[tokio::test]
    async fn a_failed_start_is_never_cached() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let proc_sys = fake_proc_sys(dir.path(), "boot-1");
        let bwrap = counting_bwrap(dir.path(), 1);
        for _ in 0..2 {
            assert!(smoke_test_cached(&bwrap, &proc_sys, 1000, Some(&state))
                .await
                .is_err());
        }
        assert_eq!(calls(dir.path()), 2);
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
