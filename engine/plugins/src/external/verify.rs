//! Whether a process a plugin reports as "the command I launched" really is one it started.

use agentdiff_host::process_identity::{read_stat, IdentityError};

/// What could be established about the reported process; recorded as the run's
/// `external_backend.launched_process`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Parentage {
    /// It exists (possibly as an unreaped zombie), has the reported start time, and its parent
    /// chain reaches the plugin process.
    Verified,
    /// No process has that pid any more: it ended (and was reaped) before agentdiff looked.
    /// Nothing can be signalled by mistake, and the evidence records that it was not checked.
    #[serde(rename = "ended_before_check")]
    Ended,
}

/// How many parent links are followed before giving up (a wrapper chain is short).
const MAX_DEPTH: usize = 64;

/// Why a reported process is not accepted as the plugin's launched command.
#[derive(Debug, thiserror::Error)]
pub enum NotDescendant {
    #[error("that is the plugin process itself")]
    PluginItself,
    #[error("pid {0} is never a launched command")]
    NeverCommand(u32),
    #[error("its identity cannot be read ({0})")]
    Unreadable(#[source] IdentityError),
    #[error(
        "the process with that pid started at tick {actual}, not at the reported tick {reported}"
    )]
    StartTime { actual: u64, reported: u64 },
    #[error("it is not a descendant of the plugin process (pid {0})")]
    NotBelow(u32),
}

/// Check that `pid`, started at `start_time_ticks`, descends from `ancestor`. `Err` says why not.
pub fn verify_descendant(
    pid: u32,
    start_time_ticks: u64,
    ancestor: u32,
) -> Result<Parentage, NotDescendant> {
    if pid == ancestor {
        return Err(NotDescendant::PluginItself);
    }
    if pid <= 1 {
        return Err(NotDescendant::NeverCommand(pid));
    }
    let stat = match read_stat(pid) {
        Ok(s) => s,
        Err(IdentityError::NoSuchProcess(_)) => return Ok(Parentage::Ended),
        Err(e) => return Err(NotDescendant::Unreadable(e)),
    };
    if stat.start_time_ticks != start_time_ticks {
        return Err(NotDescendant::StartTime {
            actual: stat.start_time_ticks,
            reported: start_time_ticks,
        });
    }
    let mut current = stat.ppid;
    for _ in 0..MAX_DEPTH {
        if current == ancestor {
            return Ok(Parentage::Verified);
        }
        if current <= 1 {
            break;
        }
        current = match read_stat(current) {
            Ok(s) => s.ppid,
            Err(_) => break,
        };
    }
    Err(NotDescendant::NotBelow(ancestor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_verified_and_strangers_are_refused() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let pid = child.id();
        let start = read_stat(pid).unwrap().start_time_ticks;
        let me = std::process::id();
        assert_eq!(
            verify_descendant(pid, start, me).unwrap(),
            Parentage::Verified
        );
        // Right pid, wrong start time: a reused pid.
        assert!(verify_descendant(pid, start + 1, me)
            .unwrap_err()
            .to_string()
            .contains("started at tick"));
        // Our own parent is not our descendant.
        let parent = read_stat(me).unwrap().ppid;
        let pstart = read_stat(parent).unwrap().start_time_ticks;
        assert!(verify_descendant(parent, pstart, me)
            .unwrap_err()
            .to_string()
            .contains("not a descendant"));
        assert!(verify_descendant(me, 0, me).is_err());
        assert!(verify_descendant(1, 0, me).is_err());
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(verify_descendant(pid, start, me).unwrap(), Parentage::Ended);
    }
}
