//! Comparing two manifests of the same root.
//!
//! [`diff`] classifies entries (files, directories, symlinks). A path whose capture was incomplete
//! on either side is never dropped: its [`Change::unverified`] says what could not be verified, and
//! paths that were never entries (FIFOs, sockets, devices, non-UTF-8 names) are compared by
//! [`diff_unsupported`]. Callers should treat both as needing review.
//!
//! [`compare_trees`] compares two stored manifests tree against tree. It trusts that a tree id
//! names its content (every [`TreeSource`] verifies each read against the id), so equal ids are
//! skipped unread; it reads the trees on the paths of differing subtrees and, besides, the trees
//! on the paths of capture records that differ between the sides, each at most once. It does not
//! defend against a tree it cannot read (missing, corrupt, larger than the store's read bound):
//! it cannot know what such a tree held, so it lists what the other side shows below it as
//! unverified changes and reports itself incomplete; the caller must fail closed on that
//! (`transaction::classify::classify_incomplete` denies the run).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::links::{link_names_in, link_names_in_trees, LinkNames};
use super::manifest::{unsupported_kind as uk, Entry, EntryKind, Manifest, Unsupported};
use super::tree::{join, Tree, TreeError, TreeSource, MAX_TREE_ENTRIES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeType {
    Created,
    Modified,
    Deleted,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    pub path: String,
    /// The kind after the change (before, for deletions).
    pub entry_kind: EntryKind,
    pub change_type: ChangeType,
    /// Content differs: sha256 for hashed files (for unhashed files, anything but an identical
    /// (dev, ino, size, mtime_ns, ctime_ns) counts as changed), symlink target, or the kind. Always
    /// true for created/deleted files and symlinks, never for directories.
    pub content_changed: bool,
    pub mode_changed: bool,
    pub kind_changed: bool,
    pub before: Option<Entry>,
    pub after: Option<Entry>,
    /// Why this change could not be fully verified (the path, or for a creation/deletion an
    /// ancestor directory, is in `unsupported` on a side); `None` when both sides were captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unverified: Option<String>,
}

/// A path that was never an entry on either side and whose `unsupported` records differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnsupportedChange {
    pub path: String,
    pub change_type: ChangeType,
    /// `unsupported` kinds recorded before (`None` when none), comma-separated; same for after.
    pub before_kind: Option<String>,
    pub after_kind: Option<String>,
}

/// Entry changes from `before` to `after`, sorted by path. Directories appear only when created,
/// deleted, changed kind or changed mode (never for mtime churn).
pub fn diff(before: &Manifest, after: &Manifest) -> Vec<Change> {
    let (rb, ra) = (Recorded::of(before), Recorded::of(after));
    let paths: BTreeSet<&String> = before.entries.keys().chain(after.entries.keys()).collect();
    paths
        .into_iter()
        .filter_map(|path| {
            change_at(
                path,
                before.entries.get(path),
                after.entries.get(path),
                &rb,
                &ra,
            )
        })
        .collect()
}

/// Everything a run's decision reads from comparing its two manifests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// [`diff`]'s changes.
    pub changes: Vec<Change>,
    /// [`diff_unsupported`]'s changes.
    pub unsupported: Vec<UnsupportedChange>,
    /// The paths of `after.unsupported` that are entries of the after manifest (files whose
    /// content could not be captured) and whose records differ from the before manifest's (an
    /// unchanged capture problem is not new).
    pub after_unsupported_entries: BTreeSet<String>,
    /// Why the comparison does not cover everything (each one makes the run need review).
    pub incomplete: Vec<String>,
    /// The other names of each changed file with more than one hard link, by the change's path
    /// ([`crate::links`]).
    pub links: BTreeMap<String, LinkNames>,
}

/// Compares two manifests held in memory.
pub fn compare(before: &Manifest, after: &Manifest) -> Comparison {
    let changes = diff(before, after);
    Comparison {
        links: link_names_in(&changes, &after.entries),
        changes,
        unsupported: diff_unsupported(before, after),
        after_unsupported_entries: {
            let (rb, ra) = (Recorded::of(before), Recorded::of(after));
            after
                .unsupported
                .iter()
                .filter(|u| after.entries.contains_key(&u.path))
                .filter(|u| rb.kinds(&u.path) != ra.kinds(&u.path))
                .map(|u| u.path.clone())
                .collect()
        },
        incomplete: Vec::new(),
    }
}

/// Compares two manifests stored as trees (`before`/`after` hold their headers: unsupported
/// records and exclusions; their `entries` are not read). Equal subtree ids are skipped without
/// reading them, so memory and reads grow with what changed, not with the tree. Besides, only
/// the paths whose unsupported records differ between the sides are looked up, each tree on their
/// paths read at most once. When every tree reads back, the result equals [`compare`] of the full
/// manifests.
///
/// A tree that cannot be read (missing, corrupt, too large) never ends the comparison: the entries
/// the other side shows below it are listed as unverified changes (so path rules still see them),
/// the comparison carries on, and `incomplete` says what could not be compared. The caller must
/// treat an incomplete comparison as failed (the run is denied), not as "nothing changed".
pub fn compare_trees(
    before: &Manifest,
    before_root: &str,
    after: &Manifest,
    after_root: &str,
    src: &dyn TreeSource,
) -> Comparison {
    let (rb, ra) = (Recorded::of(before), Recorded::of(after));
    let mut out = Partial::default();
    let mut stack = vec![(
        String::new(),
        Some(before_root.to_string()),
        Some(after_root.to_string()),
    )];
    while let Some((dir, b_id, a_id)) = stack.pop() {
        if b_id == a_id {
            continue; // the same subtree (or none on both sides): nothing below differs
        }
        let read = |id: &Option<String>| -> Result<Tree, TreeError> {
            id.as_deref()
                .map_or_else(|| Ok(Tree::default()), |id| src.tree(id))
        };
        let (bt, at) = match (read(&b_id), read(&a_id)) {
            (Ok(b), Ok(a)) => (b, a),
            (b, a) => {
                out.unreadable_pair(src, &dir, b, a);
                continue;
            }
        };
        let names: BTreeSet<&String> = bt.entries.keys().chain(at.entries.keys()).collect();
        for name in names {
            let path = join(&dir, name);
            let (b, a) = (bt.entries.get(name), at.entries.get(name));
            if let Some(c) = change_at(&path, b, a, &rb, &ra) {
                out.changes.insert(path, c);
            }
        }
        let subs: BTreeSet<&String> = bt.trees.keys().chain(at.trees.keys()).collect();
        for name in subs {
            let (x, y) = (bt.trees.get(name).cloned(), at.trees.get(name).cloned());
            if x != y {
                stack.push((join(&dir, name), x, y));
            }
        }
    }
    // A path whose capture status changed but whose entry did not may sit in a skipped subtree.
    // Paths with the same records on both sides need no look-up: their entries, if they differ,
    // were found above.
    let mut look_b = Lookup::new(src, before_root);
    let mut look_a = Lookup::new(src, after_root);
    let mut neither = BTreeSet::new();
    let mut after_unsupported_entries = BTreeSet::new();
    let mut named: Vec<&str> = rb
        .by_path
        .keys()
        .chain(ra.by_path.keys())
        .copied()
        .collect::<BTreeSet<&str>>()
        .into_iter()
        .filter(|p| rb.kinds(p) != ra.kinds(p))
        .collect();
    // Component order visits the trees depth-first, so each is read at most once per side.
    named.sort_by(|x, y| x.split('/').cmp(y.split('/')));
    for path in named {
        let (b, a) = (look_b.entry(path), look_a.entry(path));
        let mut notes = Vec::new();
        let (b, a) = (
            out.looked_up("before", path, b, &mut notes),
            out.looked_up("after", path, a, &mut notes),
        );
        if b.is_none() && a.is_none() {
            if notes.is_empty() {
                neither.insert(path);
            }
            continue;
        }
        if a.is_some() && ra.by_path.contains_key(path) {
            after_unsupported_entries.insert(path.to_string());
        }
        if !out.changes.contains_key(path) {
            if let Some(mut c) = change_at(path, b.as_ref(), a.as_ref(), &rb, &ra) {
                notes.extend(c.unverified.take());
                c.unverified = (!notes.is_empty()).then(|| notes.join("; "));
                out.changes.insert(path.to_string(), c);
            }
        }
    }
    let changes: Vec<Change> = out.changes.into_values().collect();
    Comparison {
        links: link_names_in_trees(&changes, after_root, src),
        changes,
        unsupported: unsupported_changes(&rb, &ra, &neither),
        after_unsupported_entries,
        incomplete: out.incomplete,
    }
}

/// What [`compare_trees`] has found so far.
#[derive(Default)]
struct Partial {
    changes: BTreeMap<String, Change>,
    incomplete: Vec<String>,
}

impl Partial {
    /// The trees of `dir` on the two sides, at least one unreadable: every entry the readable side
    /// shows below `dir` is listed as an unverified change.
    fn unreadable_pair(
        &mut self,
        src: &dyn TreeSource,
        dir: &str,
        b: Result<Tree, TreeError>,
        a: Result<Tree, TreeError>,
    ) {
        let shown = if dir.is_empty() { "the root" } else { dir };
        for (side, read) in [("before", &b), ("after", &a)] {
            if let Err(e) = read {
                self.incomplete.push(format!(
                    "the {side} tree of {shown:?} could not be read ({e}); what changed below it                      is not known"
                ));
            }
        }
        let note = |side: &str| {
            format!(
                "{side}: the tree of {shown:?} could not be read; this entry may or may not have                  changed"
            )
        };
        match (b, a) {
            (Ok(b), Err(_)) => self.list_below(src, dir, b, Side::Before, &note("after")),
            (Err(_), Ok(a)) => self.list_below(src, dir, a, Side::After, &note("before")),
            _ => {}
        }
    }

    /// Lists every entry below `dir` (whose tree is `tree`, on `side`) as an unverified change,
    /// unless a change is already listed there. Directories are not listed: they carry no content,
    /// and rollback must not act on a directory whose other side is unknown.
    fn list_below(&mut self, src: &dyn TreeSource, dir: &str, tree: Tree, side: Side, note: &str) {
        let mut seen = 0usize;
        let mut stack = vec![(dir.to_string(), tree)];
        while let Some((dir, tree)) = stack.pop() {
            seen = seen.saturating_add(tree.entries.len() + tree.trees.len());
            if seen > MAX_TREE_ENTRIES {
                self.incomplete.push(format!(
                    "{dir:?}: more than {MAX_TREE_ENTRIES} entries below an unreadable tree;                      the rest are not listed"
                ));
                return;
            }
            for (name, entry) in tree.entries {
                let path = join(&dir, &name);
                if entry.kind == EntryKind::Directory || self.changes.contains_key(&path) {
                    continue;
                }
                let (before, after) = match side {
                    Side::Before => (Some(entry), None),
                    Side::After => (None, Some(entry)),
                };
                self.changes.insert(
                    path.clone(),
                    Change {
                        path,
                        entry_kind: before
                            .as_ref()
                            .or(after.as_ref())
                            .map_or(EntryKind::File, |e| e.kind),
                        change_type: ChangeType::Modified,
                        content_changed: true,
                        mode_changed: false,
                        kind_changed: false,
                        before,
                        after,
                        unverified: Some(note.to_string()),
                    },
                );
            }
            for (name, id) in tree.trees {
                let sub = join(&dir, &name);
                match src.tree(&id) {
                    Ok(t) => stack.push((sub, t)),
                    Err(e) => self.incomplete.push(format!(
                        "the tree of {sub:?} could not be read ({e}); what changed below it is \
                         not known"
                    )),
                }
            }
        }
    }

    /// The entry a [`Lookup`] found, or `None` with a note when the look-up failed.
    fn looked_up(
        &mut self,
        side: &str,
        path: &str,
        found: Result<Option<Entry>, TreeError>,
        notes: &mut Vec<String>,
    ) -> Option<Entry> {
        match found {
            Ok(entry) => entry,
            Err(e) => {
                self.incomplete.push(format!(
                    "the {side} entry at {path:?} could not be looked up ({e})"
                ));
                notes.push(format!("{side}: its tree could not be read"));
                None
            }
        }
    }
}

#[derive(Clone, Copy)]
enum Side {
    Before,
    After,
}

/// Reads entries at paths of a stored tree, given in component order: the trees from the root to
/// the current directory are kept, so each tree is read at most once. After a read fails, the
/// side is not read again (every later look-up fails with the same reason).
struct Lookup<'s> {
    src: &'s dyn TreeSource,
    root: String,
    /// (directory, its tree) from the root down to the last directory looked up.
    chain: Vec<(String, Tree)>,
    failed: Option<String>,
}

impl<'s> Lookup<'s> {
    fn new(src: &'s dyn TreeSource, root: &str) -> Self {
        Lookup {
            src,
            root: root.to_string(),
            chain: Vec::new(),
            failed: None,
        }
    }

    fn entry(&mut self, path: &str) -> Result<Option<Entry>, TreeError> {
        if let Some(reason) = &self.failed {
            return Err(TreeError::Malformed {
                id: self.root.clone(),
                reason: reason.clone(),
            });
        }
        let (dir, name) = path.rsplit_once('/').unwrap_or(("", path));
        match self.descend(dir) {
            Ok(found) => Ok(found
                .then(|| self.chain.last())
                .flatten()
                .and_then(|(_, t)| t.entries.get(name))
                .cloned()),
            Err(e) => {
                self.failed = Some(format!("an earlier read failed: {e}"));
                Err(e)
            }
        }
    }

    /// Makes the chain end at `dir`; `false` when `dir` is not a recorded directory.
    fn descend(&mut self, dir: &str) -> Result<bool, TreeError> {
        let within = |d: &str| d.is_empty() || d == dir || dir.starts_with(&format!("{d}/"));
        while self.chain.last().is_some_and(|(d, _)| !within(d)) {
            self.chain.pop();
        }
        if self.chain.is_empty() {
            self.chain.push((String::new(), self.src.tree(&self.root)?));
        }
        loop {
            let Some((cur, tree)) = self.chain.last() else {
                return Ok(false);
            };
            if cur == dir {
                return Ok(true);
            }
            let rest = if cur.is_empty() {
                dir
            } else {
                &dir[cur.len() + 1..]
            };
            let part = rest.split('/').next().unwrap_or(rest);
            let Some(id) = tree.trees.get(part) else {
                return Ok(false);
            };
            let next = (join(cur, part), self.src.tree(id)?);
            self.chain.push(next);
        }
    }
}

/// A manifest's unsupported records by path.
struct Recorded<'m> {
    by_path: BTreeMap<&'m str, Vec<&'m Unsupported>>,
}

impl<'m> Recorded<'m> {
    fn of(m: &'m Manifest) -> Self {
        let mut by_path: BTreeMap<&str, Vec<&Unsupported>> = BTreeMap::new();
        for u in &m.unsupported {
            by_path.entry(u.path.as_str()).or_default().push(u);
        }
        Recorded { by_path }
    }

    fn at(&self, path: &str) -> &[&'m Unsupported] {
        self.by_path.get(path).map_or(&[], Vec::as_slice)
    }

    fn kinds(&self, path: &str) -> BTreeSet<&'m str> {
        self.at(path).iter().map(|u| u.kind.as_str()).collect()
    }
}

/// The change at one path, if any (`None` when both sides are equal, or neither is an entry).
fn change_at(
    path: &str,
    b: Option<&Entry>,
    a: Option<&Entry>,
    rb: &Recorded,
    ra: &Recorded,
) -> Option<Change> {
    let (change_type, entry_kind, content, mode, kind) = match (b, a) {
        (None, Some(a)) => (
            ChangeType::Created,
            a.kind,
            a.kind != EntryKind::Directory,
            false,
            false,
        ),
        (Some(b), None) => (
            ChangeType::Deleted,
            b.kind,
            b.kind != EntryKind::Directory,
            false,
            false,
        ),
        (Some(b), Some(a)) => {
            let kind = b.kind != a.kind;
            let content = kind || content_differs(b, a);
            (
                ChangeType::Modified,
                a.kind,
                content,
                b.mode != a.mode,
                kind,
            )
        }
        (None, None) => return None,
    };
    let capture_differs = rb.kinds(path) != ra.kinds(path);
    if change_type == ChangeType::Modified && !(content || mode || kind || capture_differs) {
        return None;
    }
    let mut notes = Vec::new();
    note(&mut notes, "before", rb, path);
    note(&mut notes, "after", ra, path);
    if b.is_none() {
        ancestor_note(&mut notes, "before", rb, path);
    }
    if a.is_none() {
        ancestor_note(&mut notes, "after", ra, path);
    }
    Some(Change {
        path: path.to_string(),
        entry_kind,
        change_type,
        content_changed: content,
        mode_changed: mode,
        kind_changed: kind,
        before: b.cloned(),
        after: a.cloned(),
        unverified: (!notes.is_empty()).then(|| notes.join("; ")),
    })
}

/// Changes among paths that are only in `unsupported` (never entries on either side), sorted.
pub fn diff_unsupported(before: &Manifest, after: &Manifest) -> Vec<UnsupportedChange> {
    let (rb, ra) = (Recorded::of(before), Recorded::of(after));
    let neither: BTreeSet<&str> = rb
        .by_path
        .keys()
        .chain(ra.by_path.keys())
        .copied()
        .filter(|p| !before.entries.contains_key(*p) && !after.entries.contains_key(*p))
        .collect();
    unsupported_changes(&rb, &ra, &neither)
}

/// Unsupported-record changes at `paths` (paths that are entries on neither side).
fn unsupported_changes(
    rb: &Recorded,
    ra: &Recorded,
    paths: &BTreeSet<&str>,
) -> Vec<UnsupportedChange> {
    let join = |s: &BTreeSet<&str>| s.iter().copied().collect::<Vec<_>>().join(",");
    paths
        .iter()
        .filter_map(|p| {
            let (kb, ka) = (rb.kinds(p), ra.kinds(p));
            let change_type = match (kb.is_empty(), ka.is_empty()) {
                (true, false) => ChangeType::Created,
                (false, true) => ChangeType::Deleted,
                (false, false) if kb != ka => ChangeType::Modified,
                _ => return None,
            };
            Some(UnsupportedChange {
                path: p.to_string(),
                change_type,
                before_kind: (!kb.is_empty()).then(|| join(&kb)),
                after_kind: (!ka.is_empty()).then(|| join(&ka)),
            })
        })
        .collect()
}

fn content_differs(b: &Entry, a: &Entry) -> bool {
    match b.kind {
        EntryKind::Directory => false,
        EntryKind::Symlink => b.symlink_target != a.symlink_target,
        EntryKind::File => match (&b.sha256, &a.sha256) {
            (Some(x), Some(y)) => x != y,
            // Unhashed on a side: unchanged only if the identity stamp is identical.
            _ => {
                !(b.dev == a.dev
                    && b.ino == a.ino
                    && b.size == a.size
                    && b.mtime_ns == a.mtime_ns
                    && b.ctime_ns == a.ctime_ns)
            }
        },
    }
}

fn note(notes: &mut Vec<String>, side: &str, r: &Recorded, path: &str) {
    for u in r.at(path) {
        notes.push(format!("{side}: {} ({})", u.kind, u.reason));
    }
}

/// For a path missing on `side`: an ancestor directory whose contents were not captured there
/// means the path may have existed unseen.
fn ancestor_note(notes: &mut Vec<String>, side: &str, r: &Recorded, path: &str) {
    let mut cur = path;
    while let Some(i) = cur.rfind('/') {
        cur = &cur[..i];
        for u in r.at(cur) {
            if u.kind == uk::UNREADABLE || u.kind == uk::CHANGED_DURING_CAPTURE {
                notes.push(format!(
                    "{side}: ancestor {cur} was {} ({})",
                    u.kind, u.reason
                ));
            }
        }
    }
    // The root listing itself may have failed.
    for u in r.at(".").iter().filter(|u| u.kind == uk::UNREADABLE) {
        notes.push(format!("{side}: root listing incomplete ({})", u.reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{BackupState, ScanStats, Unsupported};

    fn file(sha: &str, mode: u32) -> Entry {
        Entry {
            kind: EntryKind::File,
            size: 3,
            mode,
            mtime_ns: 1,
            ctime_ns: 1,
            dev: 1,
            ino: 7,
            nlink: 1,
            sha256: Some(sha.into()),
            symlink_target: None,
            backup: BackupState::NotRequested,
        }
    }

    fn dir(mode: u32, mtime: i64) -> Entry {
        Entry {
            kind: EntryKind::Directory,
            sha256: None,
            mtime_ns: mtime,
            ..file("", mode)
        }
    }

    fn link(target: &str) -> Entry {
        Entry {
            kind: EntryKind::Symlink,
            sha256: None,
            symlink_target: Some(target.into()),
            ..file("", 0o777)
        }
    }

    fn manifest(entries: Vec<(&str, Entry)>, unsupported: Vec<(&str, &str)>) -> Manifest {
        Manifest {
            schema_version: 1,
            root: "/r".into(),
            ignore_lines: vec![],
            entries: entries
                .into_iter()
                .map(|(p, e)| (p.to_string(), e))
                .collect(),
            unsupported: unsupported
                .into_iter()
                .map(|(p, k)| Unsupported {
                    path: p.into(),
                    kind: k.into(),
                    reason: "r".into(),
                })
                .collect(),
            excluded: vec![],
            excluded_programs: None,
            git_layouts: Vec::new(),
            stats: ScanStats::default(),
        }
    }

    #[test]
    fn classifies_created_modified_deleted_and_mode() {
        let b = manifest(
            vec![
                ("same", file("a", 0o644)),
                ("mod", file("a", 0o644)),
                ("gone", file("a", 0o644)),
                ("chmod", file("a", 0o644)),
            ],
            vec![],
        );
        let a = manifest(
            vec![
                ("same", file("a", 0o644)),
                ("mod", file("b", 0o644)),
                ("new", file("c", 0o644)),
                ("chmod", file("a", 0o755)),
            ],
            vec![],
        );
        let d = diff(&b, &a);
        let got: Vec<(&str, ChangeType, bool, bool)> = d
            .iter()
            .map(|c| {
                (
                    c.path.as_str(),
                    c.change_type,
                    c.content_changed,
                    c.mode_changed,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("chmod", ChangeType::Modified, false, true),
                ("gone", ChangeType::Deleted, true, false),
                ("mod", ChangeType::Modified, true, false),
                ("new", ChangeType::Created, true, false),
            ]
        );
        assert!(d.iter().all(|c| c.unverified.is_none()));
    }

    #[test]
    fn directories_only_for_create_delete_mode_not_mtime() {
        let b = manifest(
            vec![
                ("d", dir(0o755, 1)),
                ("old", dir(0o755, 1)),
                ("m", dir(0o755, 1)),
            ],
            vec![],
        );
        let a = manifest(
            vec![
                ("d", dir(0o755, 99)),
                ("new", dir(0o755, 1)),
                ("m", dir(0o700, 1)),
            ],
            vec![],
        );
        let d = diff(&b, &a);
        let got: Vec<(&str, ChangeType, bool)> = d
            .iter()
            .map(|c| (c.path.as_str(), c.change_type, c.content_changed))
            .collect();
        assert_eq!(
            got,
            vec![
                ("m", ChangeType::Modified, false),
                ("new", ChangeType::Created, false),
                ("old", ChangeType::Deleted, false)
            ]
        );
    }

    #[test]
    fn kind_change_and_symlink_retarget() {
        let b = manifest(vec![("x", file("a", 0o644)), ("l", link("t1"))], vec![]);
        let a = manifest(vec![("x", link("a")), ("l", link("t2"))], vec![]);
        let d = diff(&b, &a);
        assert_eq!(d.len(), 2);
        assert_eq!(
            (d[0].path.as_str(), d[0].content_changed, d[0].kind_changed),
            ("l", true, false)
        );
        assert_eq!(
            (d[1].path.as_str(), d[1].kind_changed, d[1].entry_kind),
            ("x", true, EntryKind::Symlink)
        );
    }

    #[test]
    fn unhashed_files_compare_by_identity_stamp_and_carry_a_note() {
        let mut big = file("", 0o644);
        big.sha256 = None;
        let b = manifest(
            vec![("big", big.clone()), ("big2", big.clone())],
            vec![("big", "too_large"), ("big2", "too_large")],
        );
        let mut touched = big.clone();
        touched.ctime_ns = 2;
        let a = manifest(
            vec![("big", big.clone()), ("big2", touched)],
            vec![("big", "too_large"), ("big2", "too_large")],
        );
        let d = diff(&b, &a);
        assert_eq!(
            d.len(),
            1,
            "an unchanged unhashed file is not a change: {d:?}"
        );
        assert_eq!(d[0].path, "big2");
        assert!(d[0].content_changed);
        assert!(d[0]
            .unverified
            .as_deref()
            .unwrap_or("")
            .contains("too_large"));
    }

    #[test]
    fn capture_status_change_is_never_lost() {
        // Hashed before, changed during capture after: same stamp cannot be confirmed by hash.
        let mut racing = file("a", 0o644);
        racing.sha256 = None;
        let b = manifest(vec![("f", file("a", 0o644))], vec![]);
        let a = manifest(vec![("f", racing)], vec![("f", "changed_during_capture")]);
        let d = diff(&b, &a);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].change_type, ChangeType::Modified);
        assert!(d[0].unverified.is_some());
    }

    #[test]
    fn deletion_under_an_unreadable_directory_is_marked_unverified() {
        let b = manifest(
            vec![("d", dir(0o755, 1)), ("d/f", file("a", 0o644))],
            vec![],
        );
        let a = manifest(vec![("d", dir(0o755, 1))], vec![("d", "unreadable")]);
        let d = diff(&b, &a);
        let f = d.iter().find(|c| c.path == "d/f").unwrap();
        assert_eq!(f.change_type, ChangeType::Deleted);
        assert!(f.unverified.as_deref().unwrap().contains("ancestor d"));
    }

    #[test]
    fn unsupported_only_paths_are_compared() {
        let b = manifest(
            vec![("p", file("a", 0o644))],
            vec![("fifo", "fifo"), ("sock", "socket"), ("p", "x")],
        );
        let a = manifest(
            vec![],
            vec![
                ("fifo", "fifo"),
                ("sock", "fifo"),
                ("new\\xff", "non_utf8_name"),
            ],
        );
        let d = diff_unsupported(&b, &a);
        let got: Vec<(&str, ChangeType)> =
            d.iter().map(|c| (c.path.as_str(), c.change_type)).collect();
        assert_eq!(
            got,
            vec![
                ("new\\xff", ChangeType::Created),
                ("sock", ChangeType::Modified)
            ]
        );
        assert_eq!(d[1].before_kind.as_deref(), Some("socket"));
    }
}
