//! Identity (pid + start time + boot id) of the host-side engine client process.

use agentdiff_engine::process::ProcessIdentity;

/// Read the identity of a live process; `None` when it is gone or `/proc` is unavailable.
pub fn read(pid: u32) -> Option<ProcessIdentity> {
    #[cfg(target_os = "linux")]
    {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name may contain spaces and parentheses: fields start after the last ')'.
        let rest = &stat[stat.rfind(')')? + 1..];
        // After ')' come fields 3.. ; start time is field 22, i.e. index 19 here.
        let start = rest.split_whitespace().nth(19)?.parse().ok()?;
        let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()?
            .trim()
            .to_string();
        Some(ProcessIdentity {
            pid,
            start_time_ticks: start,
            boot_id,
        })
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = pid;
        None
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    #[test]
    fn reads_own_identity_stably() {
        let a = super::read(std::process::id()).unwrap();
        let b = super::read(std::process::id()).unwrap();
        assert_eq!(a, b);
        assert!(a.start_time_ticks > 0);
        assert!(super::read(u32::MAX - 1).is_none());
    }
}
