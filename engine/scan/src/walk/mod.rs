//! The directory-fd walk and the hashing pool.
//!
//! A walker walks depth-first: it lists one directory through its fd, `fstatat`s every name it
//! records or descends into without following links (a name the listing's `d_type` already shows
//! to be excluded is dropped without a stat: in an ignored directory searched for deny paths, that
//! is nearly every name), records directories and symlinks itself, and sends regular files to the
//! hashing workers over a bounded channel. Each job carries an `Arc` of its parent directory fd,
//! so a directory fd lives exactly as long as it has unlisted children or unhashed files: open
//! descriptors stay bounded by the depth of the tree plus the channel capacity plus one file per
//! worker, never by the width of the tree.
//!
//! The calling thread's walker lists the root; further walkers (one per core, at most
//! [`MAX_WALKERS`]) start when it has a directory to hand over, and take the shallowest
//! unopened directory from a walker that pops one while they are idle (see `super::peers`). A
//! directory is opened and listed by exactly one walker, which owns its node; a handed-over
//! directory's tree id goes back to the owner of its parent through the owner's inbox, as file
//! results do. The hashing pool and the sink are shared (the sink takes one tree at a time).
//!
//! Entries are not collected for the whole tree: each listed directory is an open node that
//! counts its files still being hashed and its subdirectories not yet complete; when the count
//! reaches zero its [`Tree`] goes to the sink (post-order) and the node is dropped, its id
//! recorded in the parent. A walker drains its inbox before each listing, so what it holds is the
//! directories on the path it walks plus those with files still queued — bounded by the depth
//! and the queue, never by the number of files (`MAX_HELD` counts it in tests) — once per walker.
//!
//! Invariant: the result (every tree id, the header's sorted lists, the counts) does not depend on
//! how many walkers ran or how the work was split (`walkers_tests`).

use std::collections::{HashMap, VecDeque};
use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, sync_channel, Receiver, SendError, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{openat, readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstat, fstatat, Mode, SFlag};

use super::digest::{stat_digest, DirDigest, StatDigests};
use super::exclude::{parse_ignore_file, Rules, Verdict, IGNORE_FILE};
use super::hash::{backup_state, capture, Captured, Meta, CHUNK};
use super::manifest::{
    unsupported_kind as uk, BackupSkip, BackupState, Entry, EntryKind, Exclusion, Manifest,
    ScanProgress, ScanStats, Unsupported, RACY_MARGIN_NS,
};
use super::peers::Peers;
use super::programs::ProgramSweep;
use super::tree::{join, Reusable, Tree, TreeError, TreeSink, TreeSource};
use super::{escape_bytes, BackupRequest, IgnoreSource, ScanError, ScanOptions, Scanned};

/// Jobs queued per worker: enough to keep workers busy while the walker lists the next directory.
const QUEUE_PER_WORKER: usize = 32;

/// Progress is reported every this many files.
const PROGRESS_EVERY: u64 = 256;

/// Test probe: a helper walker that opens a directory of this name panics.
#[cfg(test)]
pub(crate) const PANIC_IN_HELPER: &str = "zz-a-helper-walker-dies-here";

/// Most walkers of one scan: listing is bound by the kernel's per-directory work, which scales
/// with cores only so far.
const MAX_WALKERS: usize = 4;

#[cfg(test)]
type DirHook = Box<dyn FnMut(&str)>;

#[cfg(test)]
thread_local! {
    /// Test hook: runs on the walking thread just before a subdirectory is opened.
    pub(crate) static BEFORE_OPEN_DIR: std::cell::RefCell<Option<DirHook>> =
        const { std::cell::RefCell::new(None) };
    /// Test probe: the most entries the last scan on this thread held in memory at once.
    pub(crate) static MAX_HELD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Test probe: how many helper walkers the last scan on this thread started.
    pub(crate) static HELPERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

struct FileJob {
    parent: Arc<OwnedFd>,
    /// The inbox of the walker that owns the file's directory.
    reply: Sender<Event>,
    c_name: CString,
    /// The open directory the file is recorded in.
    dir: u64,
    name: String,
    seen: Meta,
}

struct FileResult {
    dir: u64,
    name: String,
    seen: Meta,
    captured: Captured,
}

struct PendingDir {
    parent: Arc<OwnedFd>,
    c_name: CString,
    /// The open directory this one is listed in, and its name there.
    parent_dir: u64,
    name: String,
    rel: String,
    seen: Meta,
    /// Inside a directory `.agentdiffignore` excludes: only entries a deny or include glob names
    /// are recorded (see [`Verdict::Search`]).
    searched: bool,
    /// Recorded as a directory entry of its parent (not only searched for deny paths).
    is_entry: bool,
    /// Inside a directory with git's layout: no ignore rule applies (see [`Rules::verdict`]).
    git: bool,
    /// Its listing in the earlier scan (the stat cache), when there is one.
    prev: Option<PrevRef>,
    /// The inbox of the walker that owns `parent_dir`, when that is another walker (the
    /// directory was handed over; see `super::peers`).
    owner: Option<Sender<Event>>,
}

/// Directories found and not yet opened: popped at the back (depth-first), and handed to
/// another walker from the front (the shallowest, the largest piece of work), both in O(1).
type Stack = VecDeque<PendingDir>;

/// What a walker's inbox receives.
enum Event {
    /// A file the hashing pool read.
    File(FileResult),
    /// A directory handed to another walker is complete: its tree (none when nothing in it is
    /// recorded), for its parent `dir` of this walker.
    Subtree {
        dir: u64,
        name: String,
        tree: Option<String>,
    },
    /// A directory to walk, handed over by another walker.
    Job(PendingDir),
    /// Another walker failed (see [`Peers::abort`]).
    Wake,
    /// The scan is over.
    Stop,
}

/// A directory being listed or waiting for its files and subdirectories; its tree goes to the
/// sink (and it leaves memory) as soon as `pending` reaches zero.
struct OpenDir {
    rel: String,
    /// The parent's id and this directory's name in it (`None` for the root).
    parent: Option<(u64, String)>,
    is_entry: bool,
    tree: Tree,
    /// Files still being hashed, subdirectories not yet complete, and 1 while being listed.
    pending: usize,
    /// The earlier tree of this directory (the stat cache's), kept until the directory is
    /// complete: when the new listing equals it, its object is reused as it is.
    earlier: Option<Earlier>,
    /// The earlier tree whose stat digest this listing matched (see [`StatDigests`]): its
    /// entries are that tree's, and so is its object when the subtrees are too.
    same_stat: Option<String>,
    /// Where its tree is reported when its parent is another walker's.
    owner: Option<Sender<Event>>,
}

/// A regular file of a listing checked against its directory's stat digest: hashed or reused
/// only when the digest differs.
struct Deferred {
    c_name: CString,
    name: String,
    path: String,
    seen: Meta,
}

/// An earlier tree object: its id and what its source gave.
struct Earlier {
    id: String,
    tree: Reusable,
}

/// Where a directory's earlier listing is found.
#[derive(Clone)]
enum PrevRef {
    Tree(String),
    /// The same path in the in-memory manifest of `ScanOptions::reuse`.
    Manifest,
}

/// A directory's earlier listing, loaded while the directory is listed.
enum Prev<'a> {
    Tree(Earlier),
    Manifest(&'a Manifest),
}

impl Prev<'_> {
    fn entry(&self, path: &str, name: &str) -> Option<&Entry> {
        match self {
            Prev::Tree(t) => t.tree.tree.entries.get(name),
            Prev::Manifest(m) => m.entries.get(path),
        }
    }

    fn sub(&self, name: &str) -> Option<PrevRef> {
        match self {
            Prev::Tree(t) => t.tree.tree.trees.get(name).cloned().map(PrevRef::Tree),
            Prev::Manifest(_) => Some(PrevRef::Manifest),
        }
    }
}

enum ReuseFrom<'a> {
    Manifest(&'a Manifest),
    Trees(&'a dyn TreeSource),
}

/// The stat cache of one scan.
struct Reuse<'a> {
    from: ReuseFrom<'a>,
    /// Entries whose mtime or ctime is at or after this are racy (never reused).
    racy_from: i64,
    root: PrevRef,
    /// Stat digests of earlier trees (see [`super::TreeReuse::digests`]).
    digests: Option<&'a StatDigests>,
    /// What decides whether a digest may stand for a tree's entries (see [`DirDigest::fits`]).
    carry_backup_state: bool,
    backup_max: Option<u64>,
}

impl<'a> Reuse<'a> {
    /// The cache `opts` asks for, when it was taken at this root and records its start.
    fn of(opts: &ScanOptions<'a>, root: &str) -> Option<Reuse<'a>> {
        let digests = opts.reuse_tree.and_then(|t| t.digests);
        let (from, root_ref, started_ns) = match (opts.reuse_tree, opts.reuse) {
            (Some(t), _) => (
                ReuseFrom::Trees(t.source),
                PrevRef::Tree(t.tree.to_string()),
                (t.root == root).then_some(t.started_ns)?,
            ),
            (None, Some(m)) => (
                ReuseFrom::Manifest(m),
                PrevRef::Manifest,
                (m.root == root).then_some(m.stats.started_ns)?,
            ),
            (None, None) => return None,
        };
        Some(Reuse {
            from,
            racy_from: started_ns?.saturating_sub(RACY_MARGIN_NS),
            root: root_ref,
            digests,
            carry_backup_state: opts.carry_backup_state,
            backup_max: opts.backup.as_ref().map(|b| b.max_file_bytes),
        })
    }

    /// The stat digest of the earlier tree `id`, when one is kept, none of its files is racy,
    /// and each of its entries is what this scan would record for an unchanged file (a reused
    /// file's entry is exactly the earlier one: same hash, same backup state).
    fn digest(&self, id: &str) -> Option<&'a DirDigest> {
        self.digests?.get(id).filter(|d| {
            d.newest_file_ns < self.racy_from && d.fits(self.carry_backup_state, self.backup_max)
        })
    }

    /// Where earlier trees are read from.
    fn source(&self) -> Option<&'a dyn TreeSource> {
        match self.from {
            ReuseFrom::Trees(src) => Some(src),
            ReuseFrom::Manifest(_) => None,
        }
    }

    /// The earlier listing `r` names; a tree that cannot be read just means no reuse below it.
    fn load(&self, r: PrevRef) -> Option<Prev<'a>> {
        match (r, &self.from) {
            (PrevRef::Tree(id), ReuseFrom::Trees(src)) => {
                let tree = src.reusable(&id).ok()?;
                Some(Prev::Tree(Earlier { id, tree }))
            }
            (PrevRef::Manifest, ReuseFrom::Manifest(m)) => Some(Prev::Manifest(m)),
            _ => None,
        }
    }
}

struct Counters {
    files_seen: AtomicU64,
    bytes_hashed: AtomicU64,
}

impl Counters {
    fn file_done(&self, bytes: u64, progress: Option<&(dyn Fn(&ScanProgress) + Sync)>) {
        let bytes_hashed = self.bytes_hashed.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let files_seen = self.files_seen.fetch_add(1, Ordering::Relaxed) + 1;
        if let Some(cb) = progress {
            if files_seen % PROGRESS_EVERY == 0 {
                cb(&ScanProgress {
                    files_seen,
                    bytes_hashed,
                });
            }
        }
    }
}

/// The sink the walkers share: one tree at a time. Borrowed as `&'o LockedSink<'o>`: the sink
/// is reborrowed for the scan's own lifetime, so walkers need no lifetime of their caller's.
struct LockedSink<'s>(Mutex<&'s mut (dyn TreeSink + Send + 's)>);

impl<'s> LockedSink<'s> {
    fn lock(&self) -> std::sync::MutexGuard<'_, &'s mut (dyn TreeSink + Send + 's)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What every walker of a scan borrows.
#[derive(Clone, Copy)]
struct Ctx<'o, 'a> {
    opts: &'o ScanOptions<'a>,
    rules: &'o Rules,
    counters: &'o Counters,
    sink: &'o LockedSink<'o>,
    peers: &'o Peers<Event>,
    root: &'o str,
}

/// What a walker found, for the first one to merge.
struct Found {
    unsupported: Vec<Unsupported>,
    excluded: Vec<Exclusion>,
    stats: ScanStats,
    digests: Option<StatDigests>,
    sink_error: Option<TreeError>,
    git_layouts: Vec<String>,
    #[cfg_attr(not(test), allow(dead_code))]
    max_held: usize,
}

impl Found {
    /// Adds a helper walker's findings to the first walker's (sorted by the caller).
    fn absorb(&mut self, other: Found) {
        self.unsupported.extend(other.unsupported);
        self.excluded.extend(other.excluded);
        let (to, from) = (&mut self.stats, &other.stats);
        to.files += from.files;
        to.directories += from.directories;
        to.symlinks += from.symlinks;
        to.hashes_reused += from.hashes_reused;
        to.backups_stored += from.backups_stored;
        to.backups_reused += from.backups_reused;
        to.trees_reused += from.trees_reused;
        if let (Some(all), Some(more)) = (self.digests.as_mut(), other.digests) {
            all.absorb(more);
        }
        self.sink_error = self.sink_error.take().or(other.sink_error);
        self.git_layouts.extend(other.git_layouts);
    }
}

struct Walker<'o, 'a> {
    opts: &'o ScanOptions<'a>,
    rules: &'o Rules,
    reuse: Option<Reuse<'a>>,
    counters: &'o Counters,
    sink: &'o LockedSink<'o>,
    peers: &'o Peers<Event>,
    /// This walker's inbox (handed to the pool with each file, and with each directory given
    /// away).
    inbox: Sender<Event>,
    /// The root is complete (only the first walker, on the calling thread, has it): the scan
    /// is over.
    root_done: bool,
    /// On the idle list since its stack last ran empty.
    idle_listed: bool,
    open: HashMap<u64, OpenDir>,
    next_id: u64,
    /// Entries held in `open` now, and the most ever held at once.
    held: usize,
    max_held: usize,
    root_tree: Option<String>,
    sink_error: Option<TreeError>,
    /// `getdents64`'s buffer, reused for every listing.
    list_buf: Vec<u8>,
    /// The files of the listing in progress whose directory has a stat digest.
    deferred: Vec<Deferred>,
    /// Stat digests of the trees produced, when collected.
    digests: Option<StatDigests>,
    unsupported: Vec<Unsupported>,
    excluded: Vec<Exclusion>,
    /// Directories whose listing has git's layout.
    git_layouts: Vec<String>,
    stats: ScanStats,
}

pub(crate) fn scan(
    root: &Path,
    opts: &ScanOptions,
    sink: &mut (dyn TreeSink + Send),
) -> Result<Scanned, ScanError> {
    let start = Instant::now();
    // Taken before the first `lstat`: every entry this scan records was stat'ed after it.
    let started_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_nanos()).ok());
    let shown = escape_bytes(root.as_os_str().as_bytes());
    let canon = std::fs::canonicalize(root).map_err(|source| ScanError::Root {
        path: shown.clone(),
        source,
    })?;
    let root_str = escape_bytes(canon.as_os_str().as_bytes());
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let root_fd = match nix::fcntl::open(&canon, flags, Mode::empty()) {
        // SAFETY: `open` just returned this descriptor and nothing else owns it.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(Errno::ENOTDIR) => return Err(ScanError::RootNotDirectory(root_str)),
        Err(e) => {
            return Err(ScanError::Root {
                path: root_str,
                source: e.into(),
            })
        }
    };

    let ignore_lines = match &opts.ignore {
        IgnoreSource::ProjectFile => read_ignore_file(&root_fd)?,
        IgnoreSource::Lines(lines) => lines.clone(),
    };
    let rules = Rules::new(&canon, &ignore_lines, &opts.reinclude)?;
    let threads = match opts.threads {
        0 => cores(),
        n => n,
    };
    let counters = Counters {
        files_seen: AtomicU64::new(0),
        bytes_hashed: AtomicU64::new(0),
    };
    let (first_inbox, inbox) = channel::<Event>();
    let peers = Peers::new(first_inbox.clone());
    let sink = LockedSink(Mutex::new(&mut *sink));
    let ctx = Ctx {
        opts,
        rules: &rules,
        counters: &counters,
        sink: &sink,
        peers: &peers,
        root: &root_str,
    };
    let mut walker = Walker::new(ctx, first_inbox);
    let root_fd = Arc::new(root_fd);

    let (job_tx, job_rx) = sync_channel::<FileJob>(threads.saturating_mul(QUEUE_PER_WORKER));
    let job_rx = Mutex::new(job_rx);
    let (found, failed) = std::thread::scope(|s| {
        let pool = Arc::new(Pool {
            scope: s,
            jobs: job_tx,
            rx: &job_rx,
            started: std::sync::Once::new(),
            threads,
            backup: opts.backup,
            progress: opts.progress,
            counters: &counters,
            peers: &peers,
            failed: Mutex::new(None),
            broken: AtomicBool::new(false),
        });
        let mut helpers = Helpers {
            scope: s,
            ctx,
            pool: Arc::clone(&pool),
            max: walkers(opts).saturating_sub(1),
            started: Vec::new(),
        };
        walker.walk(Arc::clone(&root_fd), &inbox, &pool, &mut helpers);
        let found = helpers.stop();
        let failed = pool
            .failed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        (found, failed)
    });
    if let Some(e) = failed {
        return Err(ScanError::Threads(e));
    }
    let found = found?;

    #[cfg(test)]
    {
        MAX_HELD.with(|m| m.set(walker.max_held + found.iter().map(|f| f.max_held).sum::<usize>()));
        HELPERS.with(|h| h.set(found.len()));
    }
    let mut all = walker.found();
    for f in found {
        all.absorb(f);
    }
    let Found {
        mut unsupported,
        mut excluded,
        mut stats,
        digests,
        sink_error,
        git_layouts,
        ..
    } = all;
    let root_tree = walker.root_tree;
    if let Some(e) = sink_error {
        return Err(ScanError::Trees(e));
    }
    let root_tree = root_tree.ok_or(ScanError::Incomplete)?;
    unsupported.sort_by(|a, b| a.path.cmp(&b.path).then_with(|| a.kind.cmp(&b.kind)));
    excluded.sort_by(|a, b| a.path.cmp(&b.path));
    let excluded_programs = opts
        .sweep_excluded
        .then(|| sweep::sweep(&root_fd, &excluded, walkers(opts)));
    let git_layouts = all_layouts(git_layouts, excluded_programs.as_ref());
    stats.bytes_hashed = counters.bytes_hashed.load(Ordering::Relaxed);
    stats.duration_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    stats.started_ns = started_ns;
    if let Some(cb) = opts.progress {
        cb(&ScanProgress {
            files_seen: counters.files_seen.load(Ordering::Relaxed),
            bytes_hashed: stats.bytes_hashed,
        });
    }
    let manifest = Manifest {
        schema_version: crate::MANIFEST_SCHEMA_VERSION,
        root: root_str,
        ignore_lines,
        entries: Default::default(),
        unsupported,
        excluded,
        excluded_programs,
        git_layouts,
        stats,
    };
    Ok(Scanned {
        manifest,
        root_tree,
        digests,
    })
}

/// The git layouts the walkers found and the sweep found below excluded paths, sorted.
fn all_layouts(mut walked: Vec<String>, swept: Option<&ProgramSweep>) -> Vec<String> {
    walked.extend(swept.iter().flat_map(|s| s.git_layouts.iter().cloned()));
    walked.sort();
    walked.dedup();
    walked
}

/// The cores this process may use, read once: `available_parallelism` reads the cgroup's CPU
/// quota files on every call, and a run scans twice.
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// How many walkers a scan may use. A test hook on the calling thread needs every directory
/// opened there: one walker.
fn walkers(opts: &ScanOptions) -> usize {
    #[cfg(test)]
    if BEFORE_OPEN_DIR.with(|h| h.borrow().is_some()) {
        return 1;
    }
    match opts.walkers {
        0 => cores().min(MAX_WALKERS),
        n => n,
    }
}

/// The walkers the first one starts, each when it has a directory to hand over and no walker is
/// idle: a tree of one directory starts none.
struct Helpers<'scope, 'env, 'o: 'scope, 'a: 'o> {
    scope: &'scope Scope<'scope, 'env>,
    ctx: Ctx<'o, 'a>,
    pool: Arc<Pool<'scope, 'env>>,
    max: usize,
    started: Vec<(Sender<Event>, ScopedJoinHandle<'scope, Found>)>,
}

impl<'scope, 'o: 'scope, 'a: 'o> Helpers<'scope, '_, 'o, 'a> {
    fn can_start(&self) -> bool {
        self.started.len() < self.max
    }

    /// Starts a walker on `job`; gives the job back when no thread could be started (the scan
    /// goes on with the walkers it has).
    fn start(&mut self, job: PendingDir) -> Option<PendingDir> {
        let (tx, rx) = channel::<Event>();
        let (ctx, pool, inbox) = (self.ctx, Arc::clone(&self.pool), tx.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("agentdiff-walk-{}", self.started.len() + 1))
            .spawn_scoped(self.scope, move || {
                let walked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut walker = Walker::new(ctx, inbox);
                    if let Ok(Event::Job(first)) = rx.recv() {
                        walker.run(Stack::from([first]), &rx, &pool, None);
                    }
                    walker.found()
                }));
                // A walker that died would never report its subtree: the first one would wait
                // for it forever instead of failing the scan.
                walked.unwrap_or_else(|panic| {
                    ctx.peers.abort(Event::Wake);
                    std::panic::resume_unwind(panic)
                })
            });
        match spawned {
            Ok(handle) => match tx.send(Event::Job(job)) {
                Ok(()) => {
                    self.started.push((tx, handle));
                    None
                }
                Err(SendError(Event::Job(job))) => Some(job),
                Err(_) => None,
            },
            Err(_) => Some(job),
        }
    }

    /// Stops every walker started and returns what each found.
    fn stop(self) -> Result<Vec<Found>, ScanError> {
        for (tx, _) in &self.started {
            let _ = tx.send(Event::Stop);
        }
        let mut found = Vec::new();
        for (_, handle) in self.started {
            found.push(handle.join().map_err(|_| ScanError::Incomplete)?);
        }
        Ok(found)
    }
}

/// The hashing workers, started when the first file needs reading: a scan whose every file
/// comes from the stat cache (a warm run, or a tree of no files) starts no thread. Shared by the
/// walkers; each job names the inbox its result goes to.
struct Pool<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    jobs: SyncSender<FileJob>,
    rx: &'env Mutex<Receiver<FileJob>>,
    /// The workers are started once, by the first file to hash (no lock on later files).
    started: std::sync::Once,
    threads: usize,
    backup: Option<BackupRequest<'env>>,
    progress: Option<&'env (dyn Fn(&ScanProgress) + Sync)>,
    counters: &'env Counters,
    peers: &'env Peers<Event>,
    /// Why no worker could be started: the scan fails with it, as when it failed up front.
    failed: Mutex<Option<std::io::Error>>,
    broken: AtomicBool,
}

impl Pool<'_, '_> {
    /// Queues a file for hashing, starting the workers first if need be; gives the job back
    /// when no worker runs to take it.
    fn send(&self, job: FileJob) -> Option<FileJob> {
        self.started.call_once(|| self.start());
        if self.broken.load(Ordering::SeqCst) {
            return Some(job);
        }
        self.jobs.send(job).err().map(|SendError(job)| job)
    }

    fn start(&self) {
        for i in 0..self.threads {
            let rx = self.rx;
            let (backup, progress, counters) = (self.backup, self.progress, self.counters);
            let peers = self.peers;
            let spawned = std::thread::Builder::new()
                .name(format!("agentdiff-hash-{i}"))
                .spawn_scoped(self.scope, move || {
                    let hashed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        worker(rx, backup, progress, counters)
                    }));
                    // Its file's directory would never complete: fail the scan instead.
                    if let Err(panic) = hashed {
                        peers.abort(Event::Wake);
                        std::panic::resume_unwind(panic)
                    }
                });
            if let Err(e) = spawned {
                *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                self.broken.store(true, Ordering::SeqCst);
                break;
            }
        }
    }
}

fn worker(
    rx: &Mutex<Receiver<FileJob>>,
    backup: Option<BackupRequest>,
    progress: Option<&(dyn Fn(&ScanProgress) + Sync)>,
    counters: &Counters,
) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let job = match rx.lock() {
            Ok(guard) => match guard.recv() {
                Ok(job) => job,
                Err(_) => break, // the walk is done
            },
            Err(_) => break,
        };
        let FileJob {
            parent,
            reply,
            c_name,
            dir,
            name,
            seen,
        } = job;
        let captured = capture(&parent, &c_name, &seen, backup.as_ref(), &mut buf, &|| {});
        drop(parent);
        counters.file_done(captured.bytes_hashed, progress);
        // A walker that stopped (the scan failed) no longer wants the result.
        let _ = reply.send(Event::File(FileResult {
            dir,
            name,
            seen,
            captured,
        }));
    }
}

/// Reads `ROOT/.agentdiffignore` through the root fd without following a symlink.
fn read_ignore_file(root: &OwnedFd) -> Result<Vec<String>, ScanError> {
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY;
    let fd = match openat(Some(root.as_raw_fd()), IGNORE_FILE, flags, Mode::empty()) {
        // SAFETY: `openat` just returned this descriptor and nothing else owns it.
        Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
        Err(Errno::ENOENT) => return Ok(Vec::new()),
        Err(Errno::ELOOP) => {
            return Err(ScanError::IgnoreFile(
                "is a symlink; replace it with a regular file".into(),
            ))
        }
        Err(e) => return Err(ScanError::IgnoreFile(format!("cannot open: {}", e.desc()))),
    };
    match fstat(fd.as_raw_fd()) {
        Ok(st) if Meta::from_stat(&st).is(SFlag::S_IFREG) => {}
        Ok(_) => {
            return Err(ScanError::IgnoreFile(
                "is not a regular file; replace or remove it".into(),
            ))
        }
        Err(e) => return Err(ScanError::IgnoreFile(format!("cannot fstat: {}", e.desc()))),
    }
    let mut bytes = Vec::new();
    let file = std::fs::File::from(fd);
    use std::io::Read;
    file.take(1 << 21)
        .read_to_end(&mut bytes)
        .map_err(|e| ScanError::IgnoreFile(format!("cannot read: {e}")))?;
    parse_ignore_file(&bytes)
}

fn entry(seen: &Meta, kind: EntryKind, backup: BackupState) -> Entry {
    Entry {
        kind,
        size: seen.size,
        mode: seen.perm,
        mtime_ns: seen.mtime_ns,
        ctime_ns: seen.ctime_ns,
        dev: seen.dev,
        ino: seen.ino,
        nlink: seen.nlink,
        sha256: None,
        symlink_target: None,
        backup,
    }
}

fn type_name(seen: &Meta) -> &'static str {
    if seen.is(SFlag::S_IFIFO) {
        uk::FIFO
    } else if seen.is(SFlag::S_IFSOCK) {
        uk::SOCKET
    } else if seen.is(SFlag::S_IFCHR) {
        uk::CHAR_DEVICE
    } else if seen.is(SFlag::S_IFBLK) {
        uk::BLOCK_DEVICE
    } else {
        uk::UNKNOWN_TYPE
    }
}

/// A directory's place while it is listed.
struct Listing<'p, 'a> {
    id: u64,
    rel: &'p str,
    searched: bool,
    /// In a git directory (this one has git's layout, or one above it has): every entry is
    /// git metadata, which no ignore rule hides.
    git: bool,
    /// The root, with git's layout: its entries with git's own names are git metadata.
    root_git: bool,
    prev: Option<&'p Prev<'a>>,
    /// The earlier tree's stat digest, used instead of `prev` (see [`StatDigests`]).
    digest: Option<&'a DirDigest>,
}

impl Listing<'_, '_> {
    /// Where the subdirectory `name`'s earlier listing is found.
    fn sub(&self, name: &str) -> Option<PrevRef> {
        match self.digest {
            Some(d) => d.sub(name).map(PrevRef::Tree),
            None => self.prev.and_then(|p| p.sub(name)),
        }
    }
}

impl<'o, 'a> Walker<'o, 'a> {
    fn report(&mut self, path: String, kind: &str, reason: impl Into<String>) {
        self.unsupported.push(Unsupported {
            path,
            kind: kind.to_string(),
            reason: reason.into(),
        });
    }

    fn new(ctx: Ctx<'o, 'a>, inbox: Sender<Event>) -> Self {
        Walker {
            opts: ctx.opts,
            rules: ctx.rules,
            reuse: Reuse::of(ctx.opts, ctx.root),
            counters: ctx.counters,
            sink: ctx.sink,
            peers: ctx.peers,
            inbox,
            root_done: false,
            idle_listed: false,
            open: HashMap::new(),
            next_id: 0,
            held: 0,
            max_held: 0,
            root_tree: None,
            sink_error: None,
            list_buf: Vec::new(),
            deferred: Vec::new(),
            digests: ctx.opts.collect_digests.then(StatDigests::default),
            unsupported: Vec::new(),
            excluded: Vec::new(),
            git_layouts: Vec::new(),
            stats: ScanStats::default(),
        }
    }

    fn found(&mut self) -> Found {
        Found {
            unsupported: std::mem::take(&mut self.unsupported),
            excluded: std::mem::take(&mut self.excluded),
            stats: std::mem::take(&mut self.stats),
            digests: self.digests.take(),
            sink_error: self.sink_error.take(),
            git_layouts: std::mem::take(&mut self.git_layouts),
            max_held: self.max_held,
        }
    }

    /// Walks the tree from `root` (the first walker), handing directories to `helpers` as it
    /// finds them; returns when the root is complete or the scan failed.
    fn walk(
        &mut self,
        root: Arc<OwnedFd>,
        inbox: &Receiver<Event>,
        jobs: &Pool<'_, '_>,
        helpers: &mut Helpers<'_, '_, 'o, 'a>,
    ) {
        let mut stack = Stack::new();
        let root_id = self.open_node(String::new(), None, false, None);
        let prev = self.reuse.as_ref().map(|r| r.root.clone());
        self.list_dir(&root, root_id, "", (false, false), prev, &mut stack, jobs);
        drop(root);
        self.run(stack, inbox, jobs, Some(helpers));
    }

    /// Lists directories depth-first until this walker's part is over: for the first walker,
    /// the root is complete; for the others, they are stopped. Results and work from other
    /// threads arrive in `inbox`, drained before each listing, so a directory whose files are
    /// hashed completes (and leaves memory) before the next one is held.
    fn run(
        &mut self,
        mut stack: Stack,
        inbox: &Receiver<Event>,
        jobs: &Pool<'_, '_>,
        mut helpers: Option<&mut Helpers<'_, '_, 'o, 'a>>,
    ) {
        loop {
            while let Ok(event) = inbox.try_recv() {
                if !self.handle(event, &mut stack) {
                    return;
                }
            }
            if self.sink_error.is_some() || self.peers.aborted() || self.root_done {
                return;
            }
            if let Some(dir) = stack.pop_back() {
                self.share(&mut stack, helpers.as_deref_mut());
                self.open_and_list(dir, &mut stack, jobs);
                continue;
            }
            // Nothing to list: wait for results, and take work from a busy walker meanwhile.
            if !self.idle_listed {
                self.peers.idle(self.inbox.clone());
                self.idle_listed = true;
            }
            let Ok(event) = inbox.recv() else {
                return;
            };
            if !self.handle(event, &mut stack) {
                return;
            }
        }
    }

    /// Acts on one inbox event; `false` when the walker is stopped.
    fn handle(&mut self, event: Event, stack: &mut Stack) -> bool {
        match event {
            Event::File(r) => self.file_result(r),
            Event::Subtree { dir, name, tree } => {
                if let (Some(t), Some(p)) = (tree, self.open.get_mut(&dir)) {
                    p.tree.trees.insert(name, t);
                }
                self.done_one(dir);
            }
            Event::Job(dir) => {
                // Given work only once taken off the idle list.
                self.idle_listed = false;
                stack.push_back(dir);
            }
            Event::Wake => {}
            Event::Stop => return false,
        }
        true
    }

    /// Hands the shallowest directory on the stack (the largest piece of work held) to an idle
    /// walker, or to a new one while fewer than the most run; the rest stays here.
    fn share(&self, stack: &mut Stack, helpers: Option<&mut Helpers<'_, '_, 'o, 'a>>) {
        if stack.is_empty() {
            return;
        }
        let idle = self.peers.take_idle();
        if idle.is_none() && !helpers.as_ref().is_some_and(|h| h.can_start()) {
            return;
        }
        let Some(mut job) = stack.pop_front() else {
            return;
        };
        job.owner.get_or_insert_with(|| self.inbox.clone());
        let kept = match (idle, helpers) {
            (Some(to), _) => match to.send(Event::Job(job)) {
                Err(SendError(Event::Job(job))) => Some(job),
                _ => None,
            },
            (None, Some(h)) => h.start(job),
            (None, None) => Some(job),
        };
        if let Some(job) = kept {
            stack.push_front(job);
        }
    }
}

mod file;
mod list;
mod sweep;
mod tree;

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    fn with_hook<T>(hook: Box<dyn FnMut(&str)>, f: impl FnOnce() -> T) -> T {
        BEFORE_OPEN_DIR.with(|h| *h.borrow_mut() = Some(hook));
        let out = f();
        BEFORE_OPEN_DIR.with(|h| *h.borrow_mut() = None);
        out
    }

    fn outside_tree() -> tempfile::TempDir {
        let out = tempfile::tempdir().unwrap();
        fs::write(out.path().join("outside_secret"), b"secret").unwrap();
        fs::create_dir(out.path().join("b")).unwrap();
        fs::write(out.path().join("b/outside_secret"), b"secret").unwrap();
        out
    }

    fn assert_nothing_outside(m: &Manifest) {
        for p in m
            .entries
            .keys()
            .chain(m.unsupported.iter().map(|u| &u.path))
        {
            assert!(!p.contains("outside_secret"), "walk escaped the root: {p}");
        }
    }

    #[test]
    fn directory_swapped_for_symlink_before_open_is_not_followed() {
        let out = outside_tree();
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("a")).unwrap();
        fs::write(root.path().join("a/inner"), b"x").unwrap();
        let (r, o) = (root.path().to_path_buf(), out.path().to_path_buf());
        let hook = Box::new(move |rel: &str| {
            if rel == "a" {
                fs::rename(r.join("a"), r.join("a_moved")).unwrap();
                symlink(&o, r.join("a")).unwrap();
            }
        });
        let m = with_hook(hook, || crate::scan(root.path(), &ScanOptions::new())).unwrap();
        assert_nothing_outside(&m);
        assert!(!m.entries.contains_key("a/inner"));
        assert!(
            m.unsupported
                .iter()
                .any(|u| u.path == "a" && u.kind == uk::CHANGED_DURING_CAPTURE),
            "{:?}",
            m.unsupported
        );
    }

    #[test]
    fn parent_swapped_after_open_keeps_walking_the_real_directory() {
        let out = outside_tree();
        let root = tempfile::tempdir().unwrap();
        fs::create_dir_all(root.path().join("a/b")).unwrap();
        fs::write(root.path().join("a/b/inner"), b"x").unwrap();
        let (r, o) = (root.path().to_path_buf(), out.path().to_path_buf());
        // When `a/b` is about to be opened, `a` is already open: replace the path `a` by a link to
        // a tree that also has a `b`. Resolving "a/b" as a string would now land outside.
        let hook = Box::new(move |rel: &str| {
            if rel == "a/b" {
                fs::rename(r.join("a"), r.join("a_moved")).unwrap();
                symlink(&o, r.join("a")).unwrap();
            }
        });
        let m = with_hook(hook, || crate::scan(root.path(), &ScanOptions::new())).unwrap();
        assert_nothing_outside(&m);
        assert!(
            m.entries.contains_key("a/b/inner"),
            "{:?}",
            m.entries.keys().collect::<Vec<_>>()
        );
    }

    #[test]
    fn directory_replaced_by_another_directory_is_changed_during_capture() {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("a")).unwrap();
        fs::write(root.path().join("a/inner"), b"x").unwrap();
        let r = root.path().to_path_buf();
        let hook = Box::new(move |rel: &str| {
            if rel == "a" {
                fs::rename(r.join("a"), r.join("a_moved")).unwrap();
                fs::create_dir(r.join("a")).unwrap();
                fs::write(r.join("a/planted"), b"y").unwrap();
            }
        });
        let m = with_hook(hook, || crate::scan(root.path(), &ScanOptions::new())).unwrap();
        assert!(!m.entries.contains_key("a/planted"));
        assert!(m
            .unsupported
            .iter()
            .any(|u| u.path == "a" && u.kind == uk::CHANGED_DURING_CAPTURE));
    }
}
