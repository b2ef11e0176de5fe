//! A container engine on "another machine" for remote-mode tests: a real podman API service that
//! shares no filesystem with the test. It runs in its own mount namespace with a private tmpfs on
//! `/tmp` (where the tests' projects and workspaces live) holding its storage, and listens on a
//! loopback TCP port, so a bind mount of a workspace could not work there.
#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The busybox image the service holds (imported, not pulled: no registry is reachable).
pub const REMOTE_IMAGE: &str = "localhost/agentdiff-remote:busybox";

/// Inside the new mount namespace: a private /tmp, a busybox image imported into private storage
/// there, then the API service on 127.0.0.1:$1.
const SERVICE_SCRIPT: &str = r#"
set -e
mount -t tmpfs -o mode=1777 tmpfs /tmp
S=/tmp/engine
mkdir -p $S/rfs/bin
cp /bin/busybox $S/rfs/bin/busybox
for a in $(/bin/busybox --list); do [ "$a" = busybox ] || ln -s busybox "$S/rfs/bin/$a"; done
chmod 755 $S/rfs
tar -C $S/rfs -cf $S/rfs.tar .
podman --root $S/root --runroot $S/run import -q $S/rfs.tar "$2" >/dev/null
rm -rf $S/rfs $S/rfs.tar
cd /
exec podman --root $S/root --runroot $S/run system service --time=0 "tcp://127.0.0.1:$1"
"#;

/// The service, stopped (with its whole process group) when dropped.
pub struct RemoteEngine {
    child: std::process::Child,
    pub url: String,
    pub log: PathBuf,
}

impl Drop for RemoteEngine {
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this test created for the service.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Start a podman API service in its own mount namespace on a free loopback port.
pub fn start_remote_engine(log_dir: &Path) -> RemoteEngine {
    use std::os::unix::process::CommandExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = log_dir.join(format!("remote-engine-{port}.log"));
    let out = std::fs::File::create(&log).unwrap();
    let child = std::process::Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            SERVICE_SCRIPT,
            "sh",
        ])
        .arg(port.to_string())
        .arg(REMOTE_IMAGE)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0)
        .spawn()
        .unwrap();
    let engine = RemoteEngine {
        child,
        url: format!("tcp://127.0.0.1:{port}"),
        log,
    };
    for _ in 0..150 {
        let ready = std::process::Command::new("podman")
            .args(["--url", &engine.url, "image", "exists", REMOTE_IMAGE])
            .stderr(std::process::Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ready {
            return engine;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!(
        "the remote podman service did not come up: {}",
        std::fs::read_to_string(&engine.log).unwrap_or_default()
    );
}
