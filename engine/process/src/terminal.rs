//! Terminal hand-over for interactive runs, as a job-control shell does it.
//!
//! When stdin is the controlling terminal and agentdiff is in its foreground, the command's process
//! group becomes the terminal's foreground group: Ctrl-C, Ctrl-Z and window-size changes reach the
//! command, and it can open `/dev/tty`. agentdiff takes the terminal back (and restores its
//! attributes) when the command stops or ends.

#[cfg(unix)]
mod imp {
    use std::os::fd::RawFd;

    const TTY: RawFd = libc::STDIN_FILENO;

    /// Run `f` with SIGTTOU blocked in this thread: `tcsetpgrp` from a background process group
    /// would otherwise stop the whole process.
    fn with_ttou_blocked<R>(f: impl FnOnce() -> R) -> R {
        // SAFETY: sigset manipulation on local values; pthread_sigmask affects this thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTTOU);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            let r = f();
            libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            r
        }
    }

    /// The controlling terminal while a command owns its foreground.
    #[derive(Debug)]
    pub struct Terminal {
        saved: libc::termios,
        our_pgrp: libc::pid_t,
        /// The command's terminal attributes when it was stopped, restored when it continues.
        child_modes: Option<libc::termios>,
    }

    impl Terminal {
        /// `Some` when stdin is a terminal whose foreground group is agentdiff's own.
        pub fn acquire() -> Option<Terminal> {
            // SAFETY: isatty/tcgetpgrp/getpgrp/tcgetattr on fd 0 with a local termios.
            unsafe {
                if libc::isatty(TTY) != 1 {
                    return None;
                }
                let our_pgrp = libc::getpgrp();
                if libc::tcgetpgrp(TTY) != our_pgrp {
                    // We run in the background: the terminal is not ours to hand over.
                    return None;
                }
                let mut saved: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(TTY, &mut saved) != 0 {
                    return None;
                }
                Some(Terminal {
                    saved,
                    our_pgrp,
                    child_modes: None,
                })
            }
        }

        /// Make `pgid` the foreground process group.
        pub fn give_to(&self, pgid: libc::pid_t) {
            give_foreground(pgid);
        }

        /// The command stopped (Ctrl-Z): remember its modes, take the terminal back and restore
        /// ours.
        pub fn command_stopped(&mut self) {
            // SAFETY: tcgetattr into a local termios.
            unsafe {
                let mut modes: libc::termios = std::mem::zeroed();
                if libc::tcgetattr(TTY, &mut modes) == 0 {
                    self.child_modes = Some(modes);
                }
            }
            self.restore();
        }

        /// The command continues: hand the terminal back with its own modes, but only when
        /// agentdiff was continued in the foreground (`fg`); after `bg` both run in the
        /// background, as a job-control shell would have it.
        pub fn command_continues(&mut self, pgid: libc::pid_t) {
            // SAFETY: tcgetpgrp/getpgrp on fd 0.
            let foreground = unsafe { libc::tcgetpgrp(TTY) == libc::getpgrp() };
            if !foreground {
                return;
            }
            if let Some(modes) = self.child_modes.take() {
                // SAFETY: tcsetattr from a termios previously read by tcgetattr.
                with_ttou_blocked(|| unsafe { libc::tcsetattr(TTY, libc::TCSADRAIN, &modes) });
            }
            self.give_to(pgid);
        }

        /// Take the foreground back and restore the attributes agentdiff started with.
        pub fn restore(&self) {
            // SAFETY: tcsetpgrp/tcsetattr on fd 0 with SIGTTOU blocked in this thread.
            with_ttou_blocked(|| unsafe {
                libc::tcsetpgrp(TTY, self.our_pgrp);
                libc::tcsetattr(TTY, libc::TCSADRAIN, &self.saved);
            });
        }
    }

    impl Drop for Terminal {
        fn drop(&mut self) {
            self.restore();
        }
    }

    /// Make `pgid` the foreground process group of agentdiff's terminal (the one a [`Terminal`]
    /// was acquired for).
    pub fn give_foreground(pgid: libc::pid_t) {
        // SAFETY: tcsetpgrp on fd 0 with SIGTTOU blocked in this thread.
        with_ttou_blocked(|| unsafe { libc::tcsetpgrp(TTY, pgid) });
    }

    /// In the forked child, before `exec`: make the child's own (new) process group the
    /// terminal's foreground group. Only async-signal-safe calls.
    pub fn child_take_foreground() -> std::io::Result<()> {
        // SAFETY: single-threaded child after fork; sigprocmask/tcsetpgrp/getpgrp are
        // async-signal-safe.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTTOU);
            libc::sigprocmask(libc::SIG_BLOCK, &set, &mut old);
            let rc = libc::tcsetpgrp(TTY, libc::getpgrp());
            let err = std::io::Error::last_os_error();
            libc::sigprocmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
            if rc != 0 {
                return Err(err);
            }
        }
        Ok(())
    }

    /// Stop agentdiff itself the way a job-control shell expects (after the command stopped),
    /// returning when agentdiff is continued.
    pub fn stop_self() {
        // SAFETY: signal to our own process group.
        unsafe {
            libc::kill(0, libc::SIGTSTP);
        }
    }
}

#[cfg(unix)]
pub use imp::{child_take_foreground, give_foreground, stop_self, Terminal};
