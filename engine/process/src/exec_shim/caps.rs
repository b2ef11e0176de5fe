//! Every capability dropped before the shim `exec`s the command.
//!
//! bubblewrap drops every capability itself, but a wrapper started by uid 0 may not: srt run as
//! root leaves the command a full effective set in its namespace, and `CAP_DAC_OVERRIDE` lifts the
//! modes that keep the command from reading the start marker (0200) and the shim's secret, while
//! `CAP_SYS_ADMIN` could remount what the wrapper made read-only. The shim is the last program
//! that runs before the command, so it drops them for every wrapper.
//!
//! Invariants: after [`drop_all`] returns `Ok`, the calling thread's effective, permitted,
//! inheritable and ambient sets are empty (read back with `capget`) and `no_new_privs` is set, so
//! the `exec` cannot grant them again: not through uid 0's rule (permitted gained at `exec` is cut
//! to the old, empty, permitted set), not through file capabilities or set-user-ID programs. The
//! bounding set is emptied as far as the thread may (it needs `CAP_SETPCAP`, which only a
//! capable caller has; without it there is nothing to drop).
//!
//! Not defended: the wrapper itself and anything it started before the shim keep what they had;
//! uid 0 without capabilities still owns root-owned files (it can `chmod` them where the mount is
//! writable, so the capsule must sit on a mount the command cannot write, as both wrappers
//! arrange).

/// Errors dropping the capabilities.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    #[error("could not set no_new_privs: {0}")]
    NoNewPrivs(std::io::Error),
    #[error("could not clear the ambient capabilities: {0}")]
    Ambient(std::io::Error),
    #[error("could not clear the capability sets: {0}")]
    Set(std::io::Error),
    #[error("capabilities remain after dropping them (effective {effective:#x}, permitted {permitted:#x}, inheritable {inheritable:#x})")]
    Remain {
        effective: u64,
        permitted: u64,
        inheritable: u64,
    },
}

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;
/// Capability numbers tried for the bounding set; the kernel answers `EINVAL` past its last.
const MAX_CAP: libc::c_ulong = 63;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability of the calling thread for good (see the module invariants).
pub fn drop_all() -> Result<(), CapsError> {
    // SAFETY: prctl with integer arguments; no memory is passed.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(CapsError::NoNewPrivs(std::io::Error::last_os_error()));
    }
    for cap in 0..=MAX_CAP {
        // SAFETY: prctl with integer arguments. EPERM (no CAP_SETPCAP) and EINVAL (past the
        // kernel's last capability) leave nothing this thread could drop.
        let _ = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
    }
    let clear_all = libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong;
    // SAFETY: prctl with integer arguments; no memory is passed.
    if unsafe { libc::prctl(libc::PR_CAP_AMBIENT, clear_all, 0, 0, 0) } != 0 {
        return Err(CapsError::Ambient(std::io::Error::last_os_error()));
    }
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let empty = [CapData::default(); 2];
    // SAFETY: `header` and `empty` are valid for the call and laid out as the kernel's
    // `__user_cap_header_struct` and two `__user_cap_data_struct`s (version 3).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            empty.as_ptr(),
        )
    };
    if rc != 0 {
        return Err(CapsError::Set(std::io::Error::last_os_error()));
    }
    let (effective, permitted, inheritable) = current()?;
    if effective | permitted | inheritable != 0 {
        return Err(CapsError::Remain {
            effective,
            permitted,
            inheritable,
        });
    }
    Ok(())
}

/// The calling thread's effective, permitted and inheritable sets.
fn current() -> Result<(u64, u64, u64), CapsError> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: `header` and `data` are valid, writable and laid out as the kernel expects for
    // version 3 (two data structs).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_capget,
            &mut header as *mut CapHeader,
            data.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(CapsError::Set(std::io::Error::last_os_error()));
    }
    let wide = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | (u64::from(f(&data[1])) << 32);
    Ok((
        wide(|d| d.effective),
        wide(|d| d.permitted),
        wide(|d| d.inheritable),
    ))
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    /// The sets of `/proc/self/status` of a program started after [`super::drop_all`].
    fn status_after_drop() -> String {
        let mut cmd = std::process::Command::new("grep");
        cmd.args(["-E", "^(Cap|NoNewPrivs)", "/proc/self/status"]);
        // SAFETY: the closure only makes system calls (prctl, capset, capget) on the child's
        // own thread and allocates nothing.
        unsafe {
            cmd.pre_exec(|| super::drop_all().map_err(|e| std::io::Error::other(e.to_string())));
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn field(status: &str, name: &str) -> u64 {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"));
        let value = line.split_whitespace().nth(1).unwrap();
        u64::from_str_radix(value, 16).unwrap_or_else(|_| value.parse().unwrap())
    }

    #[test]
    fn a_program_started_after_the_drop_has_no_capability_even_as_root() {
        let status = status_after_drop();
        for set in ["CapInh:", "CapPrm:", "CapEff:", "CapAmb:"] {
            assert_eq!(field(&status, set), 0, "{set} in {status}");
        }
        assert_eq!(field(&status, "NoNewPrivs:"), 1, "{status}");
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        const CAP_SETPCAP: u64 = 1 << 8;
        if field(&own, "CapEff:") & CAP_SETPCAP != 0 {
            // A caller that may drop from the bounding set empties it.
            assert_eq!(field(&status, "CapBnd:"), 0, "{status}");
        }
    }
}
