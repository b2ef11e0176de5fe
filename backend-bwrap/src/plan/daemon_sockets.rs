//! Host daemons' Unix sockets: every socket below `/run` (the system bus, systemd's private and
//! journal sockets, udev, printing, package managers…) is left out of the sandbox unless
//! `host-sockets: allow`.
//!
//! The sandbox shows the host's filesystem read-only, but a read-only mount does not stop a
//! `connect` to a socket on it, and the network namespace separates only abstract sockets. A
//! command run by root could otherwise ask systemd over the system bus to start any program
//! outside the sandbox; an unprivileged one reaches whatever the daemons grant its user.
//!
//! How: `/run` is rebuilt ([`Rebuild`]) as a tmpfs, read-only once every mount below it is made,
//! holding the host's entries read-only at their own paths, a new directory for each one with a
//! socket below it, and no socket. The entries are re-shown with `--ro-bind-try` and every mount
//! point is made in the tmpfs, so a socket (or its directory) that a daemon removes between the
//! plan and bwrap's mount setup is simply not there: container runtimes make and remove
//! per-container sockets below `/run` all the time. Only when the walk stopped at
//! [`MAX_ENTRIES`] (it did not list all a rebuild must show) are the sockets it found covered one
//! by one with the null device instead; a socket removed before such a cover is mounted fails
//! the run closed at setup (nothing runs).
//!
//! Invariants: the walk never follows a symlink (a symlink is made again with its target); it
//! skips [`SKIPPED`] (the per-user runtime directories, hidden whole under the home allowlist or
//! allowed on purpose, re-shown whole here); it stops after [`MAX_ENTRIES`] entries or below
//! [`MAX_DEPTH`] levels and says so, so a huge `/run` costs a bounded walk and is never silently
//! half-covered. A directory below `/run` not searched (too deep, unreadable) is re-shown whole.
//! Not defended: sockets created after the launch in a directory re-shown whole, sockets outside
//! `/run` (a daemon that keeps one in `/var/lib` or below a home outside the allowlist; hide
//! those with `hide`), and a daemon the command reaches another way (a TCP port under
//! `network: host`). A rebuilt directory is the sandbox's own: its owner and mode are bwrap's,
//! not the host's.

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

/// The sockets found below `dir`, how to rebuild `dir` without them, and, when the walk stopped
/// early or could not list a directory, why (for the plan's `not_applied`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub sockets: Vec<PathBuf>,
    pub incomplete: Vec<String>,
    /// `None` when there is no socket, or when the walk stopped at [`MAX_ENTRIES`] (it did not
    /// list everything a rebuild would have to show): the sockets are then covered one by one.
    pub rebuild: Option<Rebuild>,
}

/// A directory shown as a tmpfs holding everything it held but the sockets: a socket that
/// disappears after the plan costs nothing, where a cover over it would need its mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rebuild {
    pub dir: PathBuf,
    /// Depth first, each directory before what it holds.
    pub entries: Vec<Entry>,
}

/// One entry of a rebuilt directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory with a socket somewhere below it: made anew, its own entries follow.
    Dir(PathBuf),
    /// Anything without a socket below it (a file, a directory, a FIFO…): the host's, read-only,
    /// at the same path, skipped when it is gone by the launch.
    Shown(PathBuf),
    /// A symbolic link, made again with the target it had.
    Symlink { path: PathBuf, target: PathBuf },
    /// A socket: left out.
    Socket(PathBuf),
}

/// Every socket below `dir` but `skipped`, without following symlinks.
pub fn find(dir: &Path, skipped: &[&str]) -> Found {
    find_bounded(dir, skipped, MAX_ENTRIES)
}

fn find_bounded(dir: &Path, skipped: &[&str], max_entries: usize) -> Found {
    let mut walk = Walk {
        skipped,
        max_entries,
        seen: 0,
        stopped: false,
        found: Found::default(),
    };
    // Only a real directory is rebuilt (a symlinked `/run` keeps its per-socket covers).
    let is_dir = std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
    let entries = walk.visit(dir, 0);
    let mut found = walk.found;
    found.sockets.sort();
    if let Some(entries) = entries.filter(|_| is_dir && !walk.stopped) {
        found.rebuild = Some(Rebuild {
            dir: dir.to_path_buf(),
            entries,
        });
    }
    found
}

struct Walk<'a> {
    skipped: &'a [&'a str],
    max_entries: usize,
    seen: usize,
    stopped: bool,
    found: Found,
}

impl Walk<'_> {
    /// What `dir` holds, when a socket is somewhere below it (`None` otherwise, or once the walk
    /// stopped).
    fn visit(&mut self, dir: &Path, depth: usize) -> Option<Vec<Entry>> {
        use std::os::unix::fs::FileTypeExt;
        let listed = self.list(dir)?;
        let mut out = Vec::with_capacity(listed.len());
        let mut has_socket = false;
        for (path, kind) in listed {
            match kind {
                Some(k) if k.is_socket() => {
                    has_socket = true;
                    self.found.sockets.push(path.clone());
                    out.push(Entry::Socket(path));
                }
                Some(k) if k.is_symlink() => {
                    // One that is gone already is not made again.
                    if let Ok(target) = std::fs::read_link(&path) {
                        out.push(Entry::Symlink { path, target });
                    }
                }
                Some(k) if k.is_dir() && !self.skipped.iter().any(|s| path == Path::new(s)) => {
                    if depth + 1 >= MAX_DEPTH {
                        self.found.incomplete.push(format!(
                            "{}: deeper than {MAX_DEPTH} levels; not searched for sockets",
                            path.display()
                        ));
                        out.push(Entry::Shown(path));
                    } else if let Some(inner) = self.visit(&path, depth + 1) {
                        has_socket = true;
                        out.push(Entry::Dir(path));
                        out.extend(inner);
                    } else {
                        out.push(Entry::Shown(path));
                    }
                }
                _ => out.push(Entry::Shown(path)),
            }
            if self.stopped {
                return None;
            }
        }
        has_socket.then_some(out)
    }

    /// `dir`'s entries, sorted, with their types (symlinks not followed).
    fn list(&mut self, dir: &Path) -> Option<Vec<(PathBuf, Option<std::fs::FileType>)>> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                self.found
                    .incomplete
                    .push(format!("{}: not searched for sockets ({e})", dir.display()));
                return None;
            }
        };
        let mut listed = Vec::new();
        for entry in entries.flatten() {
            self.seen += 1;
            if self.seen > self.max_entries {
                self.stopped = true;
                self.found.incomplete.push(format!(
                    "{}: more than {} entries below it; sockets past them are not covered",
                    dir.display(),
                    self.max_entries
                ));
                return None;
            }
            // `DirEntry::file_type` does not follow symlinks.
            listed.push((entry.path(), entry.file_type().ok()));
        }
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        Some(listed)
    }
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
        // The rebuild: directories with a socket below made anew, the rest shown, links made
        // again, sockets left out; the skipped directory shown whole.
        std::fs::create_dir_all(run.join("a/b/quiet")).unwrap();
        let found = find(run, &[skipped.to_str().unwrap()]);
        let rebuild = found.rebuild.expect("a rebuild");
        assert_eq!(rebuild.dir, run);
        assert_eq!(
            rebuild.entries,
            vec![
                Entry::Dir(run.join("a")),
                Entry::Dir(run.join("a/b")),
                Entry::Dir(run.join("a/b/c")),
                Entry::Socket(run.join("a/b/c/deep.sock")),
                Entry::Shown(run.join("a/b/quiet")),
                Entry::Shown(run.join("a/plain-file")),
                Entry::Dir(run.join("dbus")),
                Entry::Socket(run.join("dbus/system_bus_socket")),
                Entry::Symlink {
                    path: run.join("link"),
                    target: outside.path().to_path_buf()
                },
                Entry::Shown(run.join("user")),
            ]
        );
    }

    #[test]
    fn without_a_socket_or_past_the_entry_limit_nothing_is_rebuilt() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("quiet")).unwrap();
        assert_eq!(find(t.path(), &[]).rebuild, None);
        let _l = UnixListener::bind(t.path().join("s.sock")).unwrap();
        assert!(find_bounded(t.path(), &[], 2).rebuild.is_some());
        for i in 0..3 {
            std::fs::write(t.path().join(format!("f{i}")), "").unwrap();
        }
        // Not all of the directory was listed: the socket found is covered on its own.
        let found = find_bounded(t.path(), &[], 4);
        assert_eq!(found.rebuild, None);
        assert_eq!(found.incomplete.len(), 1, "{:?}", found.incomplete);
        assert!(found.incomplete[0].contains("more than 4 entries"));
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
