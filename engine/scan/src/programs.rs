//! Programs below excluded paths: what the scan records of a directory it does not capture.
//!
//! Default-excluded directories (`node_modules`, `.venv`, `target`, `__pycache__`, an unnamed
//! root `.git`, …) and paths `.agentdiffignore` lists are not captured, so a command could plant
//! a program there that runs later outside any sandbox: `.venv/bin/agentdiff-backend-x` found on
//! `PATH`, `node_modules/.bin/…` run by `npm`, a `.pth` file or `sitecustomize.py` Python executes
//! at start-up, a `.pyc` that replaces its source's code, a `.git/hooks/…` script. The sweep
//! (`walk::sweep`) lists those paths and `lstat`s every name (it reads no content) and keeps a
//! [`Program`] for each file that is one of these ([`program_reason`]); [`changed_programs`]
//! compares two sweeps. Git metadata below an excluded path is recorded the same way, every
//! file and symlink of it ([`ProgramReason::GitMetadata`]): a repository planted in
//! `node_modules/x` or `build/x` runs its `core.fsmonitor` when an editor runs `git status`
//! there.
//!
//! Invariants:
//! - A sweep never follows a symlink and never reads file content; a program is known by its
//!   metadata only, so a change that keeps (size, mode, mtime, ctime, inode, device) is not seen.
//! - A sweep that stopped early (an entry bound, a depth bound, an unreadable directory) says so
//!   ([`ProgramSweep::incomplete`]): the caller must not read its silence as "nothing planted".
//! - `None` (a manifest written before sweeps existed) is "not swept", never "no programs".
//!
//! Not defended: a program-like file under another name (a `.js` file `node_modules` code will
//! `require`, a data file an installed tool interprets), a symlink planted outside a `bin`-like
//! directory under a non-program name, and deletions (removing a program plants nothing). A
//! repository's object store (`sub/.git/objects`, `objects` of any git directory) is not swept:
//! Git runs nothing from it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::manifest::EntryKind;

/// Most programs one sweep records; past it the sweep is incomplete.
pub const MAX_SWEPT_PROGRAMS: usize = 100_000;

/// Most names one sweep `lstat`s; past it the sweep is incomplete.
pub const MAX_SWEPT_ENTRIES: u64 = 4_000_000;

/// Deepest directory a sweep descends into, below the excluded path.
pub const MAX_SWEEP_DEPTH: usize = 128;

/// Why a file counts as a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramReason {
    /// A regular file with an execute bit.
    Executable,
    /// Python bytecode (`*.pyc`), run instead of its source when newer.
    PythonBytecode,
    /// A Python start-up hook: `*.pth`, `sitecustomize.py`, `usercustomize.py`.
    PythonStartup,
    /// A symlink in a directory whose entries are run by name (`bin`, `.bin`, `sbin`,
    /// `Scripts`, `hooks`).
    CommandLink,
    /// Git metadata: an entry named `.git` (directory, file or symlink), a directory with git's
    /// layout, or anything in one but its object store. Git runs code from it (hooks,
    /// `core.fsmonitor`, `core.pager`, filters) when the user works there.
    GitMetadata,
}

impl ProgramReason {
    pub fn describe(self) -> &'static str {
        match self {
            ProgramReason::Executable => "executable",
            ProgramReason::PythonBytecode => "Python bytecode",
            ProgramReason::PythonStartup => "Python start-up hook",
            ProgramReason::CommandLink => "command link",
            ProgramReason::GitMetadata => "git metadata",
        }
    }
}

/// One program seen by a sweep (metadata only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    pub path: String,
    pub kind: EntryKind,
    pub reason: ProgramReason,
    pub size: u64,
    pub mode: u32,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
    pub dev: u64,
    pub ino: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

impl Program {
    /// Same file, same metadata: nothing the sweep can see has changed.
    fn same_as(&self, other: &Program) -> bool {
        (
            self.kind,
            self.size,
            self.mode,
            self.mtime_ns,
            self.ctime_ns,
            self.dev,
            self.ino,
            &self.symlink_target,
        ) == (
            other.kind,
            other.size,
            other.mode,
            other.mtime_ns,
            other.ctime_ns,
            other.dev,
            other.ino,
            &other.symlink_target,
        )
    }
}

/// What one scan saw below its excluded paths.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramSweep {
    /// Sorted by path.
    pub programs: Vec<Program>,
    /// Names `lstat`ed.
    pub entries_seen: u64,
    /// Why the sweep is incomplete, one line per cause (bounded); empty when it saw everything.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub incomplete: Vec<String>,
    /// Directories with git's layout below the excluded paths, sorted (see
    /// `Manifest::git_layouts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub git_layouts: Vec<String>,
}

/// Most `incomplete` lines kept; the last one says how many more there were.
pub const MAX_INCOMPLETE_LINES: usize = 32;

impl ProgramSweep {
    /// Records why the sweep is incomplete, keeping at most [`MAX_INCOMPLETE_LINES`] reasons.
    pub(crate) fn note_incomplete(&mut self, why: String) {
        if self.incomplete.len() < MAX_INCOMPLETE_LINES {
            self.incomplete.push(why);
        }
    }
}

/// Why `name` (a file of kind `kind` with permission bits `mode`, in directory `parent_name`) is a
/// program, or `None`.
pub fn program_reason(
    name: &str,
    kind: EntryKind,
    mode: u32,
    parent_name: &str,
) -> Option<ProgramReason> {
    match kind {
        EntryKind::File if mode & 0o111 != 0 => Some(ProgramReason::Executable),
        EntryKind::File if name.ends_with(".pyc") => Some(ProgramReason::PythonBytecode),
        EntryKind::File
            if name.ends_with(".pth")
                || name == "sitecustomize.py"
                || name == "usercustomize.py" =>
        {
            Some(ProgramReason::PythonStartup)
        }
        EntryKind::Symlink if is_command_dir(parent_name) => Some(ProgramReason::CommandLink),
        _ => None,
    }
}

fn is_command_dir(name: &str) -> bool {
    matches!(name, "bin" | ".bin" | "sbin" | "Scripts" | "hooks")
}

/// How a program differs between two sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProgramChangeType {
    Created,
    Modified,
}

/// A program that appeared or changed between two sweeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramChange<'m> {
    pub change_type: ProgramChangeType,
    pub program: &'m Program,
}

/// What the after-sweep shows that the before-sweep did not: new programs and programs whose
/// metadata changed (deletions are not reported). Empty when either side was not swept.
pub fn changed_programs<'m>(
    before: Option<&ProgramSweep>,
    after: Option<&'m ProgramSweep>,
) -> Vec<ProgramChange<'m>> {
    let (Some(before), Some(after)) = (before, after) else {
        return Vec::new();
    };
    let earlier: BTreeMap<&str, &Program> = before
        .programs
        .iter()
        .map(|p| (p.path.as_str(), p))
        .collect();
    after
        .programs
        .iter()
        .filter_map(|p| {
            let change_type = match earlier.get(p.path.as_str()) {
                None => ProgramChangeType::Created,
                Some(e) if !e.same_as(p) => ProgramChangeType::Modified,
                Some(_) => return None,
            };
            Some(ProgramChange {
                change_type,
                program: p,
            })
        })
        .collect()
}

/// The `incomplete` lines of the after-sweep that the before-sweep did not have: what could not
/// be swept after the command ran that could be swept before it. Empty when either side was not
/// swept.
pub fn newly_incomplete<'m>(
    before: Option<&ProgramSweep>,
    after: Option<&'m ProgramSweep>,
) -> Vec<&'m str> {
    let (Some(before), Some(after)) = (before, after) else {
        return Vec::new();
    };
    after
        .incomplete
        .iter()
        .filter(|l| !before.incomplete.contains(l))
        .map(String::as_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prog(path: &str, mode: u32, mtime_ns: i64) -> Program {
        Program {
            path: path.into(),
            kind: EntryKind::File,
            reason: ProgramReason::Executable,
            size: 10,
            mode,
            mtime_ns,
            ctime_ns: mtime_ns,
            dev: 1,
            ino: 7,
            symlink_target: None,
        }
    }

    fn sweep(programs: Vec<Program>) -> ProgramSweep {
        ProgramSweep {
            programs,
            entries_seen: 1,
            incomplete: Vec::new(),
            git_layouts: Vec::new(),
        }
    }

    #[test]
    fn reasons_cover_executables_bytecode_startup_hooks_and_command_links() {
        let f = EntryKind::File;
        assert_eq!(
            program_reason("x", f, 0o700, "lib"),
            Some(ProgramReason::Executable)
        );
        assert_eq!(
            program_reason("m.cpython-311.pyc", f, 0o644, "__pycache__"),
            Some(ProgramReason::PythonBytecode)
        );
        assert_eq!(
            program_reason("evil.pth", f, 0o644, "site-packages"),
            Some(ProgramReason::PythonStartup)
        );
        assert_eq!(
            program_reason("sitecustomize.py", f, 0o644, "lib"),
            Some(ProgramReason::PythonStartup)
        );
        assert_eq!(program_reason("package.json", f, 0o644, "x"), None);
        assert_eq!(
            program_reason("tsc", EntryKind::Symlink, 0o777, ".bin"),
            Some(ProgramReason::CommandLink)
        );
        assert_eq!(
            program_reason("lib", EntryKind::Symlink, 0o777, "pkg"),
            None
        );
        assert_eq!(
            program_reason("d", EntryKind::Directory, 0o755, "bin"),
            None
        );
    }

    #[test]
    fn new_and_changed_programs_are_reported_and_unchanged_and_deleted_are_not() {
        let before = sweep(vec![
            prog("a/same", 0o755, 1),
            prog("a/chmod", 0o644, 1),
            prog("a/gone", 0o755, 1),
            prog("a/touched", 0o755, 1),
        ]);
        let after = sweep(vec![
            prog("a/chmod", 0o755, 1),
            prog("a/new", 0o755, 2),
            prog("a/same", 0o755, 1),
            prog("a/touched", 0o755, 2),
        ]);
        let got: Vec<(&str, ProgramChangeType)> = changed_programs(Some(&before), Some(&after))
            .iter()
            .map(|c| (c.program.path.as_str(), c.change_type))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a/chmod", ProgramChangeType::Modified),
                ("a/new", ProgramChangeType::Created),
                ("a/touched", ProgramChangeType::Modified),
            ]
        );
    }

    #[test]
    fn a_side_without_a_sweep_compares_as_nothing_known() {
        let after = sweep(vec![prog("x", 0o755, 1)]);
        assert!(changed_programs(None, Some(&after)).is_empty());
        assert!(changed_programs(Some(&after), None).is_empty());
    }

    #[test]
    fn only_new_incomplete_lines_are_reported() {
        let mut before = sweep(vec![]);
        before.incomplete.push("old".into());
        let mut after = sweep(vec![]);
        after.incomplete = vec!["old".into(), "new".into()];
        assert_eq!(newly_incomplete(Some(&before), Some(&after)), vec!["new"]);
    }

    #[test]
    fn incomplete_lines_are_bounded() {
        let mut s = sweep(vec![]);
        for i in 0..MAX_INCOMPLETE_LINES + 10 {
            s.note_incomplete(format!("{i}"));
        }
        assert_eq!(s.incomplete.len(), MAX_INCOMPLETE_LINES);
    }
}
