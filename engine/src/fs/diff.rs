//! Comparing two manifests of the same root.
//!
//! [`diff`] classifies entries (files, directories, symlinks). A path whose capture was incomplete
//! on either side is never dropped: its [`Change::unverified`] says what could not be verified, and
//! paths that were never entries (FIFOs, sockets, devices, non-UTF-8 names) are compared by
//! [`diff_unsupported`]. Callers should treat both as needing review.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::manifest::{unsupported_kind as uk, Entry, EntryKind, Manifest};

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
    let paths: BTreeSet<&String> = before.entries.keys().chain(after.entries.keys()).collect();
    let mut out = Vec::new();
    for path in paths {
        let b = before.entries.get(path);
        let a = after.entries.get(path);
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
            (None, None) => continue,
        };
        let recorded_b = kinds_for(before, path);
        let recorded_a = kinds_for(after, path);
        let mut notes = Vec::new();
        note(&mut notes, "before", before, path);
        note(&mut notes, "after", after, path);
        if b.is_none() {
            ancestor_note(&mut notes, "before", before, path);
        }
        if a.is_none() {
            ancestor_note(&mut notes, "after", after, path);
        }
        let capture_differs = recorded_b != recorded_a;
        if change_type == ChangeType::Modified && !(content || mode || kind || capture_differs) {
            continue;
        }
        out.push(Change {
            path: path.clone(),
            entry_kind,
            change_type,
            content_changed: content,
            mode_changed: mode,
            kind_changed: kind,
            before: b.cloned(),
            after: a.cloned(),
            unverified: (!notes.is_empty()).then(|| notes.join("; ")),
        });
    }
    out
}

/// Changes among paths that are only in `unsupported` (never entries on either side), sorted.
pub fn diff_unsupported(before: &Manifest, after: &Manifest) -> Vec<UnsupportedChange> {
    let (b, a) = (
        unsupported_only(before, before, after),
        unsupported_only(after, before, after),
    );
    let paths: BTreeSet<&str> = b.keys().chain(a.keys()).copied().collect();
    let join =
        |s: Option<&BTreeSet<&str>>| s.map(|k| k.iter().copied().collect::<Vec<_>>().join(","));
    paths
        .into_iter()
        .filter_map(|p| {
            let (kb, ka) = (b.get(p), a.get(p));
            let change_type = match (kb, ka) {
                (None, Some(_)) => ChangeType::Created,
                (Some(_), None) => ChangeType::Deleted,
                (Some(x), Some(y)) if x != y => ChangeType::Modified,
                _ => return None,
            };
            Some(UnsupportedChange {
                path: p.to_string(),
                change_type,
                before_kind: join(kb),
                after_kind: join(ka),
            })
        })
        .collect()
}

/// `m`'s unsupported kinds per path, for paths that are entries in neither manifest.
fn unsupported_only<'m>(
    m: &'m Manifest,
    before: &Manifest,
    after: &Manifest,
) -> BTreeMap<&'m str, BTreeSet<&'m str>> {
    let mut map: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for u in &m.unsupported {
        if !before.entries.contains_key(&u.path) && !after.entries.contains_key(&u.path) {
            map.entry(u.path.as_str())
                .or_default()
                .insert(u.kind.as_str());
        }
    }
    map
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

fn kinds_for<'m>(m: &'m Manifest, path: &str) -> BTreeSet<&'m str> {
    m.unsupported
        .iter()
        .filter(|u| u.path == path)
        .map(|u| u.kind.as_str())
        .collect()
}

fn note(notes: &mut Vec<String>, side: &str, m: &Manifest, path: &str) {
    for u in m.unsupported.iter().filter(|u| u.path == path) {
        notes.push(format!("{side}: {} ({})", u.kind, u.reason));
    }
}

/// For a path missing on `side`: an ancestor directory whose contents were not captured there
/// means the path may have existed unseen.
fn ancestor_note(notes: &mut Vec<String>, side: &str, m: &Manifest, path: &str) {
    let mut cur = path;
    while let Some(i) = cur.rfind('/') {
        cur = &cur[..i];
        for u in m.unsupported.iter().filter(|u| u.path == cur) {
            if u.kind == uk::UNREADABLE || u.kind == uk::CHANGED_DURING_CAPTURE {
                notes.push(format!(
                    "{side}: ancestor {cur} was {} ({})",
                    u.kind, u.reason
                ));
            }
        }
    }
    // The root listing itself may have failed.
    for u in m
        .unsupported
        .iter()
        .filter(|u| u.path == "." && u.kind == uk::UNREADABLE)
    {
        notes.push(format!("{side}: root listing incomplete ({})", u.reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::manifest::{BackupState, ScanStats, Unsupported};

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
