//! Process identities from `/proc`: pid + start time in clock ticks + boot id.
//!
//! The start time (field 22 of `/proc/PID/stat`) is the number of clock ticks after boot at which
//! the process started; together with the pid and the boot id it names one process for the whole
//! uptime of the machine, so a reused pid can be told apart from the process that was recorded.

use serde::{Deserialize, Serialize};

/// A process identity that survives pid reuse: pid + start time (clock ticks since boot, from
/// `/proc/PID/stat` field 22) + boot id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcessIdentity {
    pub pid: u32,
    pub start_time_ticks: u64,
    pub boot_id: String,
}

/// Why a process's identity could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("process {0} does not exist")]
    NoSuchProcess(u32),
    #[error("could not read {what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not parse {what}: {message}")]
    Parse { what: String, message: String },
    #[error("could not read the boot id (/proc/sys/kernel/random/boot_id): {0}")]
    BootId(#[source] std::sync::Arc<std::io::Error>),
}

/// The fields of `/proc/PID/stat` agentdiff uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatInfo {
    pub pid: u32,
    /// `comm` (at most 15 bytes, set by the process itself).
    pub comm: String,
    /// One-letter state (`R`, `S`, `Z`, `T`…).
    pub state: char,
    pub ppid: u32,
    pub pgrp: i32,
    pub session: i32,
    pub start_time_ticks: u64,
}

impl StatInfo {
    pub fn is_zombie(&self) -> bool {
        matches!(self.state, 'Z' | 'X' | 'x')
    }
}

/// Parse the text of `/proc/PID/stat`. `comm` may contain spaces and parentheses, so the fields
/// after it are located from the *last* `)`.
pub fn parse_stat(text: &str) -> Result<StatInfo, IdentityError> {
    let bad = |message: &str| IdentityError::Parse {
        what: "/proc/PID/stat".into(),
        message: message.into(),
    };
    let open = text.find('(').ok_or_else(|| bad("no `(` before comm"))?;
    let close = text.rfind(')').ok_or_else(|| bad("no `)` after comm"))?;
    if close < open {
        return Err(bad("comm parentheses out of order"));
    }
    let pid: u32 = text[..open]
        .trim()
        .parse()
        .map_err(|_| bad("pid is not a number"))?;
    let comm = text[open + 1..close].to_string();
    // Fields after comm start at field 3 (state).
    let rest: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    let field = |n: usize| -> Result<&str, IdentityError> {
        rest.get(n - 3)
            .copied()
            .ok_or_else(|| bad("too few fields"))
    };
    let state = field(3)?.chars().next().ok_or_else(|| bad("empty state"))?;
    let ppid = field(4)?.parse().map_err(|_| bad("ppid is not a number"))?;
    let pgrp = field(5)?.parse().map_err(|_| bad("pgrp is not a number"))?;
    let session = field(6)?
        .parse()
        .map_err(|_| bad("session is not a number"))?;
    let start_time_ticks = field(22)?
        .parse()
        .map_err(|_| bad("start time is not a number"))?;
    Ok(StatInfo {
        pid,
        comm,
        state,
        ppid,
        pgrp,
        session,
        start_time_ticks,
    })
}

#[cfg(target_os = "linux")]
mod imp {
    use std::sync::OnceLock;

    use super::{parse_stat, StatInfo};
    use super::{IdentityError, ProcessIdentity};

    /// Read and parse `/proc/PID/stat`. A missing process is [`IdentityError::NoSuchProcess`].
    pub fn read_stat(pid: u32) -> Result<StatInfo, IdentityError> {
        let path = format!("/proc/{pid}/stat");
        match std::fs::read_to_string(&path) {
            Ok(text) => parse_stat(&text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(3) => {
                Err(IdentityError::NoSuchProcess(pid))
            }
            Err(e) => Err(IdentityError::Io {
                what: path,
                source: e,
            }),
        }
    }

    /// The kernel's boot id (`/proc/sys/kernel/random/boot_id`), read once per process.
    pub fn boot_id() -> Result<String, IdentityError> {
        // Read once; the error is shared by every later call, hence the Arc.
        static BOOT_ID: OnceLock<Result<String, std::sync::Arc<std::io::Error>>> = OnceLock::new();
        BOOT_ID
            .get_or_init(|| {
                std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                    .map(|s| s.trim().to_string())
                    .map_err(std::sync::Arc::new)
            })
            .clone()
            .map_err(IdentityError::BootId)
    }

    pub fn read_identity(pid: u32) -> Result<ProcessIdentity, IdentityError> {
        let stat = read_stat(pid)?;
        Ok(ProcessIdentity {
            pid,
            start_time_ticks: stat.start_time_ticks,
            boot_id: boot_id()?,
        })
    }

    /// Basename of `/proc/PID/exe`, or `comm` when the link cannot be read (zombies, other users).
    pub fn executable_name(pid: u32, comm: &str) -> String {
        match std::fs::read_link(format!("/proc/{pid}/exe")) {
            Ok(path) => path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                // A deleted executable reads as "name (deleted)"; keep the name.
                .map(|n| n.trim_end_matches(" (deleted)").to_string())
                .unwrap_or_else(|| comm.to_string()),
            Err(_) => comm.to_string(),
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    //! Portable fallback through `sysinfo`: start times are in seconds, not clock ticks, so a pid
    //! reused within the same second is not told apart. Evidence built on it says so.
    use std::sync::OnceLock;

    use super::StatInfo;
    use super::{IdentityError, ProcessIdentity};

    pub fn read_stat(pid: u32) -> Result<StatInfo, IdentityError> {
        use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};
        let mut sys = System::new();
        let spid = Pid::from_u32(pid);
        sys.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[spid]),
            true,
            ProcessRefreshKind::new(),
        );
        let p = sys.process(spid).ok_or(IdentityError::NoSuchProcess(pid))?;
        Ok(StatInfo {
            pid,
            comm: p.name().to_string_lossy().into_owned(),
            state: if matches!(p.status(), sysinfo::ProcessStatus::Zombie) {
                'Z'
            } else {
                'S'
            },
            ppid: p.parent().map(|p| p.as_u32()).unwrap_or(0),
            pgrp: 0,
            session: 0,
            start_time_ticks: p.start_time(),
        })
    }

    pub fn boot_id() -> Result<String, IdentityError> {
        static BOOT_ID: OnceLock<String> = OnceLock::new();
        Ok(BOOT_ID
            .get_or_init(|| format!("boot-time:{}", sysinfo::System::boot_time()))
            .clone())
    }

    pub fn read_identity(pid: u32) -> Result<ProcessIdentity, IdentityError> {
        let stat = read_stat(pid)?;
        Ok(ProcessIdentity {
            pid,
            start_time_ticks: stat.start_time_ticks,
            boot_id: boot_id()?,
        })
    }

    pub fn executable_name(_pid: u32, comm: &str) -> String {
        comm.to_string()
    }
}

pub use imp::{boot_id, executable_name, read_identity, read_stat};

/// Whether `id` still names the same running process: same boot, same start time.
pub fn still_matches(id: &ProcessIdentity) -> Result<bool, IdentityError> {
    if id.boot_id != boot_id()? {
        return Ok(false);
    }
    match read_stat(id.pid) {
        Ok(stat) => Ok(stat.start_time_ticks == id.start_time_ticks),
        Err(IdentityError::NoSuchProcess(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_spaces_and_parens_in_comm_parses() {
        let text = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        let s = parse_stat(text).unwrap();
        assert_eq!(s.pid, 4242);
        assert_eq!(s.comm, "a (weird) name");
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 1);
        assert_eq!(s.pgrp, 4242);
        assert_eq!(s.session, 4242);
        assert_eq!(s.start_time_ticks, 987654);
    }

    #[test]
    fn truncated_stat_is_an_error_not_a_panic() {
        assert!(parse_stat("12 (x) S 1 2").is_err());
        assert!(parse_stat("garbage").is_err());
        assert!(parse_stat("x (y) S").is_err());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn own_identity_is_stable_and_boot_id_is_a_uuid() {
        let me = std::process::id();
        let a = read_identity(me).unwrap();
        let b = read_identity(me).unwrap();
        assert_eq!(a, b);
        assert!(a.start_time_ticks > 0);
        assert_eq!(a.boot_id.len(), 36, "{}", a.boot_id);
        assert!(still_matches(&a).unwrap());
        let mut other = a.clone();
        other.start_time_ticks += 1;
        assert!(!still_matches(&other).unwrap());
        other = a.clone();
        other.boot_id = "00000000-0000-0000-0000-000000000000".into();
        assert!(!still_matches(&other).unwrap());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn missing_process_is_reported_as_such() {
        // pid_max is at most 2^22; this pid cannot exist.
        assert!(matches!(
            read_identity(u32::MAX - 1),
            Err(IdentityError::NoSuchProcess(_))
        ));
    }
}
