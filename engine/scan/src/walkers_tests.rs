//! Several walkers list one tree (see `super::peers`): the result is the single walker's,
//! whatever the tree holds, cold or reusing an earlier scan, and a failure on any walker ends
//! the scan with that failure instead of a hang or a partial tree.

use std::collections::HashMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use super::tree::{Tree, TreeError, TreeSink, TreeSource};
use super::walk::HELPERS;
use super::*;

/// Tree objects in memory; `fail_at` makes the n-th tree handed over fail.
#[derive(Default)]
struct Objects {
    trees: Mutex<HashMap<String, Vec<u8>>>,
    calls: AtomicUsize,
    fail_at: Option<usize>,
}

impl TreeSource for Objects {
    fn tree(&self, id: &str) -> Result<Tree, TreeError> {
        let bytes = self.trees.lock().unwrap().get(id).cloned();
        let bytes = bytes.ok_or_else(|| TreeError::store(format!("no object {id}")))?;
        Tree::parse(id, &bytes)
    }
}

impl TreeSink for &Objects {
    fn directory(&mut self, dir: &str, tree: Tree) -> Result<String, TreeError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        if self.fail_at == Some(n) {
            return Err(TreeError::store(format!("refused {dir:?}")));
        }
        let bytes = tree.to_bytes(dir)?;
        let id = Tree::id_of(&bytes);
        self.trees.lock().unwrap().insert(id.clone(), bytes);
        Ok(id)
    }
}

fn write(root: &Path, rel: &str, content: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

/// Wide and deep, with every kind of entry a scan records, excludes or reports.
fn tree() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    for a in 0..12 {
        for b in 0..(a % 4 + 1) {
            for f in 0..(a + b) % 5 {
                write(r, &format!("d{a}/e{b}/f{f}.rs"), &format!("{a}{b}{f}"));
            }
            write(r, &format!("d{a}/e{b}/deep/er/est/leaf"), "leaf");
        }
        write(r, &format!("d{a}/top.txt"), "top");
    }
    fs::create_dir_all(r.join("empty/dirs/only")).unwrap();
    symlink("d1/top.txt", r.join("d2/link")).unwrap();
    symlink("/etc/passwd", r.join("d3/e0/outside")).unwrap();
    nix::unistd::mkfifo(&r.join("d4/fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let odd = std::ffi::OsStr::from_bytes(b"d5/bad\xffname");
    fs::write(r.join(odd), "x").unwrap();
    write(r, "node_modules/pkg/index.js", "1");
    write(r, "d6/big.bin", &"b".repeat(4096));
    write(r, "d7/target/out.o", "o");
    write(r, ".agentdiffignore", "d7/target/\n*.log\n");
    write(r, "d8/e1/x.log", "log");
    d
}

fn opts(walkers: usize) -> ScanOptions<'static> {
    let mut o = ScanOptions::new();
    o.walkers = walkers;
    o.threads = 2;
    o.max_hash_bytes = 1024;
    o
}

/// What a scan says, apart from timings.
fn summary(s: &Scanned) -> (String, Vec<Unsupported>, Vec<Exclusion>, [u64; 5]) {
    let st = &s.manifest.stats;
    let counts = [
        st.files,
        st.directories,
        st.symlinks,
        st.hashes_reused,
        st.trees_reused,
    ];
    (
        s.root_tree.clone(),
        s.manifest.unsupported.clone(),
        s.manifest.excluded.clone(),
        counts,
    )
}

#[test]
fn many_walkers_give_the_single_walkers_result() {
    let d = tree();
    let objects = Objects::default();
    let mut sink = &objects;
    let one = scan_to(d.path(), &opts(1), &mut sink).unwrap();
    assert_eq!(HELPERS.with(|h| h.get()), 0);
    assert!(
        one.manifest.unsupported.len() >= 3,
        "{:?}",
        one.manifest.unsupported
    );
    assert!(!one.manifest.excluded.is_empty());
    for walkers in [2, 4] {
        for _ in 0..5 {
            let many = scan_to(d.path(), &opts(walkers), &mut sink).unwrap();
            assert!(HELPERS.with(|h| h.get()) >= 1, "helpers were started");
            assert_eq!(summary(&many), summary(&one), "{walkers} walkers");
        }
    }
}

#[test]
fn many_walkers_reuse_an_earlier_scan_as_one_does() {
    let d = tree();
    let objects = Objects::default();
    let mut sink = &objects;
    let mut first_opts = opts(1);
    first_opts.collect_digests = true;
    let first = scan_to(d.path(), &first_opts, &mut sink).unwrap();
    let started = first
        .manifest
        .stats
        .started_ns
        .map(|s| s + 2 * RACY_MARGIN_NS);
    // Changes the reuse must see, in directories both walkers will hold.
    std::thread::sleep(std::time::Duration::from_millis(50));
    agentdiff_test_support::rewrite_in_place(&d.path().join("d9/e0/f0.rs"), b"990");
    write(d.path(), "d11/e3/new.rs", "new");
    fs::remove_file(d.path().join("d3/e0/f2.rs")).unwrap();
    let scan_with = |walkers: usize, digests: bool| {
        let mut o = opts(walkers);
        o.reuse_tree = Some(TreeReuse {
            root: &first.manifest.root,
            started_ns: started,
            tree: &first.root_tree,
            source: &objects,
            digests: digests.then_some(first.digests.as_ref()).flatten(),
        });
        o.carry_backup_state = digests;
        let mut sink = &objects;
        scan_to(d.path(), &o, &mut sink).unwrap()
    };
    for digests in [false, true] {
        let one = scan_with(1, digests);
        assert!(one.manifest.stats.hashes_reused > 50);
        assert_ne!(one.root_tree, first.root_tree);
        for walkers in [2, 4] {
            let many = scan_with(walkers, digests);
            assert_eq!(
                summary(&many),
                summary(&one),
                "{walkers} walkers, digests {digests}"
            );
        }
    }
    let mut sink = &objects;
    let full = scan_to(d.path(), &opts(4), &mut sink).unwrap();
    assert_eq!(scan_with(4, true).root_tree, full.root_tree);
}

#[test]
fn a_tree_refused_on_any_walker_fails_the_scan() {
    let d = tree();
    let count = {
        let objects = Objects::default();
        let mut sink = &objects;
        scan_to(d.path(), &opts(1), &mut sink).unwrap();
        objects.calls.load(Ordering::SeqCst)
    };
    assert!(count > 40);
    // Every position: the refused tree is on the first walker for some, on a helper for others.
    for fail_at in 0..count {
        let objects = Objects {
            fail_at: Some(fail_at),
            ..Objects::default()
        };
        let mut sink = &objects;
        match scan_to(d.path(), &opts(4), &mut sink) {
            Err(ScanError::Trees(e)) => assert!(e.to_string().contains("refused"), "{e}"),
            other => panic!("tree {fail_at}: {:?}", other.map(|s| s.root_tree)),
        }
    }
}

#[test]
fn a_helper_that_dies_fails_the_scan_instead_of_hanging_it() {
    let d = tree();
    // The last directory of the root by name is the first one handed to a helper.
    write(
        d.path(),
        &format!("{}/f", super::walk::PANIC_IN_HELPER),
        "x",
    );
    let root = d.path().to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let objects = Objects::default();
        let mut sink = &objects;
        let result = scan_to(&root, &opts(4), &mut sink).map(|s| s.root_tree);
        let _ = tx.send(result);
    });
    match rx.recv_timeout(std::time::Duration::from_secs(60)) {
        Ok(Err(ScanError::Incomplete)) => {}
        Ok(other) => panic!("expected an incomplete scan, got {other:?}"),
        Err(_) => panic!("the scan hung after a helper walker died"),
    }
}
