//! A seccomp filter that refuses the terminal ioctls that inject input (`TIOCSTI`) or reach the
//! console (`TIOCLINUX`), installed by the exec shim just before it `exec`s the command.
//!
//! A sandboxed command that shares the caller's terminal (an interactive run keeps its session so
//! the terminal, Ctrl-C and job control work) could otherwise push keystrokes into the caller's
//! shell with `TIOCSTI`. The filter is inherited by every descendant and cannot be removed.
//!
//! Invariants: on the native architecture and its compat ABI (x86_64: x32 and i386; aarch64:
//! arm) `ioctl` with those requests fails with `EPERM`, everything else is allowed; a syscall from
//! any other architecture fails with `ENOSYS`, so an unknown ABI never bypasses the filter.
//! Not defended: other terminal ioctls, and terminals the command opens that are not the
//! caller's (they are its own).

/// `TIOCSTI`: push a byte into the terminal's input queue.
pub const TIOCSTI: u32 = 0x5412;
/// `TIOCLINUX`: console subcommands (among them, pasting the selection).
pub const TIOCLINUX: u32 = 0x541C;

/// Errors installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum TtyGuardError {
    #[error("this architecture has no terminal-injection filter")]
    UnsupportedArch,
    #[error("could not install the seccomp filter: {0}")]
    Install(std::io::Error),
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod imp {
    use super::{TtyGuardError, TIOCLINUX, TIOCSTI};

    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const OFF_NR: u32 = 0;
    const OFF_ARCH: u32 = 4;
    /// Low 32 bits of `args[1]` (little endian): the ioctl request.
    const OFF_ARG1_LO: u32 = 24;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;

    #[cfg(target_arch = "x86_64")]
    const NATIVE: (u32, &[u32]) = (0xc000_003e, &[16, 0x4000_0000 | 514]);
    #[cfg(target_arch = "x86_64")]
    const COMPAT: (u32, &[u32]) = (0x4000_0003, &[54]);
    #[cfg(target_arch = "aarch64")]
    const NATIVE: (u32, &[u32]) = (0xc000_00b7, &[29]);
    #[cfg(target_arch = "aarch64")]
    const COMPAT: (u32, &[u32]) = (0x4000_0028, &[54]);

    fn stmt(code: u16, k: u32) -> libc::sock_filter {
        libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        }
    }

    fn jeq(k: u32, jt: u8, jf: u8) -> libc::sock_filter {
        libc::sock_filter {
            code: JEQ_K,
            jt,
            jf,
            k,
        }
    }

    /// The program (see the module documentation for what it decides).
    pub fn program() -> Vec<libc::sock_filter> {
        // Per architecture: `jeq ARCH` (skip the block when different), `ld nr`, one `jeq` per
        // ioctl number jumping to the request check, `ret ALLOW`. Then the unknown-arch refusal,
        // the request check and the refusal.
        // Instructions after an architecture's `jeq`: `ld nr`, the ioctl `jeq`s, `ret ALLOW`.
        let block_len = |nrs: &[u32]| nrs.len() + 2;
        let mut p = vec![stmt(LD_W_ABS, OFF_ARCH)];
        let blocks = [NATIVE, COMPAT];
        let total_blocks: usize = blocks.iter().map(|(_, n)| 1 + block_len(n)).sum();
        let mut pos = 1usize;
        for (arch, nrs) in blocks {
            let len = block_len(nrs);
            p.push(jeq(arch, 0, len as u8));
            p.push(stmt(LD_W_ABS, OFF_NR));
            pos += 2;
            // The request check follows the blocks and the unknown-arch `ret`.
            let check = 1 + total_blocks + 1;
            for nr in nrs {
                p.push(jeq(*nr, (check - (pos + 1)) as u8, 0));
                pos += 1;
            }
            p.push(stmt(RET_K, ALLOW));
            pos += 1;
        }
        p.push(stmt(RET_K, ERRNO | libc::ENOSYS as u32));
        p.push(stmt(LD_W_ABS, OFF_ARG1_LO));
        p.push(jeq(TIOCSTI, 2, 0));
        p.push(jeq(TIOCLINUX, 1, 0));
        p.push(stmt(RET_K, ALLOW));
        p.push(stmt(RET_K, ERRNO | libc::EPERM as u32));
        p
    }

    pub fn install() -> Result<(), TtyGuardError> {
        let mut prog = program();
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: prctl with integer arguments; no memory is passed.
        let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        if nnp != 0 {
            return Err(TtyGuardError::Install(std::io::Error::last_os_error()));
        }
        // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies it.
        let rc = unsafe {
            libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER as libc::c_ulong,
                &fprog as *const libc::sock_fprog as libc::c_ulong,
                0,
                0,
            )
        };
        if rc != 0 {
            return Err(TtyGuardError::Install(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// Install the filter on the calling thread (and everything it `exec`s or forks afterwards).
pub fn install() -> Result<(), TtyGuardError> {
    #[cfg(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    ))]
    {
        imp::install()
    }
    #[cfg(not(all(
        target_os = "linux",
        any(target_arch = "x86_64", target_arch = "aarch64")
    )))]
    {
        Err(TtyGuardError::UnsupportedArch)
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod tests {
    use super::*;

    /// A tiny interpreter of the instructions the program uses.
    fn decide(p: &[libc::sock_filter], nr: u32, arch: u32, arg1: u32) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = &p[pc];
            match ins.code {
                0x20 => {
                    acc = match ins.k {
                        0 => nr,
                        4 => arch,
                        24 => arg1,
                        // No other offset is loaded; a marker value fails the comparison.
                        _ => u32::MAX,
                    };
                    pc += 1;
                }
                0x15 => pc += 1 + if acc == ins.k { ins.jt } else { ins.jf } as usize,
                0x06 => return ins.k,
                // An opcode the program never uses: no return value can match a case.
                _ => return u32::MAX,
            }
        }
    }

    #[test]
    fn the_program_refuses_exactly_the_injection_ioctls() {
        let p = imp::program();
        let eperm = 0x0005_0000 | libc::EPERM as u32;
        let enosys = 0x0005_0000 | libc::ENOSYS as u32;
        let allow = 0x7fff_0000;
        #[cfg(target_arch = "x86_64")]
        let cases = [
            (16, 0xc000_003e, TIOCSTI, eperm),
            (16, 0xc000_003e, TIOCLINUX, eperm),
            (16, 0xc000_003e, 0x5401, allow),
            (0x4000_0000 | 514, 0xc000_003e, TIOCSTI, eperm),
            (0, 0xc000_003e, TIOCSTI, allow),
            (54, 0x4000_0003, TIOCSTI, eperm),
            (54, 0x4000_0003, 0x5401, allow),
            (16, 0x4000_0003, TIOCSTI, allow),
            (16, 0x1234, TIOCSTI, enosys),
        ];
        #[cfg(target_arch = "aarch64")]
        let cases = [
            (29, 0xc000_00b7, TIOCSTI, eperm),
            (29, 0xc000_00b7, 0x5401, allow),
            (54, 0x4000_0028, TIOCSTI, eperm),
            (16, 0x1234, TIOCSTI, enosys),
        ];
        for (nr, arch, arg, want) in cases {
            assert_eq!(
                decide(&p, nr, arch, arg),
                want,
                "nr {nr} arch {arch:#x} arg {arg:#x}"
            );
        }
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        let p = imp::program();
        for (i, ins) in p.iter().enumerate() {
            if ins.code == 0x15 {
                assert!(i + 1 + (ins.jt as usize) < p.len(), "jt at {i}");
                assert!(i + 1 + (ins.jf as usize) < p.len(), "jf at {i}");
            }
        }
        assert_eq!(p.last().unwrap().code, 0x06);
    }

    #[test]
    fn tiocsti_is_refused_and_other_ioctls_pass_on_the_filtered_thread() {
        // The test harness runs each test on its own thread and the filter (without TSYNC)
        // applies to that thread only, so the rest of the test binary is unaffected.
        let outcome = std::thread::spawn(|| {
            install().unwrap();
            let null = std::fs::File::open("/dev/null").unwrap();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
            let byte = b'x';
            // SAFETY: ioctl on an fd we own, with a pointer to a live byte.
            let sti = unsafe { libc::ioctl(fd, TIOCSTI as _, &byte as *const u8) };
            let sti_err = std::io::Error::last_os_error().raw_os_error();
            let mut n: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int to `n`.
            let _ = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
            let fionread_err = std::io::Error::last_os_error().raw_os_error();
            (sti, sti_err, fionread_err)
        })
        .join()
        .unwrap();
        assert_eq!(outcome.0, -1);
        assert_eq!(outcome.1, Some(libc::EPERM), "TIOCSTI must fail with EPERM");
        // /dev/null is not a terminal: FIONREAD reaches the driver (ENOTTY/EINVAL), not EPERM.
        assert_ne!(outcome.2, Some(libc::EPERM));
    }
}
