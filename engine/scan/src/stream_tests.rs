//! The streamed scan and the tree comparison against the in-memory manifest and [`compare`]:
//! equal subtrees are never read, every change deep in the tree is found, and the scan holds one
//! directory's working set, not the tree.

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Mutex;

use super::tree::{Tree, TreeError, TreeSink, TreeSource};
use super::walk::MAX_HELD;
use super::*;

/// Tree objects in memory, with a log of every id read.
#[derive(Default)]
struct MemTrees {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    reads: Mutex<Vec<String>>,
}

impl TreeSource for MemTrees {
    fn tree(&self, id: &str) -> Result<Tree, TreeError> {
        self.reads.lock().unwrap().push(id.to_string());
        let bytes = self.objects.lock().unwrap().get(id).cloned();
        let bytes = bytes.ok_or_else(|| TreeError::store(format!("no object {id}")))?;
        if Tree::id_of(&bytes) != id {
            return Err(TreeError::store(format!("object {id} is corrupt")));
        }
        Tree::parse(id, &bytes)
    }
}

impl TreeSink for &MemTrees {
    fn directory(&mut self, dir: &str, tree: Tree) -> Result<String, TreeError> {
        let bytes = tree.to_bytes(dir)?;
        let id = Tree::id_of(&bytes);
        self.objects.lock().unwrap().insert(id.clone(), bytes);
        Ok(id)
    }

    /// The objects are held intact in memory: the tree need not be read (nor counted as read).
    fn unchanged_unread(
        &mut self,
        _dir: &str,
        id: &str,
        _entries: usize,
        _src: &dyn TreeSource,
    ) -> Result<String, TreeError> {
        assert!(self.objects.lock().unwrap().contains_key(id), "{id}");
        Ok(id.to_string())
    }
}

impl MemTrees {
    fn take_reads(&self) -> Vec<String> {
        std::mem::take(&mut *self.reads.lock().unwrap())
    }

    /// The id of the subtree at `dir` below `root` (reading the path to it).
    fn subtree(&self, root: &str, dir: &str) -> String {
        let mut id = root.to_string();
        for part in dir.split('/') {
            id = self.tree(&id).unwrap().trees[part].clone();
        }
        id
    }
}

/// Scans `root` into `trees` and in memory; returns (streamed header, root tree, full manifest).
fn both(root: &Path, trees: &MemTrees) -> (Manifest, String, Manifest) {
    let opts = ScanOptions::new();
    let mut sink = trees;
    let streamed = scan_to(root, &opts, &mut sink).unwrap();
    assert!(
        streamed.manifest.entries.is_empty(),
        "entries go to the sink"
    );
    let full = scan(root, &opts).unwrap();
    (streamed.manifest, streamed.root_tree, full)
}

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

/// A tree with an unchanged subtree `keep/` and a deep `deep/a/b/c/`.
fn base() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for i in 0..5 {
        write(d.path(), &format!("keep/x/f{i}.rs"), "same");
    }
    write(d.path(), "deep/a/b/c/file.rs", "v1");
    write(d.path(), "deep/a/b/c/gone.rs", "bye");
    write(d.path(), "deep/a/sibling.rs", "s");
    write(d.path(), "dir_to_file/inner", "i");
    write(d.path(), "file_to_dir", "f");
    fs::create_dir(d.path().join("link_to_dir_target")).unwrap();
    symlink("link_to_dir_target", d.path().join("swap")).unwrap();
    write(d.path(), "node_modules/pkg/index.js", "1");
    d
}

/// Compares before and after both ways and checks they agree; returns the tree comparison.
fn compare_both(
    trees: &MemTrees,
    before: &(Manifest, String, Manifest),
    after: &(Manifest, String, Manifest),
) -> Comparison {
    let streamed = compare_trees(&before.0, &before.1, &after.0, &after.1, trees);
    assert!(streamed.incomplete.is_empty(), "{:?}", streamed.incomplete);
    assert_eq!(streamed, compare(&before.2, &after.2));
    streamed
}

#[test]
fn equal_subtrees_are_skipped_without_being_read() {
    let d = base();
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    write(d.path(), "deep/a/b/c/file.rs", "v2");
    let after = both(d.path(), &trees);
    let keep = trees.subtree(&before.1, "keep");
    assert_eq!(keep, trees.subtree(&after.1, "keep"));
    // The unchanged subtree's object is destroyed: a comparison that read it would fail.
    trees
        .objects
        .lock()
        .unwrap()
        .insert(keep.clone(), b"garbage".to_vec());
    trees.take_reads();
    let c = compare_both(&trees, &before, &after);
    let paths: Vec<&str> = c.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["deep/a/b/c/file.rs"], "{c:?}");
    let reads = trees.take_reads();
    assert!(!reads.contains(&keep), "the equal subtree was read");
    // Only the changed path's trees were read: root, deep, a, b, c on each side.
    assert_eq!(reads.len(), 10, "{reads:?}");

    // Identical scans: the roots are equal and nothing at all is read.
    let again = both(d.path(), &trees);
    trees.take_reads();
    let c = compare_trees(&after.0, &after.1, &again.0, &again.1, &trees);
    assert!(c.changes.is_empty());
    assert!(trees.take_reads().is_empty());
}

#[test]
fn deep_changes_kind_swaps_and_odd_names_match_the_in_memory_diff() {
    let d = base();
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    let r = d.path();
    write(r, "deep/a/b/c/new.rs", "n");
    fs::remove_file(r.join("deep/a/b/c/gone.rs")).unwrap();
    fs::remove_dir_all(r.join("dir_to_file")).unwrap();
    write(r, "dir_to_file", "now a file");
    fs::remove_file(r.join("file_to_dir")).unwrap();
    write(r, "file_to_dir/inside", "x");
    fs::remove_file(r.join("swap")).unwrap();
    write(r, "swap/planted", "p");
    write(r, "odd/new\nline", "n");
    fs::write(r.join(std::ffi::OsStr::from_bytes(b"odd/bad\xff")), "b").unwrap();
    write(r, "node_modules/pkg/index.js", "2");
    write(r, ".agentdiff/objects/planted", "p");
    let after = both(r, &trees);
    let c = compare_both(&trees, &before, &after);
    let got: Vec<(&str, ChangeType)> = c
        .changes
        .iter()
        .map(|c| (c.path.as_str(), c.change_type))
        .collect();
    use ChangeType::*;
    assert_eq!(
        got,
        [
            ("deep/a/b/c/gone.rs", Deleted),
            ("deep/a/b/c/new.rs", Created),
            ("dir_to_file", Modified),
            ("dir_to_file/inner", Deleted),
            ("file_to_dir", Modified),
            ("file_to_dir/inside", Created),
            ("odd", Created),
            ("odd/new\nline", Created),
            ("swap", Modified),
            ("swap/planted", Created),
        ]
    );
    assert!(c
        .changes
        .iter()
        .all(|c| !c.path.starts_with("node_modules")));
    assert_eq!(c.unsupported.len(), 1, "{:?}", c.unsupported);
    assert_eq!(c.unsupported[0].path, "odd/bad\\xff");
}

/// A new hard link's other names are found in the after trees, as in the in-memory manifest:
/// one inside an unchanged subtree (which the comparison itself skips) included.
#[test]
fn a_new_hard_link_is_named_by_its_other_names_in_both_comparisons() {
    let d = base();
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    fs::hard_link(
        d.path().join("keep/x/f1.rs"),
        d.path().join("deep/alias.rs"),
    )
    .unwrap();
    let after = both(d.path(), &trees);
    let c = compare_both(&trees, &before, &after);
    let names = &c.links["deep/alias.rs"];
    assert_eq!(names.others, vec!["keep/x/f1.rs".to_owned()]);
    assert!(names.complete && names.nlink == 2, "{names:?}");
    assert_eq!(c.links.len(), 1, "{:?}", c.links);
}

#[test]
fn a_capture_status_change_inside_an_equal_subtree_is_still_reported() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a/b/big", "0123456789");
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    let mut after = both(d.path(), &trees);
    assert_eq!(before.1, after.1);
    // Same entries, but the after side records a capture problem for the file.
    let problem = Unsupported {
        path: "a/b/big".into(),
        kind: unsupported_kind::CHANGED_DURING_CAPTURE.into(),
        reason: "r".into(),
    };
    after.0.unsupported.push(problem.clone());
    after.2.unsupported.push(problem);
    let c = compare_both(&trees, &before, &after);
    assert_eq!(c.changes.len(), 1);
    assert!(c.changes[0].unverified.is_some());
    assert!(c.after_unsupported_entries.contains("a/b/big"));
}

#[test]
fn the_scan_holds_one_directory_working_set_not_the_tree() {
    let d = tempfile::tempdir().unwrap();
    for dir in 0..40 {
        for f in 0..50 {
            write(d.path(), &format!("d{dir:02}/f{f:02}"), "x");
        }
    }
    let trees = MemTrees::default();
    let mut opts = ScanOptions::new();
    opts.threads = 1;
    let mut sink = &trees;
    let streamed = scan_to(d.path(), &opts, &mut sink).unwrap();
    assert_eq!(streamed.manifest.stats.files, 2000);
    let held = MAX_HELD.with(|m| m.get());
    // The root's 40 entries plus the few directories whose files are still queued for hashing
    // (the queue holds 32 jobs per worker): far from the 2,040 entries of the tree.
    assert!(held >= 50, "one directory is held whole: {held}");
    assert!(held <= 40 + 3 * 50, "held {held} entries at once");

    // Reusing hashes from the stored trees reads them directory by directory, with the same
    // bound, and finds every file unchanged.
    let mut again = ScanOptions::new();
    again.threads = 1;
    again.reuse_tree = Some(settled_reuse(&streamed, &trees));
    let mut sink = &trees;
    let reused = scan_to(d.path(), &again, &mut sink).unwrap();
    assert_eq!(reused.manifest.stats.hashes_reused, 2000);
    assert_eq!(reused.manifest.stats.bytes_hashed, 0);
    assert_eq!(reused.root_tree, streamed.root_tree);
    assert!(MAX_HELD.with(|m| m.get()) <= 40 + 3 * 50);
}

#[test]
fn a_damaged_earlier_tree_only_costs_its_reuse() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a/f", "x");
    write(d.path(), "b/f", "y");
    let trees = MemTrees::default();
    let mut sink = &trees;
    let first = scan_to(d.path(), &ScanOptions::new(), &mut sink).unwrap();
    let a = trees.subtree(&first.root_tree, "a");
    trees.objects.lock().unwrap().insert(a, b"{}".to_vec());
    let again = rescan_reusing(d.path(), &first, &trees);
    assert_eq!(again.manifest.stats.hashes_reused, 1, "only b/f");
    assert_eq!(again.root_tree, first.root_tree, "a/ was hashed again");
}

/// Replaces the stored object `id` with bytes that no longer match it.
fn destroy(trees: &MemTrees, id: &str) {
    trees
        .objects
        .lock()
        .unwrap()
        .insert(id.to_string(), b"garbage".to_vec());
}

#[test]
fn an_unreadable_before_subtree_lists_the_after_side_as_unverified_and_carries_on() {
    let d = base();
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    let r = d.path();
    // The command writes under `deep/` (whose before tree it then destroys) and elsewhere.
    write(r, "deep/a/b/c/file.rs", "v2");
    write(r, "deep/a/planted.rs", "p");
    write(r, "elsewhere.rs", "e");
    let after = both(r, &trees);
    destroy(&trees, &trees.subtree(&before.1, "deep"));
    let c = compare_trees(&before.0, &before.1, &after.0, &after.1, &trees);
    assert_eq!(c.incomplete.len(), 1, "{:?}", c.incomplete);
    assert!(c.incomplete[0].contains("\"deep\""), "{:?}", c.incomplete);
    let got: Vec<(&str, ChangeType, bool)> = c
        .changes
        .iter()
        .map(|c| (c.path.as_str(), c.change_type, c.unverified.is_some()))
        .collect();
    use ChangeType::*;
    // Every file the after side shows below `deep/` is listed (unverified, whether or not it
    // changed); the comparison went on to find `elsewhere.rs`.
    assert_eq!(
        got,
        [
            ("deep/a/b/c/file.rs", Modified, true),
            ("deep/a/b/c/gone.rs", Modified, true),
            ("deep/a/planted.rs", Modified, true),
            ("deep/a/sibling.rs", Modified, true),
            ("elsewhere.rs", Created, false),
        ]
    );
    assert!(c.changes[0].before.is_none() && c.changes[0].after.is_some());
}

#[test]
fn an_unreadable_root_on_either_side_lists_the_other_side_whole() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "cfg/hooks/pre-commit", "x");
    write(d.path(), "src/a.rs", "a");
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    write(d.path(), "cfg/hooks/post-checkout", "evil");
    write(d.path(), "src/a.rs", "a+");
    let after = both(d.path(), &trees);
    destroy(&trees, &before.1);
    let c = compare_trees(&before.0, &before.1, &after.0, &after.1, &trees);
    assert!(!c.incomplete.is_empty());
    let paths: Vec<&str> = c.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "cfg/hooks/post-checkout",
            "cfg/hooks/pre-commit",
            "src/a.rs"
        ]
    );
    assert!(c.changes.iter().all(|c| c.unverified.is_some()));

    // The after root destroyed instead: the before side's files are listed.
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    write(d.path(), "src/a.rs", "a++");
    let after = both(d.path(), &trees);
    destroy(&trees, &after.1);
    let c = compare_trees(&before.0, &before.1, &after.0, &after.1, &trees);
    assert!(!c.incomplete.is_empty());
    assert_eq!(c.changes.len(), 3, "{:?}", c.changes);
    assert!(c.changes.iter().all(|c| c.after.is_none()));
}

#[test]
fn capture_records_are_looked_up_reading_each_tree_once() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..30 {
        write(d.path(), &format!("top/d{i:02}/f"), "x");
        write(d.path(), &format!("top/d{i:02}-x/f"), "x");
    }
    write(d.path(), "other/f", "x");
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    let mut after = both(d.path(), &trees);
    assert_eq!(before.1, after.1);
    let record = |path: String| Unsupported {
        path,
        kind: unsupported_kind::FIFO.into(),
        reason: "r".into(),
    };
    // The same records on both sides, and the roots equal: nothing is read at all.
    let mut same = (before.0.clone(), after.0.clone());
    same.0.unsupported.push(record("other/p".into()));
    same.1.unsupported.push(record("other/p".into()));
    trees.take_reads();
    let c = compare_trees(&same.0, &before.1, &same.1, &after.1, &trees);
    assert_eq!(c, Comparison::default());
    assert!(trees.take_reads().is_empty());

    // A FIFO appears in every directory (sorted by string, `d00-x` falls between `d00` and
    // `d00/`): each tree on the records' paths is read once per side, never the root again.
    for i in 0..30 {
        after.0.unsupported.push(record(format!("top/d{i:02}/p")));
        after.0.unsupported.push(record(format!("top/d{i:02}-x/p")));
    }
    let c = compare_trees(&before.0, &before.1, &after.0, &after.1, &trees);
    assert!(c.incomplete.is_empty());
    assert_eq!(c.unsupported.len(), 60);
    let reads = trees.take_reads();
    // root, top and the 60 directories, on each side.
    assert_eq!(reads.len(), 2 * 62, "{}", reads.len());
}

#[test]
fn a_failed_look_up_is_incomplete_not_a_silent_nothing() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a/f", "x");
    let trees = MemTrees::default();
    let before = both(d.path(), &trees);
    write(d.path(), "a/g", "y");
    let mut after = both(d.path(), &trees);
    after.0.unsupported.push(Unsupported {
        path: "a/f".into(),
        kind: unsupported_kind::CHANGED_DURING_CAPTURE.into(),
        reason: "r".into(),
    });
    destroy(&trees, &trees.subtree(&before.1, "a"));
    let c = compare_trees(&before.0, &before.1, &after.0, &after.1, &trees);
    // The walk could not read `a` before; the look-up of `a/f` could not either.
    assert_eq!(c.incomplete.len(), 2, "{:?}", c.incomplete);
    let paths: Vec<&str> = c.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, ["a/f", "a/g"]);
    assert!(c.changes.iter().all(|c| c
        .unverified
        .as_deref()
        .unwrap()
        .contains("could not be read")));
}

/// Stores `m`'s entries as trees in `trees` (post-order, as the scan does) and returns the root.
fn store_manifest(m: &Manifest, trees: &MemTrees) -> String {
    use std::collections::BTreeMap;
    let parent = |p: &str| p.rsplit_once('/').map_or("", |(d, _)| d).to_string();
    let mut dirs: BTreeMap<String, Tree> = BTreeMap::new();
    let ensure = |dirs: &mut BTreeMap<String, Tree>, d: &str| {
        let mut d = d.to_string();
        loop {
            dirs.entry(d.clone()).or_default();
            if d.is_empty() {
                break;
            }
            d = parent(&d);
        }
    };
    ensure(&mut dirs, "");
    for (path, e) in &m.entries {
        ensure(&mut dirs, &parent(path));
        if e.kind == EntryKind::Directory {
            ensure(&mut dirs, path);
        }
        let name = path.rsplit('/').next().unwrap().to_string();
        dirs.get_mut(&parent(path))
            .unwrap()
            .entries
            .insert(name, e.clone());
    }
    let mut order: Vec<String> = dirs.keys().cloned().collect();
    order.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count() + usize::from(!d.is_empty())));
    let mut sink = trees;
    let mut root = String::new();
    for d in order {
        let t = dirs.remove(&d).unwrap();
        let id = sink.directory(&d, t).unwrap();
        if d.is_empty() {
            root = id;
        } else {
            let name = d.rsplit('/').next().unwrap().to_string();
            dirs.get_mut(&parent(&d)).unwrap().trees.insert(name, id);
        }
    }
    root
}

mod random {
    use super::*;
    use proptest::prelude::*;

    const NAMES: [&str; 3] = ["a", "b", "c"];
    const KINDS: [&str; 3] = [
        unsupported_kind::FIFO,
        unsupported_kind::UNREADABLE,
        unsupported_kind::TOO_LARGE,
    ];

    fn all_paths() -> Vec<String> {
        let mut out = Vec::new();
        for x in NAMES {
            out.push(x.to_string());
            for y in NAMES {
                out.push(format!("{x}/{y}"));
                for z in NAMES {
                    out.push(format!("{x}/{y}/{z}"));
                }
            }
        }
        out
    }

    fn entry(code: u8) -> Option<Entry> {
        let base = Entry {
            kind: EntryKind::File,
            size: 1,
            mode: 0o644,
            mtime_ns: 1,
            ctime_ns: 1,
            dev: 1,
            ino: 1,
            nlink: 1,
            sha256: Some("1".repeat(64)),
            symlink_target: None,
            backup: BackupState::NotRequested,
        };
        match code {
            0 | 1 => None,
            2 => Some(base),
            3 => Some(Entry {
                sha256: Some("2".repeat(64)),
                ..base
            }),
            4 => Some(Entry {
                mode: 0o755,
                ..base
            }),
            5 => Some(Entry {
                sha256: None,
                ..base
            }),
            6 => Some(Entry {
                kind: EntryKind::Symlink,
                sha256: None,
                symlink_target: Some("t".into()),
                ..base
            }),
            _ => Some(Entry {
                kind: EntryKind::Directory,
                sha256: None,
                ..base
            }),
        }
    }

    /// A manifest from one code per path (entry) and one per path (capture record).
    fn manifest(codes: &[u8], records: &[u8]) -> Manifest {
        let paths = all_paths();
        let mut entries = std::collections::BTreeMap::new();
        for (p, c) in paths.iter().zip(codes) {
            if let Some(e) = entry(*c) {
                entries.insert(p.clone(), e);
            }
        }
        // A path with something below it is a directory (or not an entry: excluded).
        let below: Vec<String> = entries.keys().cloned().collect();
        for p in &paths {
            let has_below = below.iter().any(|q| q.starts_with(&format!("{p}/")));
            if has_below {
                if let Some(e) = entries.get_mut(p) {
                    e.kind = EntryKind::Directory;
                    e.sha256 = None;
                    e.symlink_target = None;
                }
            }
        }
        let unsupported = paths
            .iter()
            .zip(records)
            .filter(|(_, r)| **r < 3)
            .map(|(p, r)| Unsupported {
                path: p.clone(),
                kind: KINDS[*r as usize].into(),
                reason: "r".into(),
            })
            .collect();
        Manifest {
            schema_version: 1,
            root: "/r".into(),
            ignore_lines: vec![],
            entries,
            unsupported,
            excluded: vec![],
            excluded_programs: None,
            git_layouts: Vec::new(),
            stats: ScanStats::default(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn compare_trees_equals_the_in_memory_comparison(
            bc in proptest::collection::vec(0u8..8, 39),
            ac in proptest::collection::vec(0u8..8, 39),
            br in proptest::collection::vec(0u8..12, 39),
            ar in proptest::collection::vec(0u8..12, 39),
            same in any::<bool>(),
        ) {
            let before = manifest(&bc, &br);
            // Often the same entries, so equal subtrees are skipped and records decide alone.
            let after = if same { manifest(&bc, &ar) } else { manifest(&ac, &ar) };
            let trees = MemTrees::default();
            let (rb, ra) = (store_manifest(&before, &trees), store_manifest(&after, &trees));
            let header = |m: &Manifest| Manifest { entries: Default::default(), ..m.clone() };
            let streamed = compare_trees(&header(&before), &rb, &header(&after), &ra, &trees);
            prop_assert!(streamed.incomplete.is_empty());
            prop_assert_eq!(streamed, compare(&before, &after));
        }
    }
}

/// Reuse of `first`'s trees as if the new scan started well after the files were written (they
/// were written just now), so no entry counts as racy.
fn settled_reuse<'a>(first: &'a Scanned, trees: &'a MemTrees) -> TreeReuse<'a> {
    TreeReuse {
        root: &first.manifest.root,
        started_ns: first
            .manifest
            .stats
            .started_ns
            .map(|s| s + 2 * RACY_MARGIN_NS),
        tree: &first.root_tree,
        source: trees,
        digests: None,
    }
}

/// A scan reusing `first`'s trees (see [`settled_reuse`]) into `trees`; as the after-scan of a
/// run (earlier backup states carried, the stat digests `first` kept used) when it kept them.
fn rescan_reusing(root: &Path, first: &Scanned, trees: &MemTrees) -> Scanned {
    let mut opts = ScanOptions::new();
    opts.reuse_tree = Some(TreeReuse {
        digests: first.digests.as_ref(),
        ..settled_reuse(first, trees)
    });
    opts.carry_backup_state = first.digests.is_some();
    let mut sink = trees;
    scan_to(root, &opts, &mut sink).unwrap()
}

#[test]
fn reused_trees_equal_a_full_hash_scan_after_adversarial_edits() {
    adversarial_edits_case(false);
}

/// The same edits for the after-scan of a run, which knows unchanged directories from the
/// before-scan's stat digests without reading their trees.
#[test]
fn stat_digest_reuse_equals_a_full_hash_scan_after_adversarial_edits() {
    adversarial_edits_case(true);
}

fn adversarial_edits_case(digests: bool) {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    for i in 0..4 {
        write(r, &format!("keep/deep/k{i}"), "kept");
    }
    write(r, "same_size/f", "aaaa");
    write(r, "swap/x", "xxxx");
    write(r, "swap/y", "yyyy");
    write(r, "mode/f", "m");
    fs::create_dir(r.join("link")).unwrap();
    symlink("t1", r.join("link/l")).unwrap();
    write(r, "kind/thing", "file");
    write(r, "hard/one", "hhhh");
    fs::hard_link(r.join("hard/one"), r.join("hard/two")).unwrap();
    write(r, "hard/single", "ssss");
    for name in [
        "odd/ name\nwith newline",
        "odd/-dash",
        "odd/\u{fc}ber",
        "odd/a\\b",
    ] {
        write(r, name, "odd!");
    }
    // Changed below directories whose own entries keep their stats: their trees are the
    // earlier entries with new subtrees.
    write(r, "nest/a/b/f", "nnnn");
    write(r, "nest/a/g", "gggg");
    let trees = MemTrees::default();
    let mut sink = &trees;
    let mut opts = ScanOptions::new();
    opts.collect_digests = digests;
    let first = scan_to(r, &opts, &mut sink).unwrap();
    assert_eq!(
        first.digests.as_ref().map(|d| d.len()),
        digests.then_some(13)
    );
    trees.take_reads();

    // Unchanged: every directory's tree is the earlier object, nothing is read.
    let same = rescan_reusing(r, &first, &trees);
    if digests {
        assert_eq!(trees.take_reads(), Vec::<String>::new(), "no tree is read");
    }
    assert_eq!(same.root_tree, first.root_tree);
    assert_eq!(same.manifest.stats.bytes_hashed, 0);
    assert_eq!(
        same.manifest.stats.trees_reused,
        same.manifest.stats.directories + 1,
        "every directory and the root"
    );

    // Past the kernel's coarse clock tick, so every edit moves a ctime.
    std::thread::sleep(std::time::Duration::from_millis(50));
    agentdiff_test_support::rewrite_in_place(&r.join("same_size/f"), b"bbbb");
    fs::rename(r.join("swap/x"), r.join("swap/tmp")).unwrap();
    fs::rename(r.join("swap/y"), r.join("swap/x")).unwrap();
    fs::rename(r.join("swap/tmp"), r.join("swap/y")).unwrap();
    fs::set_permissions(r.join("mode/f"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_file(r.join("link/l")).unwrap();
    symlink("t2", r.join("link/l")).unwrap();
    fs::remove_file(r.join("kind/thing")).unwrap();
    write(r, "kind/thing/inner", "file");
    agentdiff_test_support::rewrite_in_place(&r.join("hard/two"), b"HHHH");
    fs::hard_link(r.join("hard/single"), r.join("hard/single2")).unwrap();
    agentdiff_test_support::rewrite_in_place(&r.join("odd/ name\nwith newline"), b"odd?");
    agentdiff_test_support::rewrite_in_place(&r.join("nest/a/b/f"), b"NNNN");

    let reused = rescan_reusing(r, &first, &trees);
    let mut sink = &trees;
    let full = scan_to(r, &ScanOptions::new(), &mut sink).unwrap();
    assert_eq!(full.manifest.stats.hashes_reused, 0);
    assert_eq!(
        reused.root_tree, full.root_tree,
        "a scan reusing trees and hashes names exactly the tree a full-hash scan does"
    );
    assert_ne!(reused.root_tree, first.root_tree);
    // keep/ and keep/deep/ are reused as they are; every edited directory is written anew.
    assert_eq!(reused.manifest.stats.trees_reused, 2);
    // keep/deep/k*, the three untouched odd/ names, nest/a/g.
    assert!(reused.manifest.stats.hashes_reused >= 8);
    for (dir, changed) in [
        ("keep", false),
        ("nest", true),
        ("nest/a", true),
        ("nest/a/b", true),
        ("same_size", true),
        ("swap", true),
        ("mode", true),
        ("link", true),
        ("kind", true),
        ("hard", true),
        ("odd", true),
    ] {
        let was = trees.subtree(&first.root_tree, dir);
        let now = trees.subtree(&reused.root_tree, dir);
        assert_eq!(was != now, changed, "{dir}");
    }
}

/// A stat digest never stands for a directory with a racy file: that tree is read and each file
/// decided alone (here hashed again); a directory without files still uses its digest.
#[test]
fn stat_digests_are_not_used_for_directories_with_racy_files() {
    let d = tempfile::tempdir().unwrap();
    write(d.path(), "a/f", "x");
    let trees = MemTrees::default();
    let mut opts = ScanOptions::new();
    opts.collect_digests = true;
    let mut sink = &trees;
    let first = scan_to(d.path(), &opts, &mut sink).unwrap();
    let a = trees.subtree(&first.root_tree, "a");
    trees.take_reads();
    let mut again = ScanOptions::new();
    // The earlier scan's own start: `a/f` was written just before it, so it is racy.
    again.reuse_tree = Some(TreeReuse {
        root: &first.manifest.root,
        started_ns: first.manifest.stats.started_ns,
        tree: &first.root_tree,
        source: &trees,
        digests: first.digests.as_ref(),
    });
    again.carry_backup_state = true;
    let second = scan_to(d.path(), &again, &mut sink).unwrap();
    assert_eq!(second.root_tree, first.root_tree);
    assert_eq!(second.manifest.stats.hashes_reused, 0);
    assert_eq!(
        trees.take_reads(),
        vec![a],
        "only the racy directory's tree is read"
    );
}
