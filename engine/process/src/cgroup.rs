//! A cgroup v2 per run, where one can be created: every process the command starts stays in it
//! whatever it does (double fork, `setsid`), so `cgroup.procs` is the complete list of the run's
//! processes.
//!
//! The run cgroup is created below agentdiff's own cgroup (so it works in a delegated subtree as
//! well as for root), the child joins it between `fork` and `exec`, and it is removed after
//! cleanup. Not defended: a process that moves into a cgroup the command created inside the run
//! cgroup is no longer in the run cgroup's own `cgroup.procs` (the subreaper's descendant tree
//! still has it, and `cgroup.kill` reaches it); such child cgroups are removed with the run
//! cgroup. An agentdiff killed mid-run cannot remove it; the next agentdiff that creates a run
//! cgroup beside it removes it once it is empty and its creator is gone ([`sweep_stale`]).

use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::RUN_CGROUP_PREFIX;

/// A cgroup created for one run.
#[derive(Debug)]
pub struct RunCgroup {
    path: PathBuf,
    /// `cgroup.procs` opened for writing before the fork, so the child joins with one `write`.
    procs_w: OwnedFd,
    /// The cgroup directory, for `clone3(CLONE_INTO_CGROUP)`.
    dir: OwnedFd,
    /// `cgroup.procs` kept open for reading: each poll re-reads it from offset 0.
    procs_r: std::fs::File,
    /// The path as `/proc/PID/cgroup` shows it (`0::<rel>`), to verify membership.
    rel: String,
}

/// Where cgroup v2 is mounted, from `/proc/self/mountinfo`.
pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    for line in text.lines() {
        // ... mount-point ... - fstype source options
        let (pre, post) = line.split_once(" - ")?;
        if post.split_ascii_whitespace().next() == Some("cgroup2") {
            return pre.split_ascii_whitespace().nth(4).map(PathBuf::from);
        }
    }
    None
}

/// This process's cgroup v2 path (`0::/path` in `/proc/self/cgroup`).
fn own_cgroup() -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|s| s.to_string())
}

fn open_write(path: &Path) -> std::io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new().write(true).open(path)?;
    Ok(OwnedFd::from(f))
}

impl RunCgroup {
    /// Create a fresh cgroup for a run. The error says why none could be created.
    pub fn create() -> Result<Self, CgroupError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mount = cgroup2_mount().ok_or(CgroupError::NotMounted)?;
        let own = own_cgroup().ok_or(CgroupError::NotInHierarchy)?;
        let parent_rel = own.trim_end_matches('/');
        let name = format!(
            "{RUN_CGROUP_PREFIX}{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let rel = format!("{parent_rel}/{name}");
        let path = mount.join(rel.trim_start_matches('/'));
        if let Some(parent) = path.parent() {
            sweep_stale(parent);
        }
        std::fs::create_dir(&path).map_err(|source| CgroupError::Io {
            action: "create",
            path: path.clone(),
            source,
        })?;
        // Any failure below removes the empty cgroup again.
        let fail = |action: &'static str, at: PathBuf, source: std::io::Error| {
            let _ = std::fs::remove_dir(&path);
            CgroupError::Io {
                action,
                path: at,
                source,
            }
        };
        let procs = path.join("cgroup.procs");
        let procs_w = open_write(&procs).map_err(|e| fail("open", procs.clone(), e))?;
        let dir = std::fs::File::open(&path)
            .map(OwnedFd::from)
            .map_err(|e| fail("open", path.clone(), e))?;
        let procs_r = std::fs::File::open(&procs).map_err(|e| fail("read", procs.clone(), e))?;
        Ok(RunCgroup {
            path,
            procs_w,
            dir,
            procs_r,
            rel,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The cgroup directory descriptor (for `clone3`).
    pub fn dir_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    /// The descriptor the child writes `0` to (async-signal-safe join after fork).
    pub fn procs_write_fd(&self) -> RawFd {
        self.procs_w.as_raw_fd()
    }

    /// Whether `pid` is a member (checked after the spawn: the join in the child may fail).
    pub fn contains(&self, pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map(|t| t.lines().any(|l| l.strip_prefix("0::") == Some(&self.rel)))
            .unwrap_or(false)
    }

    /// The path as `/proc/PID/cgroup` shows it.
    pub fn rel(&self) -> &str {
        &self.rel
    }

    /// Pids currently in the cgroup, reusing `buf` and `out`.
    pub fn pids(&self, buf: &mut String, out: &mut Vec<u32>) -> std::io::Result<()> {
        out.clear();
        read_from_start(&self.procs_r, buf)?;
        out.extend(buf.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        Ok(())
    }

    /// Kill everything in the cgroup at once (`cgroup.kill`, Linux 5.14+): the backstop after
    /// identity-checked cleanup, for processes forked during cleanup itself.
    pub fn kill_all(&self) -> std::io::Result<()> {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.path.join("cgroup.kill"))?
            .write_all(b"1")
    }

    /// Remove the cgroup, waiting briefly for exiting members to leave.
    pub fn remove(self) -> std::io::Result<()> {
        let mut last = None;
        for _ in 0..50 {
            remove_children(&self.path);
            match std::fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    last = Some(e);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EBUSY)))
    }
}

/// Removes run cgroups in `parent` left by an agentdiff that died (its pid, part of the name, is
/// gone) once they are empty; returns how many were removed. A cgroup with members is kept (its
/// processes are `agentdiff cleanup`'s business) and `rmdir` of a non-empty cgroup fails anyway.
/// A reused pid only delays the removal until that process is gone too.
pub fn sweep_stale(parent: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(creator) = name
            .to_str()
            .and_then(|n| n.strip_prefix(RUN_CGROUP_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{creator}")).exists() {
            continue;
        }
        let path = entry.path();
        let empty = std::fs::read_to_string(path.join("cgroup.procs"))
            .is_ok_and(|procs| procs.trim().is_empty());
        if empty {
            remove_children(&path);
        }
        if empty && std::fs::remove_dir(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// `rmdir` every cgroup below `dir`, deepest first: the command may create cgroups inside the run
/// cgroup (and move itself into them), and a cgroup with children cannot be removed. A child
/// that still has members stays (its `rmdir` fails); the caller's own `rmdir` then reports it.
/// Depth is bounded by PATH_MAX, past which `read_dir` fails.
fn remove_children(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            let child = entry.path();
            remove_children(&child);
            let _ = std::fs::remove_dir(&child);
        }
    }
}

/// Read a `/proc` or cgroup file from offset 0 into `buf` through an fd kept open (no
/// open/close per poll).
pub fn read_from_start(f: &std::fs::File, buf: &mut String) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    buf.clear();
    let mut bytes = std::mem::take(buf).into_bytes();
    let mut chunk = [0u8; 4096];
    let mut off = 0u64;
    loop {
        let n = f.read_at(&mut chunk, off)?;
        if n == 0 {
            break;
        }
        bytes.extend_from_slice(&chunk[..n]);
        off += n as u64;
    }
    *buf = String::from_utf8(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8"))?;
    Ok(())
}

/// Join the cgroup whose `cgroup.procs` is open as `fd`. Runs in the forked child before `exec`:
/// only async-signal-safe calls.
pub fn join_in_child(fd: RawFd) -> std::io::Result<()> {
    let buf = b"0";
    // SAFETY: write(2) of a static buffer to an fd inherited from the parent.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Why no run cgroup could be created or removed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no cgroup v2 hierarchy is mounted")]
    NotMounted,
    #[error("this process is not in a cgroup v2 hierarchy")]
    NotInHierarchy,
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("created {} but could not remove it: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether a run cgroup can be created here (creates and removes an empty one); `Ok` with the
/// directory run cgroups are created under.
pub fn probe() -> Result<PathBuf, CgroupError> {
    let cg = RunCgroup::create()?;
    let path = cg.path.clone();
    cg.remove().map_err(|source| CgroupError::Remove {
        path: path.clone(),
        source,
    })?;
    Ok(path.parent().map(Path::to_path_buf).unwrap_or_default())
}

/// `pid`'s cgroup v2 path as `/proc/PID/cgroup` shows it (`0::<path>`), if readable.
pub fn cgroup_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Whether the cgroup path `path` is `rel` or lies below it (a sub-cgroup the command made
/// inside its own run cgroup is still the run's).
pub fn within(path: &str, rel: &str) -> bool {
    path == rel
        || path
            .strip_prefix(rel)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_clearly_either_way() {
        match probe() {
            Ok(parent) => assert!(parent.is_absolute(), "{}", parent.display()),
            Err(reason) => assert!(!reason.to_string().is_empty()),
        }
    }
}
