//! Starting the command directly inside its run cgroup with `clone3(CLONE_INTO_CGROUP |
//! CLONE_PIDFD)`.
//!
//! Moving a running process into a cgroup (`cgroup.procs`) takes a lock whose writer waits for an
//! RCU grace period: 2–25 ms here, on every run. Being born in the cgroup costs nothing extra, and
//! the pidfd comes with the child. The child side only makes async-signal-safe system calls on
//! data prepared before the clone.

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
    let stdio: [RawFd; 3] = [
        req.stdio[0].as_ref().map_or(-1, |f| f.as_raw_fd()),
        req.stdio[1].as_ref().map_or(-1, |f| f.as_raw_fd()),
        req.stdio[2].as_ref().map_or(-1, |f| f.as_raw_fd()),
    ];
    let foreground = req.foreground;

    // Exec-failure channel: the child writes errno; EOF means exec succeeded.
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
    let wr_fd = wr.as_raw_fd();

    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: CLONE_PIDFD | CLONE_INTO_CGROUP,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup_dir as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 without a new stack behaves like fork; the child only runs the
    // async-signal-safe block below and then execs or exits.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if rc == 0 {
        // Child.
        // SAFETY: async-signal-safe calls on data prepared before the clone.
        unsafe {
            let report = |err: i32| -> ! {
                let bytes = err.to_ne_bytes();
                libc::write(wr_fd, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(127)
            };
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            // Rust ignores SIGPIPE in its own process; the command gets the default back.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            if libc::setpgid(0, 0) != 0 {
                report(*libc::__errno_location());
            }
            if foreground {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, libc::SIGTTOU);
                libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
                libc::tcsetpgrp(libc::STDIN_FILENO, libc::getpgrp());
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            }
            for (target, src) in stdio.iter().enumerate() {
                if *src >= 0 && libc::dup2(*src, target as RawFd) < 0 {
                    report(*libc::__errno_location());
                }
            }
            if libc::chdir(cwd_c.as_ptr()) != 0 {
                report(*libc::__errno_location());
            }
            libc::execve(path_c.as_ptr(), argv_p.as_ptr(), env_p.as_ptr());
            report(*libc::__errno_location());
        }
    }
    if rc < 0 {
        // Old kernel, seccomp, or a cgroup we may not create into: the caller falls back.
        return Err(SpawnError::Unsupported(std::io::Error::last_os_error()));
    }
    let pid = rc as u32;
    drop(wr);
    // SAFETY: the kernel stored a new pidfd for the child.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    let mut buf = [0u8; 4];
    let mut got = 0;
    loop {
        // SAFETY: read into a local buffer from our pipe end.
        let n = unsafe { libc::read(rd.as_raw_fd(), buf[got..].as_mut_ptr().cast(), 4 - got) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if n <= 0 {
            break;
        }
        got += n as usize;
        if got == 4 {
            break;
        }
    }
    if got == 4 {
        let errno = i32::from_ne_bytes(buf);
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

#[cfg(test)]
mod tests {
    use super::*;

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
