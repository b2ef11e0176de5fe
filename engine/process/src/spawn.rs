//! Starting the command directly inside its run cgroup with `clone3(CLONE_INTO_CGROUP |
//! CLONE_PIDFD)`.
//!
//! Moving a running process into a cgroup (`cgroup.procs`) takes a lock whose writer waits for an
//! RCU grace period: 2–25 ms here, on every run. Being born in the cgroup costs nothing extra, and
//! the pidfd comes with the child. The child side only makes async-signal-safe system calls on
//! data prepared before the clone.
//!
//! On x86_64 the child shares agentdiff's memory until it `exec`s (`CLONE_VM | CLONE_VFORK`, on a
//! stack of its own, as `posix_spawn` starts a child): no copy of agentdiff's page tables to make
//! and tear down again. Invariants: the calling thread is suspended until the child has exec'd or
//! exited; every signal is blocked across the clone and the child resets caught signals to their
//! default before it unblocks them, so none of agentdiff's handlers runs on the shared memory.
//! The child calls no libc function that takes a lock (another thread of agentdiff's may hold
//! it), and its stack has a guard page, so an overflow faults in the child. Not defended: a
//! change that makes the child call one.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::ProcessError;

const CLONE_PIDFD: u64 = 0x0000_1000;
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` (version 2, 88 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What to start, prepared for the child.
pub struct SpawnRequest<'a> {
    pub program: &'a OsStr,
    pub args: &'a [OsString],
    pub env: &'a [(OsString, OsString)],
    pub cwd: &'a Path,
    /// Replacement for fds 0, 1, 2 (`None` = inherit).
    pub stdio: &'a [Option<OwnedFd>; 3],
    /// Make the child's process group the terminal's foreground group.
    pub foreground: bool,
}

/// Why clone3 could not be used (the caller falls back to fork + `cgroup.procs`).
#[derive(Debug)]
pub enum SpawnError {
    /// clone3 or CLONE_INTO_CGROUP is not available here.
    Unsupported(std::io::Error),
    /// The command could not be started.
    Failed(ProcessError),
}

fn cstr(bytes: &[u8], what: &str) -> Result<CString, ProcessError> {
    CString::new(bytes).map_err(|_| ProcessError::Spawn {
        program: what.to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{what} contains a NUL byte"),
        ),
    })
}

/// Resolve `program` like `execvp` would with the child's `PATH`.
pub fn resolve_program(
    program: &OsStr,
    env: &[(OsString, OsString)],
    cwd: &Path,
) -> Result<PathBuf, ProcessError> {
    let not_found = |msg: String| ProcessError::Spawn {
        program: program.to_string_lossy().into_owned(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, msg),
    };
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    for dir in std::env::split_paths(&path) {
        let dir = if dir.as_os_str().is_empty() {
            cwd.to_path_buf()
        } else if dir.is_relative() {
            cwd.join(dir)
        } else {
            dir
        };
        let candidate = dir.join(program);
        if let Ok(meta) = std::fs::metadata(&candidate) {
            use std::os::unix::fs::PermissionsExt;
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return Ok(candidate);
            }
        }
    }
    Err(not_found("not found on the command's PATH".into()))
}

/// What the child needs, prepared before the clone: the child only reads it.
struct ChildPlan {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    foreground: bool,
    /// The exec-failure channel's write end: the child writes errno; EOF means exec succeeded.
    status: RawFd,
}

/// Start the command in the cgroup whose directory is open as `cgroup_dir`.
/// Returns the pid and its pidfd.
pub fn spawn_into_cgroup(
    req: SpawnRequest<'_>,
    cgroup_dir: RawFd,
) -> Result<(u32, OwnedFd), SpawnError> {
    let fail = SpawnError::Failed;
    let program_name = req.program.to_string_lossy().into_owned();
    let path = resolve_program(req.program, req.env, req.cwd).map_err(fail)?;
    let path_c = cstr(path.as_os_str().as_bytes(), "the program path").map_err(fail)?;
    let mut argv_c = Vec::with_capacity(req.args.len() + 1);
    argv_c.push(cstr(req.program.as_bytes(), "the program name").map_err(fail)?);
    for a in req.args {
        argv_c.push(cstr(a.as_bytes(), "an argument").map_err(fail)?);
    }
    let mut env_c = Vec::with_capacity(req.env.len());
    for (k, v) in req.env {
        let mut kv = k.as_bytes().to_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        env_c.push(cstr(&kv, "an environment variable").map_err(fail)?);
    }
    let cwd_c = cstr(req.cwd.as_os_str().as_bytes(), "the working directory").map_err(fail)?;
    let mut argv_p: Vec<*const libc::c_char> = argv_c.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    let mut env_p: Vec<*const libc::c_char> = env_c.iter().map(|c| c.as_ptr()).collect();
    env_p.push(std::ptr::null());

    let mut pipe = [0 as RawFd; 2];
    // SAFETY: pipe2 into a local array.
    if unsafe { libc::pipe2(pipe.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(fail(ProcessError::io(
            "an exec status pipe",
            std::io::Error::last_os_error(),
        )));
    }
    // SAFETY: fresh descriptors from pipe2, owned here.
    let (rd, wr) = unsafe { (OwnedFd::from_raw_fd(pipe[0]), OwnedFd::from_raw_fd(pipe[1])) };
    let plan = ChildPlan {
        path: path_c.as_ptr(),
        argv: argv_p.as_ptr(),
        envp: env_p.as_ptr(),
        cwd: cwd_c.as_ptr(),
        stdio: [0, 1, 2].map(|i| req.stdio[i].as_ref().map_or(-1, |f| f.as_raw_fd())),
        foreground: req.foreground,
        status: wr.as_raw_fd(),
    };
    let mut pidfd: libc::c_int = -1;
    let rc = clone_into(&plan, cgroup_dir, &mut pidfd);
    if rc < 0 {
        // Old kernel, seccomp, or a cgroup we may not create into: the caller falls back.
        return Err(SpawnError::Unsupported(std::io::Error::from_raw_os_error(
            -rc as i32,
        )));
    }
    let pid = rc as u32;
    drop(wr);
    // SAFETY: the kernel stored a new pidfd for the child.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    if let Some(errno) = exec_failure(&rd) {
        let mut status = 0;
        // SAFETY: reap the child that failed to exec.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        return Err(fail(ProcessError::Spawn {
            program: program_name,
            source: std::io::Error::from_raw_os_error(errno),
        }));
    }
    Ok((pid, pidfd))
}

/// The errno the child reported before it could exec, if it did.
fn exec_failure(rd: &OwnedFd) -> Option<i32> {
    let mut buf = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        // SAFETY: read into a local buffer from our pipe end.
        let n = unsafe { libc::read(rd.as_raw_fd(), buf[got..].as_mut_ptr().cast(), 4 - got) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
    }
    (got == 4).then(|| i32::from_ne_bytes(buf))
}

/// The child's stack for [`clone_into`]'s vfork-style clone: the libc calls before `exec` need
/// a few KiB.
#[cfg(target_arch = "x86_64")]
const CHILD_STACK: usize = 64 * 1024;

/// The vfork-style child's stack, mapped with an inaccessible guard page below it: the child
/// shares agentdiff's memory, so an overflow must fault in the child instead of writing over
/// whatever agentdiff keeps next to it.
#[cfg(target_arch = "x86_64")]
struct ChildStack {
    base: *mut libc::c_void,
    guard: usize,
}

#[cfg(target_arch = "x86_64")]
impl ChildStack {
    fn map() -> Option<ChildStack> {
        // SAFETY: sysconf has no preconditions.
        let guard = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?;
        let (prot, flags) = (
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
        );
        // SAFETY: a new anonymous mapping, owned by the returned value.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                guard + CHILD_STACK,
                prot,
                flags,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let stack = ChildStack { base, guard };
        // SAFETY: the lowest page of the mapping made above.
        (unsafe { libc::mprotect(base, guard, libc::PROT_NONE) } == 0).then_some(stack)
    }

    /// The usable part: its lowest address and its size (`clone3`'s `stack`, `stack_size`).
    fn usable(&self) -> (u64, u64) {
        (self.base as u64 + self.guard as u64, CHILD_STACK as u64)
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; the child has exec'd or exited.
        unsafe { libc::munmap(self.base, self.guard + CHILD_STACK) };
    }
}

/// `clone3` into the cgroup, the child running [`child_main`] on `plan`: the pid (in the parent),
/// or `-errno`.
///
/// On x86_64 the child shares agentdiff's memory and this thread waits until it has exec'd
/// (`CLONE_VM | CLONE_VFORK`, as `posix_spawn` does): a fork-like clone copies the page tables of
/// agentdiff's whole address space (0.3–0.7 ms of agentdiff's time in the clone here), which then
/// the child's `exec` tears down again and agentdiff's own next writes fault on. Every signal
/// is blocked around the clone, so no handler of agentdiff's runs in the child on shared memory;
/// the child resets caught signals to their default before it unblocks them. Elsewhere, or when
/// the kernel refuses that clone, a fork-like clone.
fn clone_into(plan: &ChildPlan, cgroup_dir: RawFd, pidfd: &mut libc::c_int) -> i64 {
    let mut args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir as u64,
        ..CloneArgs::default()
    };
    // SAFETY: a full and a saved signal set, local; the mask is restored below.
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
    }
    // Without a stack of its own (the mapping failed), the fork-like clone below.
    #[cfg(target_arch = "x86_64")]
    let rc = match ChildStack::map() {
        Some(stack) => {
            let (low, size) = stack.usable();
            let shared = CloneArgs {
                flags: args.flags | libc::CLONE_VM as u64 | libc::CLONE_VFORK as u64,
                stack: low,
                stack_size: size,
                ..args
            };
            // SAFETY: the child runs `child_main` on its own stack and execs or exits; this
            // thread is suspended until then, and `plan` and `stack` outlive the call.
            unsafe { clone3_on_stack(&shared, plan) }
        }
        None => -i64::from(libc::ENOSYS),
    };
    #[cfg(not(target_arch = "x86_64"))]
    let rc = -i64::from(libc::ENOSYS);
    let rc = if rc == -i64::from(libc::EINVAL) || rc == -i64::from(libc::ENOSYS) {
        args.flags = CLONE_PIDFD | CLONE_INTO_CGROUP;
        // SAFETY: clone3 without a new stack behaves like fork; the child only runs
        // `child_main` (async-signal-safe calls on data prepared before the clone).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if rc == 0 {
            child_main(plan as *const ChildPlan as *mut libc::c_void);
        }
        if rc < 0 {
            -i64::from(
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EINVAL),
            )
        } else {
            rc as i64
        }
    } else {
        rc
    };
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut()) };
    rc
}

/// The raw `clone3` with a new stack: the child calls `child_main(plan)` there (it never
/// returns); the parent gets the pid or `-errno`.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_on_stack(args: &CloneArgs, plan: &ChildPlan) -> i64 {
    let entry: extern "C" fn(*mut libc::c_void) -> ! = child_main;
    let ret: i64;
    // rcx and r11 are clobbered by `syscall`; r12 and r13 survive it into the child.
    // SAFETY: the caller's contract; the child never returns into Rust code on this stack.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "and rsp, -16",
            "mov rdi, r13",
            "call r12",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") args as *const CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            in("r12") entry,
            in("r13") plan as *const ChildPlan,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The child, between the clone and `exec`: async-signal-safe system calls only, on data the
/// parent prepared; no allocation, no lock, no panic. Reports errno on the status pipe and exits
/// 127 when a step fails.
extern "C" fn child_main(plan: *mut libc::c_void) -> ! {
    // SAFETY: `plan` is the parent's ChildPlan, alive until this child execs or exits.
    unsafe {
        let p = &*(plan as *const ChildPlan);
        let report = |err: i32| -> ! {
            let bytes = err.to_ne_bytes();
            libc::write(p.status, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127)
        };
        // Every signal is still blocked (inherited from the parent's clone).
        if libc::setpgid(0, 0) != 0 {
            report(*libc::__errno_location());
        }
        if p.foreground {
            // SIGTTOU is blocked: a background group may take the terminal.
            libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpgrp());
        }
        for (target, src) in p.stdio.iter().enumerate() {
            if *src >= 0 && libc::dup2(*src, target as RawFd) < 0 {
                report(*libc::__errno_location());
            }
        }
        if libc::chdir(p.cwd) != 0 {
            report(*libc::__errno_location());
        }
        // agentdiff's handlers must not run here, on its memory: caught signals get their
        // default back (as exec would give them) before anything is unblocked.
        for sig in 1..65 {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_DFL
                && old.sa_sigaction != libc::SIG_IGN
            {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        // Rust ignores SIGPIPE in its own process; the command gets the default back.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        libc::execve(p.path, p.argv, p.envp);
        report(*libc::__errno_location())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn cgroup() -> Option<crate::cgroup::RunCgroup> {
        crate::cgroup::RunCgroup::create()
            .map_err(|e| {
                agentdiff_test_support::skip(&format!("no run cgroup can be created here: {e}"))
            })
            .ok()
    }

    fn blocked_now() -> libc::sigset_t {
        // SAFETY: reads this thread's mask into a local set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_SETMASK, std::ptr::null(), &mut set);
            set
        }
    }

    fn is_blocked(set: &libc::sigset_t, sig: i32) -> bool {
        // SAFETY: a query of a local set.
        unsafe { libc::sigismember(set, sig) == 1 }
    }

    /// Runs `program args` in `cg` from `cwd` with stdout to a pipe: (wait status, stdout).
    fn run_in(
        cg: &crate::cgroup::RunCgroup,
        cwd: &Path,
        program: &str,
        args: &[&str],
    ) -> (i32, String) {
        let (mut out_r, out_w) = std::io::pipe().unwrap();
        let stdio = [None, Some(OwnedFd::from(out_w)), None];
        let env = vec![
            (OsString::from("PATH"), OsString::from("/usr/bin:/bin")),
            (OsString::from("SPAWN_TEST"), OsString::from("a b")),
        ];
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let req = SpawnRequest {
            program: OsStr::new(program),
            args: &args,
            env: &env,
            cwd,
            stdio: &stdio,
            foreground: false,
        };
        let spawned = spawn_into_cgroup(req, cg.dir_fd()).map_err(|e| format!("{e:?}"));
        let (pid, _pidfd) = spawned.unwrap();
        drop(stdio);
        let mut out = String::new();
        out_r.read_to_string(&mut out).unwrap();
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        (status, out)
    }

    #[test]
    fn the_child_starts_in_its_cgroup_directory_and_stdio_with_signals_at_their_defaults() {
        let Some(cg) = cgroup() else { return };
        let dir = tempfile::tempdir().unwrap();
        let before = blocked_now();
        let (status, out) = run_in(&cg, dir.path(), "sh", &["-c", "pwd; echo \"$SPAWN_TEST\""]);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{out}"
        );
        let real = std::fs::canonicalize(dir.path()).unwrap();
        assert_eq!(out, format!("{}\na b\n", real.display()));
        // Straight from exec (no shell in between to reset anything): born in the cgroup,
        // nothing blocked, and SIGPIPE (ignored by Rust in agentdiff) back at its default.
        let (status, out) = run_in(
            &cg,
            dir.path(),
            "cat",
            &["/proc/self/cgroup", "/proc/self/status"],
        );
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "{out}"
        );
        assert!(out.contains(cg.rel()), "not born in {}: {out}", cg.rel());
        let field = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(field("SigBlk:"), 0, "{out}");
        assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{out}");
        // The caller's mask is as it was.
        let after = blocked_now();
        for sig in 1..32 {
            assert_eq!(
                is_blocked(&before, sig),
                is_blocked(&after, sig),
                "signal {sig}"
            );
        }
        cg.remove().unwrap();
    }

    #[test]
    fn a_program_that_cannot_be_executed_is_an_error_with_its_errno() {
        let Some(cg) = cgroup() else { return };
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("not-executable");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let stdio = [None, None, None];
        let req = SpawnRequest {
            program: script.as_os_str(),
            args: &[],
            env: &[],
            cwd: dir.path(),
            stdio: &stdio,
            foreground: false,
        };
        match spawn_into_cgroup(req, cg.dir_fd()) {
            Err(SpawnError::Failed(ProcessError::Spawn { source, .. })) => {
                assert_eq!(source.raw_os_error(), Some(libc::EACCES), "{source}")
            }
            other => panic!("{other:?}"),
        }
        cg.remove().unwrap();
    }

    #[test]
    fn programs_resolve_through_the_child_path() {
        let env = vec![(
            OsString::from("PATH"),
            OsString::from("/nonexistent:/bin:/usr/bin"),
        )];
        let p = resolve_program(OsStr::new("sh"), &env, Path::new("/")).unwrap();
        assert!(p.ends_with("sh"));
        assert_eq!(
            resolve_program(OsStr::new("./x"), &env, Path::new("/")).unwrap(),
            PathBuf::from("./x")
        );
        assert!(resolve_program(OsStr::new("no-such-program-xyz"), &env, Path::new("/")).is_err());
    }
}
