//! The other names of a changed file that has more than one hard link.
//!
//! A regular file with `nlink > 1` is one file under several names: writing it through one name
//! writes all of them. A change recorded under `src/alias` may therefore be a change to
//! `.claude/settings.json`, and creating `src/alias` as a link to it makes a second, writable door
//! to that file (a later run whose sandbox binds `.claude` read-only can still write it through
//! `src/alias`). So the decision needs, for each changed file with more than one link, its other
//! names in the after-state: they are found by their `(dev, ino)` among the after manifest's
//! entries.
//!
//! Invariants: only changes whose after side is a regular file with `nlink > 1` are looked up;
//! the after trees are visited (one at a time, keeping only those files' names) only when there
//! is one (rare: editors and build tools write new files), never otherwise. `complete` is true only when every after tree was read and the names
//! found, this one included, account for every link.
//!
//! Not covered: names outside the scanned tree (another directory on the same filesystem, an
//! excluded directory such as `node_modules/`): they are counted (`nlink` minus the names found),
//! never named. The before side is not looked up: a file whose other name also changed has that
//! name recorded as a change of its own.

use std::collections::BTreeMap;

use super::diff::Change;
use super::manifest::{Entry, EntryKind};
use super::tree::{join, TreeSource, MAX_TREE_ENTRIES};

/// The other names of one changed file (see the module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LinkNames {
    /// The file's link count in the after-state.
    pub nlink: u64,
    /// Its other names in the after-state's scanned tree, sorted.
    pub others: Vec<String>,
    /// Every after tree was read and the names found (this one included) equal `nlink`.
    pub complete: bool,
}

impl LinkNames {
    /// How many of the file's links have no name in the scanned tree.
    pub fn unnamed(&self) -> u64 {
        self.nlink.saturating_sub(self.others.len() as u64 + 1)
    }
}

fn multiply_linked(entry: Option<&Entry>) -> Option<(u64, u64, u64)> {
    entry
        .filter(|e| e.kind == EntryKind::File && e.nlink > 1)
        .map(|e| (e.dev, e.ino, e.nlink))
}

/// Calls its argument with each entry of the after-state (path, entry); returns whether every
/// entry was visited (no tree was unreadable).
pub type VisitAfter<'a> = dyn FnOnce(&mut dyn FnMut(&str, &Entry)) -> bool + 'a;

/// The other names of each change whose after side is a regular file with more than one link,
/// keyed by the change's path; empty (and nothing visited) when there is none. Only the names of
/// those files are kept, so memory grows with them, not with the tree.
pub fn link_names(changes: &[Change], visit: Box<VisitAfter<'_>>) -> BTreeMap<String, LinkNames> {
    let wanted: Vec<(&str, (u64, u64, u64))> = changes
        .iter()
        .filter_map(|c| multiply_linked(c.after.as_ref()).map(|id| (c.path.as_str(), id)))
        .collect();
    if wanted.is_empty() {
        return BTreeMap::new();
    }
    let mut by_inode: BTreeMap<(u64, u64), Vec<String>> = BTreeMap::new();
    for (_, (dev, ino, _)) in &wanted {
        by_inode.entry((*dev, *ino)).or_default();
    }
    let all_read = visit(&mut |path, entry| {
        if entry.kind != EntryKind::File {
            return;
        }
        if let Some(names) = by_inode.get_mut(&(entry.dev, entry.ino)) {
            names.push(path.to_owned());
        }
    });
    wanted
        .into_iter()
        .map(|(path, (dev, ino, nlink))| {
            let mut others: Vec<String> = by_inode
                .get(&(dev, ino))
                .into_iter()
                .flatten()
                .filter(|n| *n != path)
                .cloned()
                .collect();
            others.sort();
            let complete = all_read && others.len() as u64 + 1 >= nlink;
            (
                path.to_owned(),
                LinkNames {
                    nlink,
                    others,
                    complete,
                },
            )
        })
        .collect()
}

/// [`link_names`] over an after-state stored as trees: every readable tree is read, one at a
/// time (at most [`MAX_TREE_ENTRIES`] entries, as [`crate::read_entries`] reads).
pub fn link_names_in_trees(
    changes: &[Change],
    after_root: &str,
    src: &dyn TreeSource,
) -> BTreeMap<String, LinkNames> {
    link_names(
        changes,
        Box::new(|f: &mut dyn FnMut(&str, &Entry)| {
            let mut all_read = true;
            let mut seen = 0usize;
            let mut stack = vec![(String::new(), after_root.to_owned())];
            while let Some((dir, id)) = stack.pop() {
                let Ok(tree) = src.tree(&id) else {
                    all_read = false;
                    continue;
                };
                seen = seen.saturating_add(tree.entries.len() + tree.trees.len());
                if seen > MAX_TREE_ENTRIES {
                    return false;
                }
                for (name, entry) in &tree.entries {
                    f(&join(&dir, name), entry);
                }
                for (name, sub) in tree.trees {
                    stack.push((join(&dir, &name), sub));
                }
            }
            all_read
        }),
    )
}

/// [`link_names`] over an after-state held in memory.
pub fn link_names_in(
    changes: &[Change],
    after: &BTreeMap<String, Entry>,
) -> BTreeMap<String, LinkNames> {
    link_names(
        changes,
        Box::new(|f: &mut dyn FnMut(&str, &Entry)| {
            for (path, entry) in after {
                f(path, entry);
            }
            true
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::ChangeType;
    use crate::manifest::BackupState;

    fn file(ino: u64, nlink: u64) -> Entry {
        Entry {
            kind: EntryKind::File,
            size: 1,
            mode: 0o644,
            mtime_ns: 1,
            ctime_ns: 1,
            dev: 7,
            ino,
            nlink,
            sha256: None,
            symlink_target: None,
            backup: BackupState::NotRequested,
        }
    }

    fn added(path: &str, entry: Entry) -> Change {
        Change {
            path: path.into(),
            entry_kind: entry.kind,
            change_type: ChangeType::Created,
            content_changed: true,
            mode_changed: false,
            kind_changed: false,
            before: None,
            after: Some(entry),
            unverified: None,
        }
    }

    fn entries(list: &[(&str, Entry)]) -> BTreeMap<String, Entry> {
        list.iter()
            .map(|(p, e)| ((*p).to_owned(), e.clone()))
            .collect()
    }

    #[test]
    fn nothing_is_read_without_a_multiply_linked_change() {
        let changes = [added("src/a.rs", file(1, 1))];
        let found = link_names(
            &changes,
            Box::new(|_: &mut dyn FnMut(&str, &Entry)| panic!("the after tree was read")),
        );
        assert!(found.is_empty());
    }

    #[test]
    fn a_link_to_a_protected_file_names_it() {
        let changes = [added("src/alias", file(9, 2))];
        let after = entries(&[
            (".claude/settings.json", file(9, 2)),
            ("src/alias", file(9, 2)),
            ("src/other", file(10, 1)),
        ]);
        let found = link_names_in(&changes, &after);
        let names = &found["src/alias"];
        assert_eq!(names.others, vec![".claude/settings.json".to_owned()]);
        assert!(names.complete);
        assert_eq!(names.unnamed(), 0);
    }

    #[test]
    fn names_outside_the_scanned_tree_are_counted_not_named() {
        let changes = [added("src/x", file(9, 3))];
        let after = entries(&[("src/x", file(9, 3)), ("docs/x", file(9, 3))]);
        let found = link_names_in(&changes, &after);
        let names = &found["src/x"];
        assert_eq!(names.others, vec!["docs/x".to_owned()]);
        assert!(!names.complete);
        assert_eq!(names.unnamed(), 1);
    }

    #[test]
    fn an_unreadable_tree_leaves_the_names_incomplete() {
        let changes = [added("src/x", file(9, 2))];
        let after = entries(&[("src/x", file(9, 2)), ("a/x", file(9, 2))]);
        let found = link_names(
            &changes,
            Box::new(move |f: &mut dyn FnMut(&str, &Entry)| {
                for (p, e) in &after {
                    f(p, e);
                }
                false
            }),
        );
        assert!(!found["src/x"].complete);
    }

    #[test]
    fn another_device_with_the_same_inode_is_another_file() {
        let changes = [added("src/x", file(9, 2))];
        let mut elsewhere = file(9, 2);
        elsewhere.dev = 8;
        let after = entries(&[("src/x", file(9, 2)), ("mnt/x", elsewhere)]);
        let found = link_names_in(&changes, &after);
        assert!(found["src/x"].others.is_empty());
        assert!(!found["src/x"].complete);
    }
}
