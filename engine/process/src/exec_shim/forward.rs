//! The egress forwarder: for a sandbox whose network is `filtered`, the shim listens on the
//! sandbox's `127.0.0.1:PORT` and relays every connection to agentdiff's egress proxy through
//! its Unix socket (bound into the sandbox), before it starts the command.
//!
//! Invariants: the listener is bound before the command exists, so the command never races it;
//! the relay runs in a process detached from the command (a double fork: the sandbox's init
//! adopts it, so a command's `wait` never waits for it) with the standard streams on
//! `/dev/null` and no other inherited descriptor open (the start marker, the command's pipes); it
//! dies with the sandbox's pid namespace. It only moves bytes: every decision is the proxy's.
//!
//! Not defended: the command can connect to the Unix socket itself, or to the forwarder, with
//! any protocol; that is what the proxy is for. The command can kill the forwarder (same user):
//! it then loses its only route out, nothing more.

use std::ffi::OsStr;
use std::io::Read;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Environment variable (`PORT:SOCKET`) asking the shim to start the forwarder from the
/// sandbox's `127.0.0.1:PORT` to the proxy's Unix socket `SOCKET`; removed before `exec`.
pub const ENV_EGRESS_FORWARD: &str = "AGENTDIFF_EXEC_SHIM_EGRESS";

/// What the forwarder listens on and relays to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardSpec {
    pub port: u16,
    pub socket: PathBuf,
}

impl ForwardSpec {
    /// The variable's value.
    pub fn env_value(&self) -> std::ffi::OsString {
        let mut v = std::ffi::OsString::from(format!("{}:", self.port));
        v.push(self.socket.as_os_str());
        v
    }

    fn parse(value: &OsStr) -> Result<ForwardSpec, String> {
        let text = value
            .to_str()
            .ok_or("the egress forwarder's value is not UTF-8")?;
        let (port, socket) = text
            .split_once(':')
            .ok_or("the egress forwarder's value is not PORT:SOCKET")?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("bad egress forwarder port {port:?}"))?;
        if !socket.starts_with('/') {
            return Err(format!(
                "the egress socket {socket:?} is not an absolute path"
            ));
        }
        Ok(ForwardSpec {
            port,
            socket: PathBuf::from(socket),
        })
    }
}

/// Bind the listener and start the detached relay; returns once it listens. `Err` says why the
/// command must not start (it would have no route to the proxy the run promises).
pub(crate) fn start(value: &OsStr) -> Result<(), String> {
    let spec = ForwardSpec::parse(value)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, spec.port))
        .map_err(|e| format!("cannot listen on 127.0.0.1:{}: {e}", spec.port))?;
    // The proxy's socket must be there: a forwarder to nothing would fail every connection
    // silently. (Not a test connection: the proxy would count it as a malformed request.)
    let is_socket = std::fs::metadata(&spec.socket).map(|m| m.file_type().is_socket());
    if !matches!(is_socket, Ok(true)) {
        return Err(format!(
            "the egress proxy's socket {} is not in the sandbox",
            spec.socket.display()
        ));
    }
    // SAFETY: the shim is single-threaded here (it runs before anything starts a thread), so the
    // child may run ordinary code.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            // The middle process exits at once; its child is adopted by the sandbox's init.
            let _ = nix::sys::wait::waitpid(child, None);
            Ok(())
        }
        Ok(nix::unistd::ForkResult::Child) => {
            let _ = nix::unistd::setsid();
            // SAFETY: as above, one thread.
            if let Ok(nix::unistd::ForkResult::Child) = unsafe { nix::unistd::fork() } {
                detach(listener.as_raw_fd());
                serve(&listener, &spec.socket);
            }
            // SAFETY: _exit ends the middle (or failed) child without running the parent's
            // destructors or flushing its buffers twice.
            unsafe { libc::_exit(0) }
        }
        Err(e) => Err(format!("cannot start the egress forwarder: {e}")),
    }
}

/// Standard streams to `/dev/null`, every other descriptor but `keep` closed: the forwarder
/// must hold none of the command's pipes or the shim's FIFOs open.
fn detach(keep: i32) {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..=2 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds.into_iter().filter(|fd| *fd > 2 && *fd != keep) {
        let _ = nix::unistd::close(fd);
    }
}

fn serve(listener: &TcpListener, socket: &Path) -> ! {
    loop {
        let Ok((client, _)) = listener.accept() else {
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        };
        let socket = socket.to_path_buf();
        // One thread per direction; a connection the proxy refuses simply closes.
        let _ = std::thread::Builder::new().spawn(move || relay(client, &socket));
    }
}

fn relay(client: TcpStream, socket: &Path) {
    let Ok(upstream) = UnixStream::connect(socket) else {
        return;
    };
    let (Ok(client_w), Ok(upstream_r)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let back = std::thread::Builder::new().spawn(move || {
        copy(upstream_r, &client_w);
        let _ = client_w.shutdown(Shutdown::Write);
    });
    copy(&client, &upstream);
    let _ = upstream.shutdown(Shutdown::Write);
    if let Ok(back) = back {
        let _ = back.join();
    }
}

fn copy(mut from: impl Read, mut to: impl std::io::Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_value_round_trips_and_bad_values_are_refused() {
        let spec = ForwardSpec {
            port: 3128,
            socket: PathBuf::from("/tmp/d/egress.sock"),
        };
        assert_eq!(ForwardSpec::parse(&spec.env_value()), Ok(spec));
        for bad in ["", "3128", "0:/s", "x:/s", "3128:rel/s", "70000:/s"] {
            assert!(ForwardSpec::parse(OsStr::new(bad)).is_err(), "{bad}");
        }
    }
}
