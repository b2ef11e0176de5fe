//! Host-side process facts the suite and the test backends need: identities from `/proc`,
//! liveness, finding a probe's processes by a token in their command line, and identity-checked
//! signalling through a pidfd.
//!
//! Linux only; elsewhere every lookup reports "unknown" and signalling is refused, so checks that
//! need these facts fail or skip with a reason instead of guessing.

use std::path::Path;

use agentdiff_backend_api::ProcessIdentity;

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("could not read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("unexpected contents in {path}")]
    Malformed { path: String },
    #[error("process {pid} could not be signalled: {message}")]
    Signal { pid: u32, message: String },
    #[error("process identities are only available on Linux")]
    Unsupported,
}

/// One line of `/proc/PID/stat`, the fields the suite uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcStat {
    pub pid: u32,
    pub comm: String,
    pub state: char,
    pub ppid: u32,
    pub start_time_ticks: u64,
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`).
pub fn boot_id() -> Result<String, HostError> {
    let path = "/proc/sys/kernel/random/boot_id";
    let text = std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.into(),
        source,
    })?;
    let id = text.trim().to_string();
    if id.is_empty() {
        return Err(HostError::Malformed { path: path.into() });
    }
    Ok(id)
}

/// Parse `/proc/PID/stat`. The command name may hold spaces and parentheses, so fields are
/// counted after the last `)`.
pub fn parse_stat(pid: u32, text: &str) -> Option<ProcStat> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    let rest: Vec<&str> = text.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    let state = rest.first()?.chars().next()?;
    let ppid = rest.get(1)?.parse().ok()?;
    let start_time_ticks = rest.get(19)?.parse().ok()?;
    Some(ProcStat {
        pid,
        comm,
        state,
        ppid,
        start_time_ticks,
    })
}

pub fn stat(pid: u32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(pid, &text)
}

/// The identity of a live process, or `None` when it is gone.
pub fn identity_of(pid: u32) -> Option<ProcessIdentity> {
    let st = stat(pid)?;
    Some(ProcessIdentity {
        pid,
        start_time_ticks: st.start_time_ticks,
        boot_id: boot_id().ok()?,
    })
}

/// Whether exactly this process (pid and start time) is still running (a zombie is not).
pub fn is_alive(identity: &ProcessIdentity) -> bool {
    match stat(identity.pid) {
        Some(st) => st.start_time_ticks == identity.start_time_ticks && st.state != 'Z',
        None => false,
    }
}

/// Every numeric entry of `/proc`.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Live (non-zombie) processes whose command line contains `token`. Works across pid namespaces,
/// because the host sees every process of a container or sandbox under its host pid.
pub fn find_by_cmdline(token: &str) -> Vec<ProcessIdentity> {
    let me = std::process::id();
    all_pids()
        .into_iter()
        .filter(|pid| *pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| contains(&c, token.as_bytes()))
                .unwrap_or(false)
        })
        .filter_map(identity_of)
        .filter(is_alive)
        .collect()
}

/// Live processes whose environment contains the exact `NAME=VALUE` entry.
pub fn find_by_environ(entry: &str) -> Vec<ProcessIdentity> {
    let mut wanted = entry.as_bytes().to_vec();
    wanted.push(0);
    all_pids()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| {
                    let mut padded = Vec::with_capacity(env.len() + 2);
                    padded.push(0);
                    padded.extend_from_slice(&env);
                    padded.push(0);
                    let mut needle = vec![0];
                    needle.extend_from_slice(&wanted);
                    contains(&padded, &needle)
                })
                .unwrap_or(false)
        })
        .filter_map(identity_of)
        .filter(is_alive)
        .collect()
}

/// What identity-checked signalling did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalResult {
    Sent,
    /// The process is gone.
    Gone,
    /// The pid belongs to another process now (start time or boot differs): not signalled.
    Mismatch,
}

/// Send `signal` to exactly this identity: the pid is pinned with a pidfd, the start time is
/// re-read after pinning, and a mismatch is refused.
#[cfg(target_os = "linux")]
pub fn signal_identity(identity: &ProcessIdentity, signal: i32) -> Result<SignalResult, HostError> {
    use std::os::fd::{FromRawFd, OwnedFd};

    if boot_id()? != identity.boot_id {
        return Ok(SignalResult::Mismatch);
    }
    let pid = libc::pid_t::try_from(identity.pid).map_err(|_| HostError::Signal {
        pid: identity.pid,
        message: "pid out of range".into(),
    })?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(SignalResult::Gone),
            _ => Err(HostError::Signal {
                pid: identity.pid,
                message: err.to_string(),
            }),
        };
    }
    let fd_num = i32::try_from(raw).map_err(|_| HostError::Signal {
        pid: identity.pid,
        message: "pidfd out of range".into(),
    })?;
    // SAFETY: the kernel just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd_num) };
    // The pidfd pins the process: the start time read now belongs to the process it refers to.
    match stat(identity.pid) {
        None => return Ok(SignalResult::Gone),
        Some(st) if st.state == 'Z' => return Ok(SignalResult::Gone),
        Some(st) if st.start_time_ticks != identity.start_time_ticks => {
            return Ok(SignalResult::Mismatch)
        }
        Some(_) => {}
    }
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a valid pidfd, a signal number, no siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        return match err.raw_os_error() {
            Some(libc::ESRCH) => Ok(SignalResult::Gone),
            _ => Err(HostError::Signal {
                pid: identity.pid,
                message: err.to_string(),
            }),
        };
    }
    Ok(SignalResult::Sent)
}

#[cfg(not(target_os = "linux"))]
pub fn signal_identity(
    _identity: &ProcessIdentity,
    _signal: i32,
) -> Result<SignalResult, HostError> {
    Err(HostError::Unsupported)
}

/// SHA-256 of a file's contents, `None` when it cannot be read.
pub fn file_digest(path: &Path) -> Option<String> {
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

/// A short random hex token (for canaries and probe markers).
pub fn random_token() -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(std::process::id().to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    h.update(now.to_le_bytes());
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    h.update(
        COUNTER
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .to_le_bytes(),
    );
    // Stack address adds per-process randomness (ASLR) without a new dependency.
    let local = 0u8;
    h.update((std::ptr::addr_of!(local) as usize).to_le_bytes());
    if let Ok(bytes) = std::fs::read("/proc/sys/kernel/random/uuid") {
        h.update(bytes);
    }
    hex::encode(h.finalize())[..20].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_counts_fields_after_the_last_parenthesis() {
        let line =
            "1234 (a (b) c) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let st = parse_stat(1234, line).unwrap();
        assert_eq!(st.comm, "a (b) c");
        assert_eq!(st.state, 'S');
        assert_eq!(st.ppid, 1);
        assert_eq!(st.start_time_ticks, 987654);
        assert!(parse_stat(1, "garbage").is_none());
    }

    #[test]
    fn own_identity_is_alive_and_a_wrong_start_time_is_not() {
        let me = identity_of(std::process::id()).unwrap();
        assert!(is_alive(&me));
        let wrong = ProcessIdentity {
            start_time_ticks: me.start_time_ticks + 1,
            ..me
        };
        assert!(!is_alive(&wrong));
    }

    #[test]
    fn signalling_a_mismatched_identity_is_refused() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let id = identity_of(child.id()).unwrap();
        let wrong = ProcessIdentity {
            start_time_ticks: id.start_time_ticks + 7,
            ..id.clone()
        };
        assert_eq!(
            signal_identity(&wrong, libc::SIGKILL).unwrap(),
            SignalResult::Mismatch
        );
        assert!(is_alive(&id), "a mismatched identity must not be signalled");
        assert_eq!(
            signal_identity(&id, libc::SIGKILL).unwrap(),
            SignalResult::Sent
        );
        child.wait().unwrap();
    }

    #[test]
    fn tokens_differ() {
        assert_ne!(random_token(), random_token());
    }
}
