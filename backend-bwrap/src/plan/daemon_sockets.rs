//! Host daemons' Unix sockets: every socket below `/run` (the system bus, systemd's private and
//! journal sockets, udev, printing, package managers…) is covered with the null device unless
//! `host-sockets: allow`.
//!
//! The sandbox shows the host's filesystem read-only, but a read-only mount does not stop a
//! `connect` to a socket on it, and the network namespace separates only abstract sockets. A
//! command run by root could otherwise ask systemd over the system bus to start any program
//! outside the sandbox; an unprivileged one reaches whatever the daemons grant its user.
//!
//! Invariants: the walk never follows a symlink; it skips [`SKIPPED`] (the per-user runtime
//! directories, hidden whole under the home allowlist or allowed on purpose); it stops after
//! [`MAX_ENTRIES`] entries or below [`MAX_DEPTH`] levels and says so, so a huge `/run` costs a
//! bounded walk and is never silently half-covered.
//! Not defended: sockets created after the launch, sockets outside `/run` (a daemon that keeps
//! one in `/var/lib` or below a home outside the allowlist; hide those with `hide`), and a
//! daemon the command reaches another way (a TCP port under `network: host`). A socket removed
//! between the plan and bwrap's mount setup fails the run closed at setup (its cover's mount
//! point cannot be made on the read-only `/run`): nothing runs, and a second run plans afresh.

use std::path::{Path, PathBuf};

/// Where daemons keep their sockets.
pub const DAEMON_SOCKET_DIR: &str = "/run";
/// Directories below [`DAEMON_SOCKET_DIR`] not searched.
pub const SKIPPED: [&str; 1] = ["/run/user"];
/// Entries the walk looks at before it gives up.
pub const MAX_ENTRIES: usize = 20_000;
/// Directory levels below [`DAEMON_SOCKET_DIR`] the walk descends.
pub const MAX_DEPTH: usize = 12;
/// Why a mount covers a daemon socket.
pub const DAEMON_SOCKET_REASON: &str = "host daemon socket";

/// The sockets found below `dir`, and, when the walk stopped early or could not list a
/// directory, why (for the plan's `not_applied`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub sockets: Vec<PathBuf>,
    pub incomplete: Vec<String>,
}

/// Every socket below `dir` but `skipped`, without following symlinks.
pub fn find(dir: &Path, skipped: &[&str]) -> Found {
    use std::os::unix::fs::FileTypeExt;
    let mut found = Found::default();
    let mut stack = vec![(dir.to_path_buf(), 0usize)];
    let mut seen = 0usize;
    while let Some((d, depth)) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                found
                    .incomplete
                    .push(format!("{}: not searched for sockets ({e})", d.display()));
                continue;
            }
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > MAX_ENTRIES {
                found.incomplete.push(format!(
                    "{}: more than {MAX_ENTRIES} entries; sockets past them are not covered",
                    dir.display()
                ));
                return found;
            }
            let path = entry.path();
            // `DirEntry::file_type` does not follow symlinks.
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_socket() {
                found.sockets.push(path);
            } else if kind.is_dir() && !skipped.iter().any(|s| path == Path::new(s)) {
                if depth + 1 >= MAX_DEPTH {
                    found.incomplete.push(format!(
                        "{}: deeper than {MAX_DEPTH} levels; not searched for sockets",
                        path.display()
                    ));
                } else {
                    stack.push((path, depth + 1));
                }
            }
        }
    }
    found.sockets.sort();
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn sockets_are_found_at_any_depth_without_following_links_or_skipped_dirs() {
        let t = tempfile::tempdir().unwrap();
        let run = t.path();
        std::fs::create_dir_all(run.join("dbus")).unwrap();
        std::fs::create_dir_all(run.join("a/b/c")).unwrap();
        std::fs::create_dir_all(run.join("user/1000")).unwrap();
        let outside = tempfile::tempdir().unwrap();
        let _l = [
            UnixListener::bind(run.join("dbus/system_bus_socket")).unwrap(),
            UnixListener::bind(run.join("a/b/c/deep.sock")).unwrap(),
            UnixListener::bind(run.join("user/1000/bus")).unwrap(),
            UnixListener::bind(outside.path().join("elsewhere.sock")).unwrap(),
        ];
        std::fs::write(run.join("a/plain-file"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path(), run.join("link")).unwrap();
        let skipped = run.join("user");
        let found = find(run, &[skipped.to_str().unwrap()]);
        assert_eq!(
            found.sockets,
            vec![
                run.join("a/b/c/deep.sock"),
                run.join("dbus/system_bus_socket")
            ]
        );
        assert!(found.incomplete.is_empty(), "{:?}", found.incomplete);
    }

    #[test]
    fn a_missing_directory_has_no_sockets_and_nothing_to_report() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(find(&t.path().join("absent"), &[]), Found::default());
    }

    #[test]
    fn a_walk_past_its_depth_says_what_it_did_not_search() {
        let t = tempfile::tempdir().unwrap();
        let mut deep = t.path().to_path_buf();
        for i in 0..MAX_DEPTH + 1 {
            deep = deep.join(format!("d{i}"));
        }
        std::fs::create_dir_all(&deep).unwrap();
        let _l = UnixListener::bind(deep.join("s")).unwrap();
        let found = find(t.path(), &[]);
        assert!(found.sockets.is_empty());
        assert_eq!(found.incomplete.len(), 1, "{:?}", found.incomplete);
        assert!(found.incomplete[0].contains("deeper than"));
    }
}
