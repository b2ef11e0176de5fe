//! Descendant tracking.
//!
//! Mechanisms, strongest first:
//! - `cgroup`: the run has its own cgroup v2; `cgroup.procs` lists every process of the run that
//!   stays in it, whatever else it does. Belt and braces: the subreaper's descendant tree is walked
//!   as well, so a process that moves itself out of the run cgroup (writing its pid to another
//!   cgroup's `cgroup.procs`, as root can) is still a descendant, is recorded with
//!   `left_run_cgroup` (the cgroup it was found in) and is cleaned up like any other.
//! - `subreaper_proc_poll`: agentdiff is a child subreaper, so orphans re-parent to it instead of
//!   init; each tick reads `/proc/PID/task/TID/children` of every live tracked process and of
//!   agentdiff itself. A descendant that starts and exits between two ticks can be missed.
//! - `subreaper_proc_scan`: as above, scanning every `/proc/PID/stat` per tick (kernels without
//!   `/proc/PID/task/TID/children`).
//! - `sysinfo_poll` (not Linux): process-table polling through sysinfo; no subreaper, start times
//!   in seconds.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::ProcessIdentity;
use agentdiff_backend_api::{ProcessRecord, ProcessRelation};
use agentdiff_host::process_identity::{executable_name, read_stat};

/// One tracking mechanism and whether it works here (for `doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackingMechanism {
    pub name: String,
    pub available: bool,
    pub detail: String,
}

/// Which mechanism a run asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackingRequest {
    /// The strongest available.
    Auto,
    /// A cgroup, or an error.
    Cgroup,
    /// Subreaper + `/proc` polling even where a cgroup could be created.
    ProcPoll,
    /// Subreaper + a full `/proc` scan per poll (the fallback for kernels without `children`
    /// files; selectable to test and compare it).
    ProcScan,
}

impl TrackingRequest {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "cgroup" => Some(Self::Cgroup),
            "proc_poll" | "subreaper_proc_poll" | "poll" => Some(Self::ProcPoll),
            "proc_scan" | "subreaper_proc_scan" => Some(Self::ProcScan),
            _ => None,
        }
    }
}

/// Every mechanism and its availability here.
pub fn tracking_mechanisms_available() -> Vec<TrackingMechanism> {
    imp::mechanisms()
}

/// The name of the mechanism a run would use with `Auto`.
pub fn preferred_mechanism() -> String {
    tracking_mechanisms_available()
        .into_iter()
        .find(|m| m.available)
        .map(|m| m.name)
        .unwrap_or_else(|| "none".into())
}

/// Process records of one run, built tick by tick.
#[derive(Debug)]
pub struct Tracker {
    pub(crate) self_pid: u32,
    pub(crate) root: u32,
    pub(crate) root_start: u64,
    pub(crate) boot_id: String,
    pub(crate) launched: Instant,
    pub(crate) records: Vec<ProcessRecord>,
    /// pid → index into `records` of the latest process with that pid.
    pub(crate) index: HashMap<u32, usize>,
    /// Pids believed alive (tracked and not seen gone).
    pub(crate) live: Vec<u32>,
    pub(crate) errors: Vec<String>,
    #[allow(dead_code)]
    pub(crate) state: imp::State,
}

impl Tracker {
    /// Records so far.
    pub fn records(&self) -> &[ProcessRecord] {
        &self.records
    }

    /// Identity of every process still believed alive.
    pub fn live_identities(&self) -> Vec<(u32, ProcessIdentity)> {
        self.live
            .iter()
            .filter_map(|p| {
                self.index
                    .get(p)
                    .map(|i| (*p, self.records[*i].identity.clone()))
            })
            .collect()
    }

    pub fn into_parts(mut self) -> (Vec<ProcessRecord>, Vec<String>) {
        (
            std::mem::take(&mut self.records),
            std::mem::take(&mut self.errors),
        )
    }

    /// Add a process first seen now. `parent_hint` is the tracked parent it was found under.
    fn add(&mut self, pid: u32, relation_hint: ProcessRelation) -> bool {
        let Ok(stat) = read_stat(pid) else {
            return false;
        };
        // A process that started before the root cannot be its descendant (a recycled pid).
        if stat.start_time_ticks < self.root_start {
            return false;
        }
        // Already recorded under this identity: nothing new (a pid reused within the run is a
        // new process and gets its own record).
        if let Some(&i) = self.index.get(&pid) {
            if self.records[i].identity.start_time_ticks == stat.start_time_ticks {
                return false;
            }
        }
        let relation = if pid == self.root {
            ProcessRelation::Root
        } else if stat.ppid == self.self_pid {
            ProcessRelation::Reparented
        } else {
            relation_hint
        };
        let record = ProcessRecord {
            identity: ProcessIdentity {
                pid,
                start_time_ticks: stat.start_time_ticks,
                boot_id: self.boot_id.clone(),
            },
            ppid: stat.ppid,
            relation,
            executable: executable_name(pid, &stat.comm),
            first_seen_ms: self.launched.elapsed().as_millis() as u64,
            alive_after_root_exit: false,
            left_run_cgroup: None,
        };
        self.index.insert(pid, self.records.len());
        self.records.push(record);
        if !stat.is_zombie() {
            self.live.push(pid);
        }
        imp::claim(self, pid);
        true
    }

    /// Mark which records are still alive now (called when the root has exited).
    pub fn mark_alive_after_root_exit(&mut self) {
        let live = self.live.clone();
        for pid in live {
            let Some(&i) = self.index.get(&pid) else {
                continue;
            };
            if pid == self.root {
                continue;
            }
            let alive = read_stat(pid)
                .map(|s| {
                    s.start_time_ticks == self.records[i].identity.start_time_ticks
                        && !s.is_zombie()
                })
                .unwrap_or(false);
            if alive {
                self.records[i].alive_after_root_exit = true;
            }
        }
        self.refresh_liveness();
    }

    /// Name every record after the program its process executed last (from the exec log): a
    /// process first seen before its `exec` (`(sleep 30 &)` forks a shell that then execs sleep)
    /// is recorded under what it ran when it was cleaned up, not what it ran when first seen.
    pub fn name_from_execs(&mut self, last: &HashMap<(u32, u64), String>) {
        for r in &mut self.records {
            if let Some(name) = last.get(&(r.identity.pid, r.identity.start_time_ticks)) {
                r.executable.clone_from(name);
            }
        }
    }

    /// Drop pids that no longer exist (or whose pid was recycled) from the live set.
    pub fn refresh_liveness(&mut self) {
        let records = &self.records;
        let index = &self.index;
        self.live.retain(|pid| {
            let Some(&i) = index.get(pid) else {
                return false;
            };
            read_stat(*pid)
                .map(|s| {
                    s.start_time_ticks == records[i].identity.start_time_ticks && !s.is_zombie()
                })
                .unwrap_or(false)
        });
    }
}

#[cfg(target_os = "linux")]
mod imp {
    use std::collections::{HashMap, HashSet};
    use std::io::Read;
    use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
    use std::time::Instant;

    use super::{Tracker, TrackingMechanism, TrackingRequest};
    use crate::cgroup::{self, RunCgroup};
    use crate::ProcessError;
    use agentdiff_backend_api::{ProcessRelation, Tracking};
    use agentdiff_host::process_identity::read_stat;

    /// Runs active in this process, so concurrent runs (tests, embedders) do not claim each
    /// other's orphans: run token → pids claimed. A run is registered before its command starts
    /// (`launching` until its root is known): a command can fork and orphan a daemon before the
    /// spawning thread gets to record the root, and another run must not take that daemon for an
    /// unknown orphan of its own in the meantime.
    static ACTIVE: Mutex<Option<HashMap<u64, ActiveRun>>> = Mutex::new(None);
    /// Held shared by every run from its registration until its root is recorded, and
    /// exclusively by a run's last look at its orphans: that look waits for the launches in
    /// flight (a spawn returns within milliseconds) and holds new ones back, so it never finds a
    /// run still `launching` and never defers an orphan past the run's end.
    static LAUNCH_GATE: RwLock<()> = RwLock::new(());

    #[derive(Debug, Default)]
    struct ActiveRun {
        root_pgid: i32,
        /// The run cgroup's path as `/proc/PID/cgroup` shows it.
        cgroup: Option<String>,
        pids: HashSet<u32>,
        /// Registered, its command possibly running, its root not yet recorded.
        launching: bool,
    }

    /// A run registered in [`ACTIVE`] before its spawn; [`Tracker::new`] takes it over, and
    /// dropping it unused (the spawn failed) unregisters the run.
    #[derive(Debug)]
    pub struct Reservation {
        token: u64,
        taken: bool,
        _launching: RwLockReadGuard<'static, ()>,
    }

    /// A run's exclusive hold on [`LAUNCH_GATE`] while it decides its last orphans.
    pub struct Settled(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

    impl Reservation {
        fn new(cgroup: Option<&RunCgroup>) -> Self {
            use std::sync::atomic::{AtomicU64, Ordering};
            // A poisoned gate still orders launches against last looks: it guards no data.
            let gate = LAUNCH_GATE.read().unwrap_or_else(|p| p.into_inner());
            static NEXT: AtomicU64 = AtomicU64::new(1);
            let token = NEXT.fetch_add(1, Ordering::Relaxed);
            with_active(|a| {
                a.insert(
                    token,
                    ActiveRun {
                        cgroup: cgroup.map(|c| c.rel().to_string()),
                        launching: true,
                        ..ActiveRun::default()
                    },
                )
            });
            Reservation {
                token,
                taken: false,
                _launching: gate,
            }
        }

        /// The root is known: record its process group and the cgroup it really joined.
        fn launched(mut self, root_pgid: i32, cgroup: Option<String>) -> u64 {
            self.taken = true;
            with_active(|a| {
                if let Some(run) = a.get_mut(&self.token) {
                    run.root_pgid = root_pgid;
                    run.cgroup = cgroup;
                    run.launching = false;
                }
            });
            self.token
        }
    }

    impl Drop for Reservation {
        fn drop(&mut self) {
            if !self.taken {
                with_active(|a| a.remove(&self.token));
            }
        }
    }

    fn with_active<R>(f: impl FnOnce(&mut HashMap<u64, ActiveRun>) -> R) -> R {
        let mut guard = match ACTIVE.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(guard.get_or_insert_with(HashMap::new))
    }

    #[derive(Debug)]
    pub(crate) struct State {
        token: u64,
        pub(crate) cgroup: Option<RunCgroup>,
        children_files: bool,
        text: String,
        path: String,
        pids: Vec<u32>,
        mechanism: Tracking,
        /// agentdiff's own `children` file (main thread), kept open: read on every poll.
        self_children: Option<std::fs::File>,
    }

    pub(super) fn claim(t: &Tracker, pid: u32) {
        with_active(|a| {
            if let Some(run) = a.get_mut(&t.state.token) {
                run.pids.insert(pid);
            }
        });
    }

    fn children_supported() -> bool {
        let me = std::process::id();
        std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
    }

    /// Enable `PR_SET_CHILD_SUBREAPER` for this process (idempotent).
    pub fn enable_subreaper() -> Result<(), ProcessError> {
        // SAFETY: prctl with integer arguments.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        if rc != 0 {
            return Err(ProcessError::io(
                "prctl(PR_SET_CHILD_SUBREAPER)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    pub(super) fn mechanisms() -> Vec<TrackingMechanism> {
        let cg = cgroup::probe();
        let children = children_supported();
        vec![
            TrackingMechanism {
                name: "cgroup".into(),
                available: cg.is_ok(),
                detail: match cg {
                    Ok(parent) => format!(
                        "cgroup v2 run cgroups can be created under {}; complete for every process that stays in it, whatever else it \
                         does; the subreaper's descendant tree is walked too, so one that moves \
                         itself out is still tracked and recorded as left_run_cgroup",
                        parent.display()
                    ),
                    Err(e) => format!("unavailable: {e}"),
                },
            },
            TrackingMechanism {
                name: "subreaper_proc_poll".into(),
                available: children,
                detail: if children {
                    "child subreaper + /proc/PID/task/TID/children polling; best effort: a \
                     descendant that starts and exits between two polls can be missed"
                        .into()
                } else {
                    "unavailable: the kernel has no /proc/PID/task/TID/children".into()
                },
            },
            TrackingMechanism {
                name: "subreaper_proc_scan".into(),
                available: true,
                detail: "child subreaper + full /proc scan per poll; best effort, slower".into(),
            },
        ]
    }

    /// What the child must do between fork and exec to be tracked.
    pub struct ChildSetup {
        pub cgroup_fd: Option<std::os::fd::RawFd>,
    }

    /// Prepare tracking for a run (before the spawn): the run cgroup, if any, and the run's
    /// registration among this process's active runs.
    pub fn prepare(
        request: TrackingRequest,
    ) -> Result<(Option<RunCgroup>, Reservation, Vec<String>), ProcessError> {
        let mut warnings = Vec::new();
        enable_subreaper()?;
        let cg = match request {
            TrackingRequest::ProcPoll | TrackingRequest::ProcScan => None,
            TrackingRequest::Cgroup => Some(RunCgroup::create().map_err(|e| {
                ProcessError::Unsupported(format!(
                    "cgroup tracking was requested but no run cgroup can be created: {e}; \
                     use tracking `auto` or `proc_poll`"
                ))
            })?),
            TrackingRequest::Auto => match RunCgroup::create() {
                Ok(c) => Some(c),
                Err(e) => {
                    warnings.push(format!(
                        "no cgroup for this run ({e}); tracking falls back to subreaper + /proc \
                         polling, which can miss very short-lived descendants"
                    ));
                    None
                }
            },
        };
        let reservation = Reservation::new(cg.as_ref());
        Ok((cg, reservation, warnings))
    }

    pub fn child_setup(cg: Option<&RunCgroup>) -> ChildSetup {
        ChildSetup {
            cgroup_fd: cg.map(RunCgroup::procs_write_fd),
        }
    }

    impl Tracker {
        /// Start tracking the spawned root. `cgroup` is the run cgroup the child joined, if any;
        /// `reservation` is the run's registration from [`prepare`].
        pub fn new(
            root: u32,
            launched: Instant,
            cgroup: Option<RunCgroup>,
            reservation: Reservation,
        ) -> Self {
            let self_pid = std::process::id();
            let boot_id = crate::boot_id().unwrap_or_default();
            let root_stat = read_stat(root).ok();
            let mut errors = Vec::new();
            let cgroup = match cgroup {
                Some(c) if c.contains(root) => Some(c),
                Some(c) => {
                    errors.push(format!(
                        "the command did not join the run cgroup {}; tracking uses /proc polling",
                        c.path().display()
                    ));
                    let _ = c.remove();
                    None
                }
                None => None,
            };
            let children_files = children_supported();
            let mechanism = if cgroup.is_some() {
                Tracking::Cgroup
            } else if children_files {
                Tracking::SubreaperProcPoll
            } else {
                Tracking::SubreaperProcScan
            };
            let token = reservation.launched(
                root_stat.as_ref().map(|s| s.pgrp).unwrap_or(0),
                cgroup.as_ref().map(|c| c.rel().to_string()),
            );
            let mut t = Tracker {
                self_pid,
                root,
                root_start: root_stat.as_ref().map(|s| s.start_time_ticks).unwrap_or(0),
                boot_id,
                launched,
                records: Vec::new(),
                index: HashMap::new(),
                live: Vec::new(),
                errors,
                state: State {
                    token,
                    cgroup,
                    children_files,
                    text: String::with_capacity(4096),
                    path: String::with_capacity(64),
                    pids: Vec::with_capacity(64),
                    mechanism,
                    self_children: std::fs::File::open(format!(
                        "/proc/{self_pid}/task/{self_pid}/children"
                    ))
                    .ok(),
                },
            };
            if !t.add(root, ProcessRelation::Root) {
                t.errors.push(format!(
                    "the root process {root} could not be read from /proc"
                ));
            }
            t
        }

        pub fn mechanism(&self) -> Tracking {
            self.state.mechanism
        }

        /// Use the full `/proc` scan even where `children` files exist (no effect with a
        /// cgroup).
        pub fn force_scan(&mut self) {
            if self.state.cgroup.is_none() {
                self.state.children_files = false;
                self.state.mechanism = Tracking::SubreaperProcScan;
            }
        }

        pub fn cgroup(&self) -> Option<&RunCgroup> {
            self.state.cgroup.as_ref()
        }

        pub fn take_cgroup(&mut self) -> Option<RunCgroup> {
            self.state.cgroup.take()
        }

        /// Before the last look at orphans: wait until the other runs of this process that
        /// are starting their command have recorded their root, and hold new launches back
        /// while the returned guard lives (see [`LAUNCH_GATE`]).
        pub fn settle_launches(&self) -> Settled {
            Settled(LAUNCH_GATE.write().unwrap_or_else(|p| p.into_inner()))
        }

        /// Read the pids listed in one `children` file into `out` (appending).
        fn read_children(path: &str, text: &mut String, out: &mut Vec<u32>) -> bool {
            text.clear();
            match std::fs::File::open(path).and_then(|mut f| f.read_to_string(text)) {
                Ok(_) => {
                    out.extend(
                        text.split_ascii_whitespace()
                            .filter_map(|w| w.parse::<u32>().ok()),
                    );
                    true
                }
                Err(_) => false,
            }
        }

        /// Children of `pid` across all its threads; false when the process is gone.
        fn children_of(pid: u32, path: &mut String, text: &mut String, out: &mut Vec<u32>) -> bool {
            use std::fmt::Write;
            path.clear();
            let _ = write!(path, "/proc/{pid}/task");
            let Ok(dir) = std::fs::read_dir(&*path) else {
                return false;
            };
            let mut any = false;
            for entry in dir.flatten() {
                let name = entry.file_name();
                let Some(tid) = name.to_str() else { continue };
                path.clear();
                let _ = write!(path, "/proc/{pid}/task/{tid}/children");
                any |= Self::read_children(path, text, out);
            }
            any
        }

        /// One observation pass.
        pub fn tick(&mut self) {
            let mut found: Vec<(u32, ProcessRelation)> = Vec::new();
            let mut pids = std::mem::take(&mut self.state.pids);
            let mut text = std::mem::take(&mut self.state.text);
            let mut path = std::mem::take(&mut self.state.path);

            let mut in_cgroup: Option<Vec<u32>> = None;
            if let Some(cg) = &self.state.cgroup {
                match cg.pids(&mut text, &mut pids) {
                    Ok(()) => {
                        for p in &pids {
                            if !self.live.contains(p) {
                                found.push((*p, ProcessRelation::Descendant));
                            }
                        }
                        in_cgroup = Some(pids.clone());
                    }
                    Err(e) => {
                        let msg = format!("reading {}/cgroup.procs: {e}", cg.path().display());
                        if !self.errors.contains(&msg) {
                            self.errors.push(msg);
                        }
                    }
                }
            }
            // The descendant tree, with or without a cgroup (belt and braces: a process can
            // leave the run cgroup, not its parentage).
            if self.state.children_files {
                let mut gone = Vec::new();
                for &pid in &self.live {
                    pids.clear();
                    if !Self::children_of(pid, &mut path, &mut text, &mut pids) {
                        gone.push(pid);
                        continue;
                    }
                    for c in &pids {
                        if !self.live.contains(c) && !found.iter().any(|(f, _)| f == c) {
                            found.push((*c, ProcessRelation::Descendant));
                        }
                    }
                }
                self.live.retain(|p| !gone.contains(p));
            } else {
                self.scan_proc(&mut found);
            }

            // Orphans re-parented to agentdiff (the subreaper) are children of its main thread.
            pids.clear();
            if let Some(f) = &self.state.self_children {
                if cgroup::read_from_start(f, &mut text).is_ok() {
                    pids.extend(
                        text.split_ascii_whitespace()
                            .filter_map(|w| w.parse::<u32>().ok()),
                    );
                }
            }
            for &c in &pids {
                if c == self.root {
                    continue;
                }
                match self.index.get(&c) {
                    Some(&i) => {
                        let Ok(stat) = read_stat(c) else { continue };
                        let r = &mut self.records[i];
                        if stat.start_time_ticks != r.identity.start_time_ticks {
                            // A recycled pid: a new child of ours, judged as an unknown one.
                            if self.claimable_orphan(c) {
                                found.push((c, ProcessRelation::Reparented));
                            }
                            continue;
                        }
                        if r.relation == ProcessRelation::Descendant {
                            r.relation = ProcessRelation::Reparented;
                        }
                        // A re-parented process of ours that exited is our zombie: reap it.
                        if stat.is_zombie() {
                            crate::cleanup::reap_child(c);
                        }
                    }
                    None if self.claimable_orphan(c) => {
                        found.push((c, ProcessRelation::Reparented));
                    }
                    None => {}
                }
            }

            for (pid, rel) in found {
                self.add(pid, rel);
            }
            if let Some(members) = in_cgroup {
                self.check_cgroup_membership(&members);
            }
            self.state.pids = pids;
            self.state.text = text;
            self.state.path = path;
        }

        /// Live processes that are no longer in the run cgroup (or below it) left it: record
        /// where they went. `members` is this tick's `cgroup.procs`; anything not listed is
        /// checked through `/proc/PID/cgroup`, since it may have been forked after the read or
        /// moved into a sub-cgroup of the run's.
        fn check_cgroup_membership(&mut self, members: &[u32]) {
            let Some(cg) = &self.state.cgroup else { return };
            let rel = cg.rel().to_string();
            let mut gone = Vec::new();
            for &pid in &self.live {
                if members.contains(&pid) {
                    continue;
                }
                let Some(&i) = self.index.get(&pid) else {
                    continue;
                };
                let same = read_stat(pid).is_ok_and(|s| {
                    s.start_time_ticks == self.records[i].identity.start_time_ticks
                        && !s.is_zombie()
                });
                if !same {
                    gone.push(pid);
                    continue;
                }
                match cgroup::cgroup_of(pid) {
                    Some(p) if cgroup::within(&p, &rel) => {}
                    found => {
                        let r = &mut self.records[i];
                        if r.left_run_cgroup.is_none() {
                            r.left_run_cgroup = Some(found.unwrap_or_else(|| "unreadable".into()));
                        }
                    }
                }
            }
            self.live.retain(|p| !gone.contains(p));
        }

        /// An unknown child of agentdiff: ours if it is in no other run's cgroup, no other active
        /// run claims it, and (with several runs active in this process) its process group is
        /// this run's.
        fn claimable_orphan(&self, pid: u32) -> bool {
            let Ok(stat) = read_stat(pid) else {
                return false;
            };
            if stat.start_time_ticks < self.root_start {
                return false;
            }
            let cg = cgroup::cgroup_of(pid);
            let me = self.state.token;
            with_active(|a| {
                let others = || a.iter().filter(|(tok, _)| **tok != me);
                if others().any(|(_, r)| r.pids.contains(&pid)) {
                    return false;
                }
                // In another run's cgroup (registered before that run's spawn): theirs.
                if let Some(p) = &cg {
                    if others()
                        .any(|(_, r)| r.cgroup.as_deref().is_some_and(|c| cgroup::within(p, c)))
                    {
                        return false;
                    }
                }
                // A process group is one run's (each root leads its own): a match decides.
                let group_of = a
                    .iter()
                    .find(|(_, r)| !r.launching && r.root_pgid == stat.pgrp);
                if let Some((tok, _)) = group_of {
                    return *tok == me;
                }
                // An unknown group may be a run still starting whose root is not recorded yet:
                // decided on a later tick, once it is (`settle_launches` before the last one).
                if others().any(|(_, r)| r.launching) {
                    return false;
                }
                // A polling run owns unknown orphans unless other polling runs compete; a cgroup
                // run only sees escapees here (its members are in its cgroup) and competes with
                // every run.
                let competing = if self.state.cgroup.is_none() {
                    a.values().filter(|r| r.cgroup.is_none()).count()
                } else {
                    a.len()
                };
                competing <= 1
            })
        }

        /// Fallback without `children` files: one pass over `/proc`.
        fn scan_proc(&mut self, found: &mut Vec<(u32, ProcessRelation)>) {
            let Ok(dir) = std::fs::read_dir("/proc") else {
                return;
            };
            let tracked: HashSet<u32> = self.live.iter().copied().collect();
            let mut seen_live = HashSet::new();
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                if tracked.contains(&pid) {
                    seen_live.insert(pid);
                    continue;
                }
                if let Ok(stat) = read_stat(pid) {
                    if tracked.contains(&stat.ppid) {
                        found.push((pid, ProcessRelation::Descendant));
                    }
                }
            }
            self.live.retain(|p| seen_live.contains(p));
        }
    }

    impl Drop for Tracker {
        fn drop(&mut self) {
            let token = self.state.token;
            with_active(|a| a.remove(&token));
            if let Some(cg) = self.state.cgroup.take() {
                let _ = cg.remove();
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
mod imp {
    //! Portable fallback: sysinfo polling, no subreaper (orphans re-parent to init and are only
    //! attributed if they were seen before), start times in seconds.
    use std::collections::HashSet;
    use std::time::Instant;

    use super::{Tracker, TrackingMechanism, TrackingRequest};
    use crate::ProcessError;
    use agentdiff_backend_api::{ProcessRelation, Tracking};

    #[derive(Debug)]
    pub(crate) struct State {
        sys: sysinfo::System,
    }

    pub(super) fn claim(_t: &Tracker, _pid: u32) {}

    pub(super) fn mechanisms() -> Vec<TrackingMechanism> {
        vec![TrackingMechanism {
            name: "sysinfo_poll".into(),
            available: true,
            detail: "process-table polling; no subreaper, start times in seconds; orphans that \
                     daemonise before a poll are not attributable"
                .into(),
        }]
    }

    /// Nothing to register: without a subreaper, orphans are never claimed.
    #[derive(Debug)]
    pub struct Reservation;

    /// Nothing to hold: see [`Reservation`].
    pub struct Settled;

    pub fn prepare(
        request: TrackingRequest,
    ) -> Result<(Option<()>, Reservation, Vec<String>), ProcessError> {
        if request == TrackingRequest::Cgroup {
            return Err(ProcessError::Unsupported(
                "cgroup tracking exists only on Linux; use tracking `auto`".into(),
            ));
        }
        Ok((None, Reservation, Vec::new()))
    }

    impl Tracker {
        pub fn new(root: u32, launched: Instant, _cgroup: Option<()>, _r: Reservation) -> Self {
            let root_start = crate::read_stat(root)
                .map(|s| s.start_time_ticks)
                .unwrap_or(0);
            let mut t = Tracker {
                self_pid: std::process::id(),
                root,
                root_start,
                boot_id: crate::boot_id().unwrap_or_default(),
                launched,
                records: Vec::new(),
                index: Default::default(),
                live: Vec::new(),
                errors: Vec::new(),
                state: State {
                    sys: sysinfo::System::new(),
                },
            };
            t.add(root, ProcessRelation::Root);
            t
        }

        pub fn mechanism(&self) -> Tracking {
            Tracking::SysinfoPoll
        }

        pub fn settle_launches(&self) -> Settled {
            Settled
        }

        pub fn tick(&mut self) {
            use sysinfo::{ProcessRefreshKind, ProcessesToUpdate};
            self.state.sys.refresh_processes_specifics(
                ProcessesToUpdate::All,
                true,
                ProcessRefreshKind::new(),
            );
            let tracked: HashSet<u32> = self.live.iter().copied().collect();
            let mut found = Vec::new();
            let mut present = HashSet::new();
            for (pid, p) in self.state.sys.processes() {
                let pid = pid.as_u32();
                present.insert(pid);
                if self.index.contains_key(&pid) {
                    continue;
                }
                if let Some(parent) = p.parent() {
                    if tracked.contains(&parent.as_u32()) {
                        found.push(pid);
                    }
                }
            }
            self.live.retain(|p| present.contains(p));
            for pid in found {
                self.add(pid, ProcessRelation::Descendant);
            }
        }
    }
}

#[cfg(not(target_os = "linux"))]
pub use imp::prepare;
#[cfg(target_os = "linux")]
pub use imp::{child_setup, enable_subreaper, prepare, ChildSetup};

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;

    #[test]
    fn mechanisms_are_listed_with_details() {
        let m = tracking_mechanisms_available();
        let names: Vec<&str> = m.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["cgroup", "subreaper_proc_poll", "subreaper_proc_scan"]
        );
        assert!(m.iter().all(|m| !m.detail.is_empty()));
        assert!(m[2].available);
    }

    #[test]
    fn tracking_requests_parse() {
        assert_eq!(TrackingRequest::parse("auto"), Some(TrackingRequest::Auto));
        assert_eq!(
            TrackingRequest::parse("proc_poll"),
            Some(TrackingRequest::ProcPoll)
        );
        assert_eq!(
            TrackingRequest::parse("proc_scan"),
            Some(TrackingRequest::ProcScan)
        );
        assert_eq!(TrackingRequest::parse("x"), None);
    }

    /// Spawn `sh -c script` in its own process group, as a run's root is.
    fn spawn_root(script: &str) -> std::process::Child {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// Ends the daemon and reaps the roots, whatever the assertions did.
    struct Reap(Vec<std::process::Child>, std::path::PathBuf);
    impl Drop for Reap {
        fn drop(&mut self) {
            if let Ok(pid) = std::fs::read_to_string(&self.1) {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    // SAFETY: kill(2) of the sleeper this test started (still our child).
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    crate::cleanup::reap_child(pid as u32);
                }
            }
            for c in &mut self.0 {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// A command can orphan a daemon before its run records the root; another run of the same
    /// process must not take that daemon for an unknown orphan of its own meanwhile.
    #[test]
    fn an_orphan_of_a_run_still_launching_is_left_to_that_run() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("daemon.pid");
        let (_, first_reservation, _) = prepare(TrackingRequest::ProcPoll).unwrap();
        let first_root = spawn_root("sleep 30");
        let mut first = Tracker::new(first_root.id(), Instant::now(), None, first_reservation);

        // The second run is registered, its command forks a daemon and exits, and only then
        // is its root recorded.
        let (_, second_reservation, _) = prepare(TrackingRequest::ProcPoll).unwrap();
        let second_root = spawn_root(&format!("(sleep 30 & echo $! > '{}')", pidfile.display()));
        let second_pid = second_root.id();
        let _reap = Reap(vec![first_root, second_root], pidfile.clone());
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        let daemon = loop {
            // The root exits once its subshell has, so the daemon is ours (the subreaper's). It
            // stays a zombie (not reaped here), readable as a recorded root is.
            let written = std::fs::read_to_string(&pidfile).ok();
            let exited = read_stat(second_pid).unwrap().is_zombie();
            if let (Some(pid), true) = (written.and_then(|p| p.trim().parse::<u32>().ok()), exited)
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the daemon was not started");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        while read_stat(daemon).unwrap().ppid != std::process::id() {
            assert!(
                Instant::now() < deadline,
                "the daemon was not re-parented to us"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        first.tick();
        assert!(
            first.records().iter().all(|r| r.identity.pid != daemon),
            "a run took another run's orphan while that run was launching: {:#?}",
            first.records()
        );

        // Once its root is recorded, the daemon's process group names its run.
        let mut second = Tracker::new(second_pid, Instant::now(), None, second_reservation);
        second.tick();
        first.tick();
        assert!(first.records().iter().all(|r| r.identity.pid != daemon));
        let rec = second.records().iter().find(|r| r.identity.pid == daemon);
        assert_eq!(
            rec.map(|r| r.relation),
            Some(ProcessRelation::Reparented),
            "{:#?}",
            second.records()
        );
    }
}
