//! The exec shim's seccomp filter, installed just before it `exec`s the command: it refuses the
//! kernel interfaces through which a sandboxed command could reach past its sandbox without
//! touching the filesystem or the network namespace.
//!
//! - `ioctl` with `TIOCSTI` (push input into the terminal) or `TIOCLINUX` (console subcommands,
//!   among them pasting the selection) fails with `EPERM`: an interactive run keeps the caller's
//!   terminal, so the command could otherwise type into the caller's shell.
//! - `socket(AF_VSOCK, …)` fails with `EAFNOSUPPORT`, as on a kernel without vsock: vsock belongs
//!   to no network namespace, so on a virtual machine the command could otherwise talk to the
//!   hypervisor host's listeners past an unshared or filtered network.
//! - `io_uring_setup` fails with `ENOSYS`, as on a kernel without io_uring: a ring's
//!   `IORING_OP_SOCKET` creates sockets this filter never sees (programs fall back to plain calls).
//! - On the 32-bit compat ABI, `socketcall(SYS_SOCKET, …)` fails with `EAFNOSUPPORT`: its address
//!   family lies in memory a seccomp filter cannot read. 32-bit programs whose C library creates
//!   sockets through `socketcall` get none; the direct `socket` call is decided as on 64 bits.
//! - `keyctl`, `add_key` and `request_key` fail with `ENOSYS`, as on a kernel without keys: no
//!   mount hides the kernel's keyrings, and where the sandbox has no user namespace of its own
//!   (bwrap run by root) the command could otherwise read what the user keeps there (Kerberos
//!   tickets in a `KEYRING:` cache, tokens stored with `keyctl`). A user namespace already makes
//!   the caller's keys unfindable (measured); the filter makes it so in every case.
//! - `ptrace` of pid 1, and `process_vm_readv`, `process_vm_writev` and `pidfd_open` on pid 1,
//!   fail with `EPERM`. Under bwrap (and srt, which runs bwrap), pid 1 is bubblewrap's init: the
//!   only process of the sandbox outside this filter (it starts the shim), of the same user and
//!   traceable, so a command that
//!   drove it would make every call above unfiltered. (bwrap also covers `/proc/1/mem` and
//!   `/proc/1/task/1/mem`, which give the same access without a syscall to check.) Tracing any
//!   other process of the sandbox is left alone: they all run under this filter.
//!
//! The filter is inherited by every descendant and cannot be removed.
//!
//! Invariants: on the native architecture and its compat ABIs (x86_64: x32 and i386; aarch64:
//! arm) exactly the calls above are refused and everything else is allowed; a syscall from any
//! other architecture fails with `ENOSYS`, so an unknown ABI never bypasses the filter. Arguments
//! are compared on their low 32 bits, which is all the kernel reads of them (an `int` family or
//! pid, an `unsigned int` ioctl request), so high bits cannot disguise a value.
//! Not defended: other terminal ioctls, terminals the command opens that are not the caller's
//! (they are its own), sockets of other families (the network namespace decides those), and a
//! vsock or io_uring descriptor passed in from outside (the shim closes every inherited
//! descriptor above 2 before `exec`).

/// What the filter refuses, in one line: recorded in the runtime configuration of every backend
/// whose shim installs it.
pub const SUMMARY: &str = "installed by the exec shim: ioctl TIOCSTI and TIOCLINUX refused \
                           (EPERM), socket(AF_VSOCK) refused (EAFNOSUPPORT), io_uring_setup \
                           refused (ENOSYS), 32-bit socketcall(SYS_SOCKET) refused, keyctl, \
                           add_key and request_key refused (ENOSYS), ptrace, \
                           process_vm_readv/writev and pidfd_open of pid 1 (bwrap's init) \
                           refused (EPERM)";

/// `TIOCSTI`: push a byte into the terminal's input queue.
pub const TIOCSTI: u32 = 0x5412;
/// `TIOCLINUX`: console subcommands (among them, pasting the selection).
pub const TIOCLINUX: u32 = 0x541C;
/// `AF_VSOCK`: host/guest sockets of virtual machines.
pub const AF_VSOCK: u32 = 40;
/// `socketcall`'s call number for `socket`.
pub const SYS_SOCKET: u32 = 1;
/// The pid, in the sandbox's pid namespace, of the process outside the filter.
pub const UNFILTERED_PID: u32 = 1;

/// Errors installing the filter.
#[derive(Debug, thiserror::Error)]
pub enum SeccompGuardError {
    #[error("this architecture has no seccomp guard")]
    UnsupportedArch,
    #[error("the seccomp guard's program does not assemble: {0}")]
    Program(&'static str),
    #[error("could not install the seccomp filter: {0}")]
    Install(std::io::Error),
}

#[cfg(all(
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod imp {
    use super::{SeccompGuardError, AF_VSOCK, SYS_SOCKET, TIOCLINUX, TIOCSTI, UNFILTERED_PID};

    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const RET_K: u16 = 0x06;
    const OFF_NR: u32 = 0;
    const OFF_ARCH: u32 = 4;
    /// Low 32 bits of `args[0]` (little endian): `socket`'s family, `socketcall`'s call.
    const OFF_ARG0_LO: u32 = 16;
    /// Low 32 bits of `args[1]` (little endian): the ioctl request.
    const OFF_ARG1_LO: u32 = 24;
    const ALLOW: u32 = 0x7fff_0000;
    const ERRNO: u32 = 0x0005_0000;
    /// x32 syscalls carry this bit in their number (and x86_64's architecture value).
    #[cfg(target_arch = "x86_64")]
    const X32: u32 = 0x4000_0000;

    /// One ABI's architecture value and the numbers of the calls the filter looks at.
    pub(super) struct Abi {
        pub arch: u32,
        pub ioctl: &'static [u32],
        pub socket: &'static [u32],
        pub socketcall: Option<u32>,
        pub io_uring_setup: &'static [u32],
        /// `add_key`, `request_key` and `keyctl`.
        pub keys: &'static [u32],
        /// `ptrace`: the pid is its second argument.
        pub ptrace: &'static [u32],
        /// `process_vm_readv`, `process_vm_writev` and `pidfd_open`: the pid is the first.
        pub by_pid: &'static [u32],
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) const ABIS: [Abi; 2] = [
        Abi {
            arch: 0xc000_003e,
            ioctl: &[16, X32 | 514],
            socket: &[41, X32 | 41],
            socketcall: None,
            io_uring_setup: &[425, X32 | 425],
            keys: &[248, 249, 250, X32 | 248, X32 | 249, X32 | 250],
            ptrace: &[101, X32 | 521],
            by_pid: &[310, 311, X32 | 539, X32 | 540, 434, X32 | 434],
        },
        // i386
        Abi {
            arch: 0x4000_0003,
            ioctl: &[54],
            socket: &[359],
            socketcall: Some(102),
            io_uring_setup: &[425],
            keys: &[286, 287, 288],
            ptrace: &[26],
            by_pid: &[347, 348, 434],
        },
    ];
    #[cfg(target_arch = "aarch64")]
    pub(super) const ABIS: [Abi; 2] = [
        Abi {
            arch: 0xc000_00b7,
            ioctl: &[29],
            socket: &[198],
            socketcall: None,
            io_uring_setup: &[425],
            keys: &[217, 218, 219],
            ptrace: &[117],
            by_pid: &[270, 271, 434],
        },
        // arm (EABI has no socketcall; an OABI-compat kernel does)
        Abi {
            arch: 0x4000_0028,
            ioctl: &[54],
            socket: &[281],
            socketcall: Some(102),
            io_uring_setup: &[425],
            keys: &[309, 310, 311],
            ptrace: &[26],
            by_pid: &[376, 377, 434],
        },
    ];

    /// Where a jump goes.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Label {
        /// The block of `ABIS[i]` (`ABIS.len()`: the unknown-architecture refusal).
        Abi(usize),
        Ioctl,
        Socket,
        Socketcall,
        Ptrace,
        ByPid,
        NoSys,
        Perm,
        NoFamily,
    }

    /// The program before its jumps are resolved (classic BPF jumps only forward).
    enum Op {
        Mark(Label),
        Load(u32),
        /// Jump to `then` when the accumulator equals `k`, else to `otherwise` (`None`: the
        /// next instruction).
        Jeq {
            k: u32,
            then: Option<Label>,
            otherwise: Option<Label>,
        },
        Ret(u32),
    }

    /// The calls decided by an argument: their label, the argument read, the values refused and
    /// the answer those get.
    const ARGUMENT_CHECKS: [(Label, u32, &[u32], Label); 5] = [
        (
            Label::Ioctl,
            OFF_ARG1_LO,
            &[TIOCSTI, TIOCLINUX],
            Label::Perm,
        ),
        (Label::Socket, OFF_ARG0_LO, &[AF_VSOCK], Label::NoFamily),
        (
            Label::Socketcall,
            OFF_ARG0_LO,
            &[SYS_SOCKET],
            Label::NoFamily,
        ),
        (Label::Ptrace, OFF_ARG1_LO, &[UNFILTERED_PID], Label::Perm),
        (Label::ByPid, OFF_ARG0_LO, &[UNFILTERED_PID], Label::Perm),
    ];

    fn ops() -> Vec<Op> {
        use Op::*;
        let to = |k: u32, label: Label| Jeq {
            k,
            then: Some(label),
            otherwise: None,
        };
        let mut p = vec![Load(OFF_ARCH)];
        for (i, abi) in ABIS.iter().enumerate() {
            p.push(Mark(Label::Abi(i)));
            p.push(Jeq {
                k: abi.arch,
                then: None,
                otherwise: Some(Label::Abi(i + 1)),
            });
            p.push(Load(OFF_NR));
            p.extend(abi.ioctl.iter().map(|&nr| to(nr, Label::Ioctl)));
            p.extend(abi.socket.iter().map(|&nr| to(nr, Label::Socket)));
            p.extend(abi.socketcall.map(|nr| to(nr, Label::Socketcall)));
            p.extend(abi.io_uring_setup.iter().map(|&nr| to(nr, Label::NoSys)));
            p.extend(abi.keys.iter().map(|&nr| to(nr, Label::NoSys)));
            p.extend(abi.ptrace.iter().map(|&nr| to(nr, Label::Ptrace)));
            p.extend(abi.by_pid.iter().map(|&nr| to(nr, Label::ByPid)));
            p.push(Ret(ALLOW));
        }
        p.push(Mark(Label::Abi(ABIS.len())));
        p.push(Mark(Label::NoSys));
        p.push(Ret(ERRNO | libc::ENOSYS as u32));
        for (label, arg, refused, outcome) in ARGUMENT_CHECKS {
            p.push(Mark(label));
            p.push(Load(arg));
            p.extend(refused.iter().map(|&k| to(k, outcome)));
            p.push(Ret(ALLOW));
        }
        p.push(Mark(Label::Perm));
        p.push(Ret(ERRNO | libc::EPERM as u32));
        p.push(Mark(Label::NoFamily));
        p.push(Ret(ERRNO | libc::EAFNOSUPPORT as u32));
        p
    }

    /// The program (see the module documentation for what it decides), its jumps resolved.
    pub fn program() -> Result<Vec<libc::sock_filter>, SeccompGuardError> {
        let ops = ops();
        let mut at = Vec::new();
        let mut pos = 0usize;
        for op in &ops {
            match op {
                Op::Mark(label) => at.push((*label, pos)),
                _ => pos += 1,
            }
        }
        let find = |label: Label| at.iter().find(|(l, _)| *l == label).map(|(_, p)| *p);
        // Offset from the instruction after `from` to `label`: forward and within a byte.
        let offset = |from: usize, label: Option<Label>| -> Result<u8, SeccompGuardError> {
            let Some(label) = label else { return Ok(0) };
            let target = find(label).ok_or(SeccompGuardError::Program("a jump has no target"))?;
            target
                .checked_sub(from + 1)
                .and_then(|d| u8::try_from(d).ok())
                .ok_or(SeccompGuardError::Program(
                    "a jump goes backwards or too far",
                ))
        };
        let mut out = Vec::with_capacity(pos);
        for op in &ops {
            let here = out.len();
            let (code, jt, jf, k) = match op {
                Op::Mark(_) => continue,
                Op::Load(off) => (LD_W_ABS, 0, 0, *off),
                Op::Jeq { k, then, otherwise } => {
                    (JEQ_K, offset(here, *then)?, offset(here, *otherwise)?, *k)
                }
                Op::Ret(v) => (RET_K, 0, 0, *v),
            };
            out.push(libc::sock_filter { code, jt, jf, k });
        }
        Ok(out)
    }

    pub fn install() -> Result<(), SeccompGuardError> {
        let mut prog = program()?;
        let len = u16::try_from(prog.len())
            .map_err(|_| SeccompGuardError::Program("the program is too long"))?;
        let fprog = libc::sock_fprog {
            len,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: prctl with integer arguments; no memory is passed.
        let nnp = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        if nnp != 0 {
            return Err(SeccompGuardError::Install(std::io::Error::last_os_error()));
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
            return Err(SeccompGuardError::Install(std::io::Error::last_os_error()));
        }
        Ok(())
    }
}

/// Install the filter on the calling thread (and everything it `exec`s or forks afterwards).
pub fn install() -> Result<(), SeccompGuardError> {
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
        Err(SeccompGuardError::UnsupportedArch)
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    any(target_arch = "x86_64", target_arch = "aarch64")
))]
mod tests {
    use super::*;

    const ALLOWED: u32 = 0x7fff_0000;
    const EPERM: u32 = 0x0005_0000 | libc::EPERM as u32;
    const ENOSYS: u32 = 0x0005_0000 | libc::ENOSYS as u32;
    const NOFAMILY: u32 = 0x0005_0000 | libc::EAFNOSUPPORT as u32;

    /// A tiny interpreter of the instructions the program uses.
    fn decide(p: &[libc::sock_filter], nr: u32, arch: u32, arg0: u32, arg1: u32) -> u32 {
        let mut acc = 0u32;
        let mut pc = 0usize;
        loop {
            let ins = &p[pc];
            match ins.code {
                0x20 => {
                    acc = match ins.k {
                        0 => nr,
                        4 => arch,
                        16 => arg0,
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
    fn every_abi_refuses_exactly_the_listed_calls() {
        let p = imp::program().unwrap();
        for abi in &imp::ABIS {
            let at = |nr, a0, a1| decide(&p, nr, abi.arch, a0, a1);
            for &nr in abi.ioctl {
                assert_eq!(at(nr, 0, TIOCSTI), EPERM, "ioctl {nr} TIOCSTI");
                assert_eq!(at(nr, 0, TIOCLINUX), EPERM, "ioctl {nr} TIOCLINUX");
                assert_eq!(at(nr, 0, 0x5401), ALLOWED, "ioctl {nr} TCGETS");
            }
            for &nr in abi.socket {
                assert_eq!(at(nr, AF_VSOCK, 0), NOFAMILY, "socket {nr} AF_VSOCK");
                for family in [
                    libc::AF_UNIX,
                    libc::AF_INET,
                    libc::AF_INET6,
                    libc::AF_NETLINK,
                ] {
                    assert_eq!(at(nr, family as u32, 0), ALLOWED, "socket {nr} {family}");
                }
            }
            if let Some(nr) = abi.socketcall {
                assert_eq!(at(nr, SYS_SOCKET, 0), NOFAMILY, "socketcall SYS_SOCKET");
                // SYS_CONNECT: a socket that exists is the network namespace's business.
                assert_eq!(at(nr, 3, 0), ALLOWED, "socketcall SYS_CONNECT");
            }
            for &nr in abi.io_uring_setup {
                assert_eq!(at(nr, 8, 0), ENOSYS, "io_uring_setup {nr}");
            }
            for &nr in abi.keys {
                assert_eq!(at(nr, 10, 0), ENOSYS, "key call {nr}");
            }
            for &nr in abi.ptrace {
                // PTRACE_ATTACH (16) and PTRACE_PEEKDATA (2) of pid 1; of pid 2 they pass.
                assert_eq!(at(nr, 16, UNFILTERED_PID), EPERM, "ptrace {nr} attach 1");
                assert_eq!(at(nr, 2, UNFILTERED_PID), EPERM, "ptrace {nr} peek 1");
                assert_eq!(at(nr, 16, 2), ALLOWED, "ptrace {nr} attach 2");
                assert_eq!(at(nr, 0, 0), ALLOWED, "ptrace {nr} TRACEME");
            }
            for &nr in abi.by_pid {
                assert_eq!(at(nr, UNFILTERED_PID, 0), EPERM, "{nr} on pid 1");
                assert_eq!(at(nr, 2, UNFILTERED_PID), ALLOWED, "{nr} on pid 2");
            }
        }
        // The arguments matter only for the calls above: `read` with any of them passes.
        #[cfg(target_arch = "x86_64")]
        let reads = [0, 3];
        #[cfg(target_arch = "aarch64")]
        let reads = [63, 3];
        for (abi, read) in imp::ABIS.iter().zip(reads) {
            let got = decide(&p, read, abi.arch, AF_VSOCK, TIOCSTI);
            assert_eq!(got, ALLOWED, "read on {:#x}", abi.arch);
        }
        // Another architecture's calls are refused whatever they are.
        assert_eq!(decide(&p, 16, 0x1234, 0, TIOCSTI), ENOSYS);
        assert_eq!(decide(&p, 0, 0x1234, 0, 0), ENOSYS);
        // One ABI's numbers are not decided by the other's table.
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(decide(&p, 16, 0x4000_0003, 0, TIOCSTI), ALLOWED);
            assert_eq!(decide(&p, 359, 0xc000_003e, AF_VSOCK, 0), ALLOWED);
        }
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        let p = imp::program().unwrap();
        for (i, ins) in p.iter().enumerate() {
            if ins.code == 0x15 {
                assert!(i + 1 + (ins.jt as usize) < p.len(), "jt at {i}");
                assert!(i + 1 + (ins.jf as usize) < p.len(), "jf at {i}");
            }
        }
        assert_eq!(p.last().unwrap().code, 0x06);
    }

    /// What the filtered thread saw: (TIOCSTI errno, FIONREAD errno, AF_VSOCK socket errno,
    /// AF_UNIX socket result, io_uring_setup errno).
    #[allow(clippy::unwrap_used)]
    fn filtered_calls() -> (Option<i32>, Option<i32>, Option<i32>, bool, Option<i32>) {
        let errno = || std::io::Error::last_os_error().raw_os_error();
        let null = std::fs::File::open("/dev/null").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&null);
        let byte = b'x';
        // SAFETY: ioctl on an fd we own, with a pointer to a live byte.
        let sti = unsafe { libc::ioctl(fd, TIOCSTI as _, &byte as *const u8) };
        assert_eq!(sti, -1);
        let sti = errno();
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int to `n`.
        let _ = unsafe { libc::ioctl(fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
        let fionread = errno();
        // SAFETY: socket(2) with integer arguments; a returned descriptor is closed below.
        let vsock = unsafe { libc::socket(libc::AF_VSOCK, libc::SOCK_STREAM, 0) };
        let vsock_err = errno();
        // SAFETY: as above.
        let unix = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
        for fd in [vsock, unix] {
            if fd >= 0 {
                // SAFETY: a descriptor this function created and nothing else holds.
                unsafe { libc::close(fd) };
            }
        }
        // On pid 1 (outside any sandbox here: only calls that change nothing). Zero-length
        // vectors: a permitted call returns 0.
        // SAFETY: process_vm_readv with no iovecs touches no memory.
        let vm = unsafe { libc::process_vm_readv(1, std::ptr::null(), 0, std::ptr::null(), 0, 0) };
        let vm_err = errno();
        assert_eq!(vm, -1, "process_vm_readv on pid 1 was allowed");
        assert_eq!(vm_err, Some(libc::EPERM));
        // SAFETY: pidfd_open(2) with integer arguments; a returned descriptor is closed.
        let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, 1, 0) };
        let pidfd_err = errno();
        if pidfd >= 0 {
            // SAFETY: a descriptor this function created.
            unsafe { libc::close(pidfd as libc::c_int) };
        }
        assert_eq!((pidfd, pidfd_err), (-1, Some(libc::EPERM)), "pidfd_open(1)");
        // KEYCTL_GET_KEYRING_ID of the user keyring, without creating it.
        // SAFETY: keyctl(2) with integer arguments.
        let keys = unsafe { libc::syscall(libc::SYS_keyctl, 0, -4, 0) };
        assert_eq!((keys, errno()), (-1, Some(libc::ENOSYS)), "keyctl");
        let mut params = [0u8; 120];
        // SAFETY: io_uring_setup(2) reads and writes the 120-byte `io_uring_params` at `params`.
        let ring = unsafe { libc::syscall(libc::SYS_io_uring_setup, 1, params.as_mut_ptr()) };
        let ring_err = errno();
        if ring >= 0 {
            // SAFETY: as above.
            unsafe { libc::close(ring as libc::c_int) };
        }
        (
            sti,
            fionread,
            (vsock < 0).then_some(vsock_err).flatten(),
            unix >= 0,
            (ring < 0).then_some(ring_err).flatten(),
        )
    }

    #[test]
    fn the_filtered_thread_is_refused_exactly_the_listed_calls() {
        // The test harness runs each test on its own thread and the filter (without TSYNC)
        // applies to that thread only, so the rest of the test binary is unaffected.
        let (sti, fionread, vsock, unix, ring) = std::thread::spawn(|| {
            install().unwrap();
            filtered_calls()
        })
        .join()
        .unwrap();
        assert_eq!(sti, Some(libc::EPERM), "TIOCSTI must fail with EPERM");
        // /dev/null is not a terminal: FIONREAD reaches the driver (ENOTTY/EINVAL), not EPERM.
        assert_ne!(fionread, Some(libc::EPERM));
        assert_eq!(vsock, Some(libc::EAFNOSUPPORT), "AF_VSOCK must be refused");
        assert!(unix, "an AF_UNIX socket is still created");
        assert_eq!(ring, Some(libc::ENOSYS), "io_uring_setup must be refused");
    }
}
