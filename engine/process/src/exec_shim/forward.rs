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
//! The same relay also runs on the host side of a sandbox the shim cannot run in (a container
//! whose root filesystem has no C library for it): [`NetnsForwarder`] listens on the loopback of
//! another process's network namespace from a thread of agentdiff's own process, and refuses a
//! namespace that is agentdiff's own or has any interface besides `lo` (a route out the proxy
//! would not see). Its relays connect to the socket by path, which works from any network
//! namespace, so the socket itself need not enter the sandbox.
//!
//! Not defended: the command can connect to the Unix socket itself, or to the forwarder, with
//! any protocol; that is what the proxy is for. The command can kill the forwarder (same user):
//! it then loses its only route out, nothing more. A [`NetnsForwarder`] runs as agentdiff, out
//! of the command's reach; an interface added to the namespace after it started (by a process
//! holding `CAP_NET_ADMIN` there) is not noticed. Relays are bounded ([`MAX_RELAYS`]), so a
//! command that opens connections without end cannot make either forwarder start threads
//! without end.

use std::ffi::OsStr;
use std::io::Read;
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
                serve(&listener, &spec.socket, None, MAX_RELAYS);
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

/// At most this many relays at once; a connection beyond them is closed at once. Above the
/// proxy's own limit of concurrent clients (which counts what it refuses), it bounds the threads a
/// command can make the forwarder start: under the container backend they are agentdiff's own.
pub const MAX_RELAYS: usize = 1024;
/// Each relay's two threads only move bytes through a heap buffer.
const RELAY_STACK: usize = 256 * 1024;

/// Counts a relay while it lives.
struct RelaySlot(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for RelaySlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts until `stop` is set (never, without one), with at most `max_relays` relays at once.
fn serve(listener: &TcpListener, socket: &Path, stop: Option<&AtomicBool>, max_relays: usize) {
    let stopped = || stop.is_some_and(|s| s.load(Ordering::SeqCst));
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        if stopped() {
            return;
        }
        let Ok((client, _)) = listener.accept() else {
            if stopped() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        };
        if stopped() {
            return;
        }
        if live.fetch_add(1, Ordering::SeqCst) >= max_relays {
            live.fetch_sub(1, Ordering::SeqCst);
            drop(client);
            continue;
        }
        let slot = RelaySlot(live.clone());
        let socket = socket.to_path_buf();
        // One thread per direction; a connection the proxy refuses simply closes.
        let _ = std::thread::Builder::new()
            .stack_size(RELAY_STACK)
            .spawn(move || {
                let _slot = slot;
                relay(client, &socket)
            });
    }
}

fn relay(client: TcpStream, socket: &Path) {
    let Ok(upstream) = UnixStream::connect(socket) else {
        return;
    };
    let (Ok(client_w), Ok(upstream_r)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    let back = std::thread::Builder::new()
        .stack_size(RELAY_STACK)
        .spawn(move || {
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

/// Why a [`NetnsForwarder`] did not start.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("cannot open the network namespace {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the network namespace {0} is agentdiff's own: a forwarder there would listen on the host's loopback")]
    OwnNamespace(String),
    #[error("cannot enter the network namespace {}: {source} (entering another process's namespace needs CAP_SYS_ADMIN over it: a rootful engine, agentdiff run as root)", path.display())]
    Enter {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the network namespace has interfaces besides the loopback ({0}): the command would have a route out that the proxy does not see")]
    NotIsolated(String),
    #[error("the egress proxy's socket {} is not a socket", .0.display())]
    NoSocket(PathBuf),
    #[error("cannot listen on 127.0.0.1:{port} in the namespace: {source}")]
    Listen {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("the forwarder's thread could not start or ended before it listened: {0}")]
    Thread(String),
}

/// A forwarder listening on `127.0.0.1:PORT` in another process's network namespace, run by a
/// thread of this process (see the module documentation). Stopped by [`NetnsForwarder::stop`] or
/// on drop; relays still open then end when either side closes (the proxy closes them when it
/// stops).
#[derive(Debug)]
pub struct NetnsForwarder {
    /// `net:[INODE]` of the namespace it listens in.
    netns: String,
    port: u16,
    stop: Arc<AtomicBool>,
    listener: Arc<TcpListener>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NetnsForwarder {
    /// Enters the namespace `netns` (a `/proc/PID/ns/net` path) on a thread of its own, checks
    /// that it is not ours and has no interface but `lo`, binds `127.0.0.1:port` there and
    /// relays every connection to `socket`. Returns once it listens.
    pub fn start(netns: &Path, port: u16, socket: &Path) -> Result<NetnsForwarder, ForwardError> {
        let is_socket = std::fs::metadata(socket).map(|m| m.file_type().is_socket());
        if !matches!(is_socket, Ok(true)) {
            return Err(ForwardError::NoSocket(socket.to_path_buf()));
        }
        let ns = std::fs::File::open(netns).map_err(|source| ForwardError::Open {
            path: netns.to_path_buf(),
            source,
        })?;
        let own = std::fs::metadata("/proc/self/ns/net").map_err(|source| ForwardError::Open {
            path: PathBuf::from("/proc/self/ns/net"),
            source,
        })?;
        let theirs = ns.metadata().map_err(|source| ForwardError::Open {
            path: netns.to_path_buf(),
            source,
        })?;
        let id = format!("net:[{}]", std::os::unix::fs::MetadataExt::ino(&theirs));
        if std::os::unix::fs::MetadataExt::ino(&own) == std::os::unix::fs::MetadataExt::ino(&theirs)
            && std::os::unix::fs::MetadataExt::dev(&own)
                == std::os::unix::fs::MetadataExt::dev(&theirs)
        {
            return Err(ForwardError::OwnNamespace(id));
        }
        let (tx, rx) = std::sync::mpsc::channel::<Result<Arc<TcpListener>, ForwardError>>();
        let stop = Arc::new(AtomicBool::new(false));
        let (path, socket, thread_stop) = (netns.to_path_buf(), socket.to_path_buf(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("agentdiff-egress-forwarder".into())
            .spawn(move || {
                let listener = match enter_and_listen(&ns, &path, port) {
                    Ok(l) => Arc::new(l),
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                let _ = tx.send(Ok(listener.clone()));
                serve(&listener, &socket, Some(&thread_stop), MAX_RELAYS);
            })
            .map_err(|e| ForwardError::Thread(e.to_string()))?;
        let listener = match rx.recv() {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(e) => return Err(ForwardError::Thread(e.to_string())),
        };
        Ok(NetnsForwarder {
            netns: id,
            port,
            stop,
            listener,
            thread: Some(thread),
        })
    }

    /// `net:[INODE]` of the namespace it listens in.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The port it listens on (the namespace's `127.0.0.1`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting and waits for the accepting thread (open relays end on their own).
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocked `accept` (Linux returns EINVAL on a listener shut down).
        // SAFETY: shutdown(2) on a descriptor this struct keeps open.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for NetnsForwarder {
    fn drop(&mut self) {
        self.shut();
    }
}

/// On the calling thread (which stays in the namespace): enter `ns`, check that it holds only a
/// loopback interface, and listen on its `127.0.0.1:port`.
fn enter_and_listen(
    ns: &std::fs::File,
    path: &Path,
    port: u16,
) -> Result<TcpListener, ForwardError> {
    // SAFETY: setns(2) with a descriptor we hold open; it changes only this thread's namespace.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(ForwardError::Enter {
            path: path.to_path_buf(),
            source: std::io::Error::last_os_error(),
        });
    }
    // /proc/thread-self: this thread's view, i.e. the namespace just entered.
    let dev = std::fs::read_to_string("/proc/thread-self/net/dev").map_err(|source| {
        ForwardError::Open {
            path: PathBuf::from("/proc/thread-self/net/dev"),
            source,
        }
    })?;
    let others = interfaces_besides_lo(&dev);
    if !others.is_empty() {
        return Err(ForwardError::NotIsolated(others.join(", ")));
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, port))
        .map_err(|source| ForwardError::Listen { port, source })
}

/// The interface names of a `/proc/net/dev` table other than `lo`.
fn interfaces_besides_lo(dev: &str) -> Vec<String> {
    dev.lines()
        .skip(2)
        .filter_map(|l| l.split_once(':').map(|(name, _)| name.trim().to_string()))
        .filter(|name| name != "lo")
        .collect()
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

    #[test]
    fn only_a_loopback_interface_counts_as_isolated() {
        let head = "Inter-|   Receive\n face |bytes    packets\n";
        let lo = "    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n";
        let eth = "  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n";
        assert!(interfaces_besides_lo(&format!("{head}{lo}")).is_empty());
        assert_eq!(interfaces_besides_lo(&format!("{head}{lo}{eth}")), ["eth0"]);
    }

    #[test]
    fn a_forwarder_refuses_agentdiffs_own_namespace() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let err = NetnsForwarder::start(Path::new("/proc/self/ns/net"), 3128, &sock).unwrap_err();
        assert!(matches!(err, ForwardError::OwnNamespace(_)), "{err}");
        let err =
            NetnsForwarder::start(Path::new("/proc/self/ns/net"), 3128, dir.path()).unwrap_err();
        assert!(matches!(err, ForwardError::NoSocket(_)), "{err}");
    }

    /// A process in a network namespace of its own (loopback up), killed on drop.
    struct NsHolder(std::process::Child);

    impl Drop for NsHolder {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn a_forwarder_in_another_namespace_relays_to_the_socket_and_stops() {
        let child = std::process::Command::new("unshare")
            .args([
                "-n",
                "sh",
                "-c",
                "ip link set lo up && echo up && exec sleep 60",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            agentdiff_test_support::skip("unshare is not available");
            return;
        };
        let mut line = String::new();
        let _ = std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        );
        let holder = NsHolder(child);
        if line.trim() != "up" {
            agentdiff_test_support::skip("no network namespace with a loopback (unshare -n, ip)");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("egress.sock");
        let proxy = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let ns = PathBuf::from(format!("/proc/{}/ns/net", holder.0.id()));
        let fwd = NetnsForwarder::start(&ns, 3128, &sock).unwrap();
        assert!(fwd.netns().starts_with("net:["), "{}", fwd.netns());
        // A client inside the namespace reaches the socket through the forwarder...
        let client_ns = std::fs::File::open(&ns).unwrap();
        let client = std::thread::spawn(move || {
            // SAFETY: this thread only.
            assert_eq!(
                unsafe { libc::setns(client_ns.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            let mut c = TcpStream::connect((Ipv4Addr::LOCALHOST, 3128)).unwrap();
            std::io::Write::write_all(&mut c, b"ping").unwrap();
            c.shutdown(Shutdown::Write).unwrap();
            let mut back = String::new();
            c.read_to_string(&mut back).unwrap();
            back
        });
        let (mut upstream, _) = proxy.accept().unwrap();
        let mut got = [0u8; 4];
        upstream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        std::io::Write::write_all(&mut upstream, b"pong").unwrap();
        drop(upstream);
        assert_eq!(client.join().unwrap(), "pong");
        // ...and nothing listens on agentdiff's own loopback port for it.
        fwd.stop();
        let ns2 = std::fs::File::open(&ns).unwrap();
        let after = std::thread::spawn(move || {
            // SAFETY: this thread only.
            assert_eq!(
                unsafe { libc::setns(ns2.as_raw_fd(), libc::CLONE_NEWNET) },
                0
            );
            TcpStream::connect((Ipv4Addr::LOCALHOST, 3128)).is_err()
        });
        assert!(
            after.join().unwrap(),
            "the forwarder still listens after stop"
        );
    }

    #[test]
    fn relays_beyond_the_limit_are_closed_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("egress.sock");
        let proxy = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        // The "proxy" accepts and holds every connection, so each relay stays open.
        let held = std::thread::spawn(move || {
            let mut kept = Vec::new();
            for c in proxy.incoming().take(2) {
                kept.push(c.unwrap());
            }
            std::thread::sleep(std::time::Duration::from_secs(2));
        });
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let serving = {
            let stop = stop.clone();
            std::thread::spawn(move || serve(&listener, &sock, Some(&stop), 2))
        };
        let connect = || TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
        let (a, b) = (connect(), connect());
        std::thread::sleep(std::time::Duration::from_millis(200));
        // The third is over the limit: closed by the forwarder without a byte.
        let mut c = connect();
        c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let mut buf = [0u8; 1];
        assert_eq!(c.read(&mut buf).unwrap(), 0);
        stop.store(true, Ordering::SeqCst);
        let _ = connect();
        serving.join().unwrap();
        drop((a, b));
        held.join().unwrap();
    }
}
