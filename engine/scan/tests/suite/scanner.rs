//! Scanner behaviour on real trees: link safety, special files, names, exclusions, reuse,
//! backups and the manifest diff.

// Test helpers outside `#[test]` functions fail loudly too.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use agentdiff_scan::{
    diff, diff_unsupported, scan, BackupError, BackupRequest, BackupSink, BackupSkip, BackupState,
    ChangeType, EntryKind, IgnoreSource, Manifest, ScanError, ScanOptions, ScanProgress,
    RACY_MARGIN_NS,
};
use sha2::{Digest, Sha256};

/// In-memory object store that verifies every copy like the real store does.
#[derive(Default)]
struct MemSink {
    objects: Mutex<HashMap<String, Vec<u8>>>,
    refuse: bool,
}

impl BackupSink for MemSink {
    fn contains(&self, sha256_hex: &str, size: u64) -> bool {
        self.objects
            .lock()
            .unwrap()
            .get(sha256_hex)
            .is_some_and(|b| b.len() as u64 == size)
    }

    fn store_from(
        &self,
        file: &mut fs::File,
        sha256_hex: &str,
        size: u64,
    ) -> Result<(), BackupError> {
        if self.refuse {
            return Err(BackupError::sink("disk full"));
        }
        file.seek(SeekFrom::Start(0)).map_err(BackupError::sink)?;
        let mut bytes = Vec::new();
        file.take(size + 1)
            .read_to_end(&mut bytes)
            .map_err(BackupError::sink)?;
        if hex::encode(Sha256::digest(&bytes)) != sha256_hex {
            return Err(BackupError::sink("copy does not match the hash"));
        }
        self.objects
            .lock()
            .unwrap()
            .insert(sha256_hex.to_string(), bytes);
        Ok(())
    }
}

fn scan_ok(root: &Path, opts: &ScanOptions) -> Manifest {
    scan(root, opts).unwrap()
}

/// Runs `f` on another thread and fails (instead of hanging the suite) if it does not finish.
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("scan did not finish: it hung")
}

fn kinds<'m>(m: &'m Manifest, path: &str) -> Vec<&'m str> {
    m.unsupported
        .iter()
        .filter(|u| u.path == path)
        .map(|u| u.kind.as_str())
        .collect()
}

fn sha(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[test]
fn regular_tree_is_captured_with_metadata() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir(d.path().join("src")).unwrap();
    fs::write(d.path().join("src/main.rs"), b"fn main() {}").unwrap();
    fs::set_permissions(
        d.path().join("src/main.rs"),
        fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    let m = scan_ok(d.path(), &ScanOptions::new());
    assert_eq!(
        m.root,
        fs::canonicalize(d.path()).unwrap().to_str().unwrap()
    );
    assert_eq!(
        m.entries.keys().collect::<Vec<_>>(),
        vec!["src", "src/main.rs"]
    );
    let f = &m.entries["src/main.rs"];
    assert_eq!(f.kind, EntryKind::File);
    assert_eq!(f.sha256.as_deref(), Some(sha(b"fn main() {}").as_str()));
    assert_eq!((f.size, f.mode, f.nlink), (12, 0o4755, 1));
    assert!(f.mtime_ns > 0 && f.ctime_ns > 0 && f.ino > 0);
    assert_eq!(f.backup, BackupState::NotRequested);
    assert_eq!(m.entries["src"].kind, EntryKind::Directory);
    assert_eq!(
        (m.stats.files, m.stats.directories, m.stats.bytes_hashed),
        (1, 1, 12)
    );
    assert!(m.unsupported.is_empty() && m.excluded.is_empty());
    // The manifest round-trips through JSON.
    let json = serde_json::to_string(&m).unwrap();
    assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap(), m);
}

#[test]
fn symlink_to_outside_directory_is_recorded_not_followed() {
    let outside = tempfile::tempdir().unwrap();
    fs::write(outside.path().join("outside_secret"), b"s").unwrap();
    let d = tempfile::tempdir().unwrap();
    symlink(outside.path(), d.path().join("link")).unwrap();
    symlink("../../etc/passwd", d.path().join("rel")).unwrap();
    let m = scan_ok(d.path(), &ScanOptions::new());
    let l = &m.entries["link"];
    assert_eq!(l.kind, EntryKind::Symlink);
    assert_eq!(
        l.symlink_target.as_deref(),
        Some(outside.path().to_str().unwrap())
    );
    assert_eq!(l.sha256, None);
    assert_eq!(
        m.entries["rel"].symlink_target.as_deref(),
        Some("../../etc/passwd")
    );
    assert!(m.entries.keys().all(|p| !p.contains("outside_secret")));
    assert_eq!(m.stats.symlinks, 2);
}

#[test]
fn fifo_does_not_hang_and_is_reported() {
    let d = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(
        &d.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    fs::write(d.path().join("ok"), b"x").unwrap();
    let root = d.path().to_path_buf();
    let m = within(60, move || scan(&root, &ScanOptions::new()).unwrap());
    assert_eq!(kinds(&m, "pipe"), vec!["fifo"]);
    assert!(!m.entries.contains_key("pipe"));
    assert!(m.entries.contains_key("ok"));
}

#[test]
fn socket_is_reported() {
    let d = tempfile::tempdir().unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(d.path().join("sock")).unwrap();
    let m = scan_ok(d.path(), &ScanOptions::new());
    assert_eq!(kinds(&m, "sock"), vec!["socket"]);
    assert!(!m.entries.contains_key("sock"));
}

#[test]
fn character_device_is_reported_when_one_can_be_made() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("null");
    // /dev/null is (1, 3); mknod needs CAP_MKNOD.
    let made = nix::sys::stat::mknod(
        &p,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        nix::sys::stat::makedev(1, 3),
    );
    if let Err(e) = made {
        super::skip(&format!(
            "character_device_is_reported_when_one_can_be_made: mknod refused ({e})"
        ));
        return;
    }
    let root = d.path().to_path_buf();
    let m = within(60, move || scan(&root, &ScanOptions::new()).unwrap());
    assert_eq!(kinds(&m, "null"), vec!["char_device"]);
}

#[test]
fn hardlinked_files_get_nlink_2_and_no_backup() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("a"), b"shared").unwrap();
    fs::hard_link(d.path().join("a"), d.path().join("b")).unwrap();
    fs::write(d.path().join("solo"), b"solo").unwrap();
    let sink = MemSink::default();
    let mut opts = ScanOptions::new();
    opts.backup = Some(BackupRequest {
        sink: &sink,
        max_file_bytes: 1 << 20,
    });
    let m = scan_ok(d.path(), &opts);
    for p in ["a", "b"] {
        assert_eq!(m.entries[p].nlink, 2);
        assert_eq!(
            m.entries[p].backup,
            BackupState::Skipped {
                reason: BackupSkip::Hardlinked,
                detail: None
            }
        );
    }
    assert_eq!(m.entries["solo"].backup, BackupState::Stored);
    assert_eq!(
        sink.objects
            .lock()
            .unwrap()
            .get(&sha(b"solo"))
            .map(Vec::as_slice),
        Some(&b"solo"[..])
    );
    assert!(!sink.contains(&sha(b"shared"), 6));
    assert_eq!((m.stats.backups_stored, m.stats.backups_reused), (1, 0));

    // A second before-scan finds the object already stored.
    let m2 = scan_ok(d.path(), &opts);
    assert_eq!(m2.entries["solo"].backup, BackupState::Stored);
    assert_eq!((m2.stats.backups_stored, m2.stats.backups_reused), (0, 1));
}

#[test]
fn backup_limits_and_store_failures_are_recorded_per_file() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("big"), vec![7u8; 4096]).unwrap();
    fs::write(d.path().join("small"), b"s").unwrap();
    let sink = MemSink::default();
    let mut opts = ScanOptions::new();
    opts.backup = Some(BackupRequest {
        sink: &sink,
        max_file_bytes: 100,
    });
    let m = scan_ok(d.path(), &opts);
    assert_eq!(
        m.entries["big"].backup,
        BackupState::Skipped {
            reason: BackupSkip::TooLarge,
            detail: None
        }
    );
    assert!(
        m.entries["big"].sha256.is_some(),
        "over the backup limit is still hashed"
    );
    assert_eq!(m.entries["small"].backup, BackupState::Stored);

    let refusing = MemSink {
        refuse: true,
        ..MemSink::default()
    };
    opts.backup = Some(BackupRequest {
        sink: &refusing,
        max_file_bytes: 100,
    });
    let m = scan_ok(d.path(), &opts);
    assert_eq!(
        m.entries["small"].backup,
        BackupState::Skipped {
            reason: BackupSkip::StoreFailed,
            detail: Some("disk full".into())
        }
    );
    assert_eq!(
        m.entries["small"].sha256.as_deref(),
        Some(sha(b"s").as_str())
    );
}

#[test]
fn file_over_hash_limit_is_too_large_with_metadata_only() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("huge"), vec![0u8; 2048]).unwrap();
    fs::write(d.path().join("ok"), vec![0u8; 1024]).unwrap();
    let mut opts = ScanOptions::new();
    opts.max_hash_bytes = 1024;
    let m = scan_ok(d.path(), &opts);
    assert_eq!(kinds(&m, "huge"), vec!["too_large"]);
    assert_eq!(m.entries["huge"].sha256, None);
    assert_eq!(m.entries["huge"].size, 2048);
    assert!(m.entries["ok"].sha256.is_some());
    assert_eq!(m.stats.bytes_hashed, 1024);
}

#[test]
fn non_utf8_names_are_reported_and_not_descended() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join(OsStr::from_bytes(b"bad\xffname")), b"x").unwrap();
    fs::create_dir(d.path().join(OsStr::from_bytes(b"dir\xfe"))).unwrap();
    fs::write(d.path().join(OsStr::from_bytes(b"dir\xfe/inner")), b"x").unwrap();
    let m = scan_ok(d.path(), &ScanOptions::new());
    assert_eq!(kinds(&m, "bad\\xffname"), vec!["non_utf8_name"]);
    assert_eq!(kinds(&m, "dir\\xfe"), vec!["non_utf8_name"]);
    assert!(m
        .unsupported
        .iter()
        .any(|u| u.path == "dir\\xfe" && u.reason.contains("directory")));
    assert!(
        m.entries.is_empty(),
        "{:?}",
        m.entries.keys().collect::<Vec<_>>()
    );
}

#[test]
fn control_character_names_are_kept_as_data() {
    let d = tempfile::tempdir().unwrap();
    let names = [
        "new\nline",
        "tab\there",
        "esc\x1b[31mred",
        "cr\r",
        " lead space",
        "ünï",
    ];
    for n in names {
        fs::write(d.path().join(n), n.as_bytes()).unwrap();
    }
    let m = scan_ok(d.path(), &ScanOptions::new());
    for n in names {
        assert_eq!(
            m.entries[n].sha256.as_deref(),
            Some(sha(n.as_bytes()).as_str()),
            "{n:?}"
        );
    }
    assert!(m.unsupported.is_empty());
    let back: Manifest = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
    assert!(back.entries.contains_key("new\nline"));
}

/// Builds the unreadable tree and checks the scan reports it (as an unprivileged user).
fn check_unreadable(root: &Path) {
    let m = scan_ok(root, &ScanOptions::new());
    assert!(
        kinds(&m, "locked").contains(&"unreadable"),
        "{:?}",
        m.unsupported
    );
    assert_eq!(m.entries["locked"].kind, EntryKind::Directory);
    assert!(!m.entries.contains_key("locked/inner"));
    assert_eq!(kinds(&m, "secret"), vec!["unreadable"]);
    assert_eq!(m.entries["secret"].sha256, None);
    assert!(m.entries["open"].sha256.is_some());
}

#[test]
fn unreadable_directory_and_file_are_reported() {
    const CHILD: &str = "AGENTDIFF_SCANNER_UNREADABLE_ROOT";
    if let Some(root) = std::env::var_os(CHILD) {
        check_unreadable(Path::new(&root));
        return;
    }
    let d = tempfile::tempdir().unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir(d.path().join("locked")).unwrap();
    fs::write(d.path().join("locked/inner"), b"x").unwrap();
    fs::write(d.path().join("secret"), b"x").unwrap();
    fs::write(d.path().join("open"), b"x").unwrap();
    fs::set_permissions(d.path().join("locked"), fs::Permissions::from_mode(0o000)).unwrap();
    fs::set_permissions(d.path().join("secret"), fs::Permissions::from_mode(0o000)).unwrap();
    if !nix::unistd::geteuid().is_root() {
        check_unreadable(d.path());
        return;
    }
    // Root bypasses permission bits: rerun this test in a child process as `nobody`.
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args([
            "--exact",
            "suite::scanner::unreadable_directory_and_file_are_reported",
            "--nocapture",
        ])
        .env(CHILD, d.path())
        .uid(65534)
        .gid(65534)
        .output();
    match out {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("1 passed") => {}
        Ok(o) if !o.status.success() && o.status.code() == Some(101) => panic!(
            "unprivileged rerun failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(o) => super::skip(&format!(
            "unreadable_directory_and_file_are_reported: running as root and the rerun as \
             uid 65534 could not run the test ({:?}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => super::skip(&format!(
            "unreadable_directory_and_file_are_reported: running as root (permissions are \
             bypassed) and the test binary cannot be rerun as uid 65534: {e}"
        )),
    }
}

#[test]
fn agentdiffignore_git_semantics_with_negation() {
    let d = tempfile::tempdir().unwrap();
    fs::write(
        d.path().join(".agentdiffignore"),
        "# logs\n*.log\n!keep.log\ntmp/\n/rootonly\n",
    )
    .unwrap();
    for p in [
        "a.log",
        "keep.log",
        "sub/b.log",
        "sub/keep.log",
        "tmp/x",
        "sub/tmp/y",
        "rootonly",
        "sub/rootonly",
        "tmpfile",
    ] {
        let p = d.path().join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"x").unwrap();
    }
    let m = scan_ok(d.path(), &ScanOptions::new());
    let files: Vec<&str> = m
        .entries
        .iter()
        .filter(|(_, e)| e.kind == EntryKind::File)
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(
        files,
        vec![
            ".agentdiffignore",
            "keep.log",
            "sub/keep.log",
            "sub/rootonly",
            "tmpfile"
        ]
    );
    let excluded: Vec<(&str, &str)> = m
        .excluded
        .iter()
        .map(|e| (e.path.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        excluded,
        vec![
            ("a.log", "agentdiffignore"),
            ("rootonly", "agentdiffignore"),
            ("sub/b.log", "agentdiffignore"),
            ("sub/tmp", "agentdiffignore"),
            ("tmp", "agentdiffignore"),
        ]
    );
    assert_eq!(m.ignore_lines.len(), 5);
}

#[test]
fn after_scan_can_pin_the_before_ignore_rules() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join(".agentdiffignore"), "*.log\n").unwrap();
    fs::write(d.path().join("src.rs"), b"x").unwrap();
    let before = scan_ok(d.path(), &ScanOptions::new());
    // The command widens the rules to hide its write.
    fs::write(d.path().join(".agentdiffignore"), "*\n").unwrap();
    fs::write(d.path().join("src.rs"), b"changed").unwrap();
    let mut opts = ScanOptions::new();
    opts.ignore = IgnoreSource::Lines(before.ignore_lines.clone());
    let after = scan_ok(d.path(), &opts);
    let changes = diff(&before, &after);
    let paths: Vec<&str> = changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(paths, vec![".agentdiffignore", "src.rs"]);
}

#[test]
fn symlinked_or_invalid_ignore_file_fails_the_scan() {
    let d = tempfile::tempdir().unwrap();
    symlink("/etc/hostname", d.path().join(".agentdiffignore")).unwrap();
    assert!(matches!(
        scan(d.path(), &ScanOptions::new()),
        Err(ScanError::IgnoreFile(_))
    ));
    fs::remove_file(d.path().join(".agentdiffignore")).unwrap();
    fs::write(d.path().join(".agentdiffignore"), b"\xff\xfe").unwrap();
    let err = scan(d.path(), &ScanOptions::new()).unwrap_err();
    assert!(err.to_string().contains("UTF-8"), "{err}");
}

#[test]
fn root_must_be_a_directory() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("f"), b"x").unwrap();
    assert!(matches!(
        scan(&d.path().join("f"), &ScanOptions::new()),
        Err(ScanError::RootNotDirectory(_))
    ));
    assert!(matches!(
        scan(&d.path().join("missing"), &ScanOptions::new()),
        Err(ScanError::Root { .. })
    ));
}

fn tree_with_generated_dirs() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for p in [
        ".git/config",
        "node_modules/evil/index.js",
        "node_modules/other/x.js",
        "target/debug/bin",
        "src/build",
        "sub/node_modules/y.js",
        "src/lib.rs",
    ] {
        let p = d.path().join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"x").unwrap();
    }
    d
}

#[test]
fn default_exclusions_are_listed_once_per_directory() {
    let d = tree_with_generated_dirs();
    let m = scan_ok(d.path(), &ScanOptions::new());
    let excluded: Vec<(&str, &str)> = m
        .excluded
        .iter()
        .map(|e| (e.path.as_str(), e.reason.as_str()))
        .collect();
    assert_eq!(
        excluded,
        vec![
            (".git", "default_generated"),
            ("node_modules", "default_generated"),
            ("sub/node_modules", "default_generated"),
            ("target", "default_generated"),
        ]
    );
    // A regular file named like a generated directory is ordinary content.
    assert!(m.entries.contains_key("src/build"));
    assert!(m
        .entries
        .keys()
        .all(|p| !p.starts_with(".git") && !p.contains("node_modules")));
}

#[test]
fn deny_globs_reinclude_the_directories_they_name() {
    let d = tree_with_generated_dirs();
    let mut opts = ScanOptions::new();
    opts.reinclude = vec![".git/**".into(), "**/*.key".into()];
    let m = scan_ok(d.path(), &opts);
    assert!(m.entries.contains_key(".git/config"));
    assert!(
        !m.entries.contains_key("node_modules/evil/index.js"),
        "a leading wildcard re-includes nothing"
    );
    assert!(m.excluded.iter().any(|e| e.path == "node_modules"));

    opts.reinclude = vec!["node_modules/evil/**".into()];
    let m = scan_ok(d.path(), &opts);
    assert!(m.entries.contains_key("node_modules/evil/index.js"));
    assert!(m.excluded.iter().any(|e| e.path == "sub/node_modules"));
    assert!(m.excluded.iter().any(|e| e.path == ".git"));
}

#[test]
fn agentdiff_store_is_never_scanned() {
    let d = tempfile::tempdir().unwrap();
    fs::create_dir_all(d.path().join(".agentdiff/objects")).unwrap();
    fs::write(d.path().join(".agentdiff/objects/x"), b"x").unwrap();
    fs::write(d.path().join("f"), b"x").unwrap();
    let mut opts = ScanOptions::new();
    opts.reinclude = vec![".agentdiff/**".into(), ".agentdiff/objects/x".into()];
    let m = scan_ok(d.path(), &opts);
    assert!(
        m.entries.keys().all(|p| !p.starts_with(".agentdiff")),
        "{:?}",
        m.entries.keys().collect::<Vec<_>>()
    );
    assert_eq!(m.excluded.len(), 1);
    assert_eq!(
        (m.excluded[0].path.as_str(), m.excluded[0].reason.as_str()),
        (".agentdiff", "agentdiff_store")
    );
}

#[test]
fn hash_reuse_requires_all_seven_fields_unchanged() {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("same"), b"unchanged").unwrap();
    fs::write(d.path().join("touched"), b"content").unwrap();
    fs::write(d.path().join("rewritten"), b"aaaa").unwrap();
    let mut before = scan_ok(d.path(), &ScanOptions::new());
    // As if the scan had started well after the files were written (no entry is racy).
    before.stats.started_ns = before.stats.started_ns.map(|t| t + 2 * RACY_MARGIN_NS);
    let mut opts = ScanOptions::new();
    opts.reuse = Some(&before);

    // Nothing changed: every hash is reused, nothing is read.
    let again = scan_ok(d.path(), &opts);
    assert_eq!(
        (again.stats.hashes_reused, again.stats.bytes_hashed),
        (3, 0)
    );
    assert_eq!(again.entries, before.entries);

    // Set the same mtime back (size and mtime unchanged): ctime moves, so it must be rehashed.
    std::thread::sleep(Duration::from_millis(20));
    let t = &before.entries["touched"];
    let mtime = TimeSpec::new(t.mtime_ns / 1_000_000_000, t.mtime_ns % 1_000_000_000);
    utimensat(
        None,
        &d.path().join("touched"),
        &mtime,
        &mtime,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    // Same size, content changed, mtime restored: only ctime can tell.
    let r = &before.entries["rewritten"];
    fs::write(d.path().join("rewritten"), b"bbbb").unwrap();
    let rm = TimeSpec::new(r.mtime_ns / 1_000_000_000, r.mtime_ns % 1_000_000_000);
    utimensat(
        None,
        &d.path().join("rewritten"),
        &rm,
        &rm,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();

    let after = scan_ok(d.path(), &opts);
    assert_eq!(after.entries["touched"].mtime_ns, t.mtime_ns);
    assert_ne!(after.entries["touched"].ctime_ns, t.ctime_ns);
    assert_eq!(after.stats.hashes_reused, 1, "only `same` may be reused");
    assert_eq!(after.stats.bytes_hashed, 7 + 4);
    assert_eq!(
        after.entries["rewritten"].sha256.as_deref(),
        Some(sha(b"bbbb").as_str())
    );
    let changes = diff(&before, &after);
    assert_eq!(
        changes.iter().map(|c| c.path.as_str()).collect::<Vec<_>>(),
        vec!["rewritten"]
    );

    // A manifest of another root is never used for reuse.
    let other = tempfile::tempdir().unwrap();
    fs::write(other.path().join("same"), b"unchanged").unwrap();
    let o = scan_ok(other.path(), &opts);
    assert_eq!(o.stats.hashes_reused, 0);
}

#[test]
fn racy_entries_are_read_again_even_with_identical_stat() {
    use nix::sys::stat::{utimensat, UtimensatFlags};
    use nix::sys::time::TimeSpec;
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("racy"), b"aaaa").unwrap();
    let before = scan_ok(d.path(), &ScanOptions::new());
    assert!(before.stats.started_ns.is_some());
    let mut opts = ScanOptions::new();
    opts.reuse = Some(&before);
    // Written within the margin of the scan's start: never reused, even unchanged.
    let again = scan_ok(d.path(), &opts);
    assert_eq!(again.stats.hashes_reused, 0);
    // A same-size rewrite in the same timestamp tick with mtime put back may leave every stat
    // field equal; the racy rule still reads it.
    let r = &before.entries["racy"];
    fs::write(d.path().join("racy"), b"bbbb").unwrap();
    let t = TimeSpec::new(r.mtime_ns / 1_000_000_000, r.mtime_ns % 1_000_000_000);
    utimensat(
        None,
        &d.path().join("racy"),
        &t,
        &t,
        UtimensatFlags::NoFollowSymlink,
    )
    .unwrap();
    let after = scan_ok(d.path(), &opts);
    assert_eq!(
        after.entries["racy"].sha256.as_deref(),
        Some(sha(b"bbbb").as_str())
    );
    // A manifest that records no scan start (an older version) offers no reuse at all.
    let mut later = after.clone();
    later.stats.started_ns = later.stats.started_ns.map(|t| t + 2 * RACY_MARGIN_NS);
    opts.reuse = Some(&later);
    assert_eq!(scan_ok(d.path(), &opts).stats.hashes_reused, 1, "control");
    let mut old = later.clone();
    old.stats.started_ns = None;
    opts.reuse = Some(&old);
    assert_eq!(scan_ok(d.path(), &opts).stats.hashes_reused, 0);
}

#[test]
fn diff_of_real_scans_classifies_changes() {
    let d = tempfile::tempdir().unwrap();
    for p in ["keep", "edit", "remove", "chmod", "dir/inner"] {
        let p = d.path().join(p);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, b"x").unwrap();
    }
    fs::create_dir(d.path().join("olddir")).unwrap();
    let before = scan_ok(d.path(), &ScanOptions::new());
    fs::write(d.path().join("edit"), b"y").unwrap();
    fs::remove_file(d.path().join("remove")).unwrap();
    fs::set_permissions(d.path().join("chmod"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(d.path().join("dir/new"), b"n").unwrap(); // dir mtime churn only
    fs::remove_dir(d.path().join("olddir")).unwrap();
    fs::create_dir(d.path().join("newdir")).unwrap();
    symlink("keep", d.path().join("link")).unwrap();
    let after = scan_ok(d.path(), &ScanOptions::new());
    let changes = diff(&before, &after);
    let got: Vec<(&str, ChangeType, EntryKind, bool, bool)> = changes
        .iter()
        .map(|c| {
            (
                c.path.as_str(),
                c.change_type,
                c.entry_kind,
                c.content_changed,
                c.mode_changed,
            )
        })
        .collect();
    use ChangeType::*;
    use EntryKind::*;
    assert_eq!(
        got,
        vec![
            ("chmod", Modified, File, false, true),
            ("dir/new", Created, File, true, false),
            ("edit", Modified, File, true, false),
            ("link", Created, Symlink, true, false),
            ("newdir", Created, Directory, false, false),
            ("olddir", Deleted, Directory, false, false),
            ("remove", Deleted, File, true, false),
        ]
    );
    assert!(changes.iter().all(|c| c.unverified.is_none()));
}

#[test]
fn special_files_appearing_are_surfaced_by_diff_unsupported() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("f"), b"x").unwrap();
    let before = scan_ok(d.path(), &ScanOptions::new());
    nix::unistd::mkfifo(
        &d.path().join("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    // A file replaced by a FIFO: the entry is deleted and the FIFO is noted on it.
    fs::remove_file(d.path().join("f")).unwrap();
    nix::unistd::mkfifo(
        &d.path().join("f"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let after = scan_ok(d.path(), &ScanOptions::new());
    let changes = diff(&before, &after);
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].change_type, ChangeType::Deleted);
    assert!(changes[0].unverified.as_deref().unwrap().contains("fifo"));
    let u = diff_unsupported(&before, &after);
    assert_eq!(u.len(), 1);
    assert_eq!(
        (u[0].path.as_str(), u[0].change_type),
        ("pipe", ChangeType::Created)
    );
}

#[test]
fn racing_directory_swaps_never_pull_outside_content_in() {
    let outside = tempfile::tempdir().unwrap();
    fs::create_dir(outside.path().join("sub")).unwrap();
    fs::write(outside.path().join("outside_secret"), b"s").unwrap();
    fs::write(outside.path().join("sub/outside_secret"), b"s").unwrap();
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real");
    fs::create_dir_all(real.join("sub")).unwrap();
    for i in 0..20 {
        fs::write(real.join(format!("f{i}")), b"inside").unwrap();
        fs::write(real.join(format!("sub/g{i}")), b"inside").unwrap();
    }
    let target = d.path().join("d");
    fs::rename(&real, &target).unwrap();
    let stop = AtomicBool::new(false);
    let swaps = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            let parked = d.path().join("parked");
            let link = d.path().join("link");
            symlink(outside.path(), &link).unwrap();
            while !stop.load(Ordering::Relaxed) {
                // d: real directory -> symlink to outside -> real directory.
                if fs::rename(&target, &parked).is_ok() {
                    let _ = fs::rename(&link, &target);
                    let _ = fs::rename(&target, &link);
                    let _ = fs::rename(&parked, &target);
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        for _ in 0..300 {
            let m = scan(d.path(), &ScanOptions::new()).unwrap();
            for p in m
                .entries
                .keys()
                .chain(m.unsupported.iter().map(|u| &u.path))
            {
                assert!(!p.contains("outside_secret"), "walk escaped the root: {p}");
            }
            for (p, e) in &m.entries {
                if e.kind == EntryKind::File {
                    let ok =
                        e.sha256.as_deref() == Some(sha(b"inside").as_str()) || e.sha256.is_none();
                    assert!(ok, "{p} hashed content from outside");
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(swaps.load(Ordering::Relaxed) > 0, "the race never ran");
}

#[test]
fn progress_is_reported_and_threads_are_configurable() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..600 {
        fs::write(d.path().join(format!("f{i:03}")), format!("{i}")).unwrap();
    }
    let last = Mutex::new(ScanProgress::default());
    let calls = AtomicU64::new(0);
    let cb = |p: &ScanProgress| {
        calls.fetch_add(1, Ordering::Relaxed);
        *last.lock().unwrap() = *p;
    };
    let mut opts = ScanOptions::new();
    opts.progress = Some(&cb);
    opts.threads = 3;
    let m = scan_ok(d.path(), &opts);
    assert_eq!(m.entries.len(), 600);
    assert!(
        calls.load(Ordering::Relaxed) >= 3,
        "throttled calls plus the final one"
    );
    let p = *last.lock().unwrap();
    assert_eq!((p.files_seen, p.bytes_hashed), (600, m.stats.bytes_hashed));
    let mut one = ScanOptions::new();
    one.threads = 1;
    assert_eq!(scan_ok(d.path(), &one).entries, m.entries);
}

#[test]
fn open_descriptors_stay_bounded_on_wide_and_deep_trees() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..3000 {
        let sub = d.path().join(format!("w{i:04}"));
        fs::create_dir(&sub).unwrap();
        fs::write(sub.join("f"), b"x").unwrap();
    }
    let mut deep = d.path().join("deep");
    for _ in 0..200 {
        deep = deep.join("n");
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("leaf"), b"leaf").unwrap();

    let max_fds = AtomicU64::new(0);
    let cb = |_: &ScanProgress| {
        let n = fs::read_dir("/proc/self/fd")
            .map(|r| r.count() as u64)
            .unwrap_or(0);
        max_fds.fetch_max(n, Ordering::Relaxed);
    };
    let mut opts = ScanOptions::new();
    opts.progress = Some(&cb);
    let m = scan_ok(d.path(), &opts);
    assert_eq!(m.stats.files, 3001);
    assert!(m
        .entries
        .keys()
        .any(|p| p.ends_with("/n/leaf") && p.matches('/').count() == 201));
    let max = max_fds.load(Ordering::Relaxed);
    assert!(max > 0, "/proc/self/fd was never sampled");
    // Holding every directory of the tree open would need more than 3000 descriptors; the walk
    // needs about depth + queue + workers (plus whatever parallel tests hold).
    assert!(max < 1500, "{max} descriptors open during the scan");
}

/// Whatever form the ignore rule takes, a path a deny glob names is recorded; a path no glob
/// names stays ignored. Run for each variation of `.agentdiffignore`.
#[test]
fn no_form_of_ignore_rule_hides_a_deny_path() {
    let deny = ["**/*.pem", "config/secrets/**", ".env"];
    let named = [
        "a/b/c/x.pem",
        "vendor/deep/k.pem",
        "config/secrets/db/pw",
        ".env",
        "x.pem",
    ];
    let unnamed = [
        "a/b/c/x.txt",
        "vendor/deep/k.txt",
        "config/other/pw",
        "y.txt",
    ];
    let variations: &[&str] = &[
        "*\n",
        "**\n",
        "**/*\n",
        "/*\n",
        "a/\nvendor/\nconfig/\n*.txt\n",
        "/a\n/vendor\n/config\n*.txt\n",
        "a/**\nvendor/**\nconfig/**\n*.txt\n",
        "**/b/\n**/deep\nconfig/*\n*.txt\n",
        "*\n!y.txt\n!a/\n*.pem\n",
        "*\n!*.txt\n*.pem\n.env\n",
        "*.pem\n.env\nconfig/secrets/\nsecrets\n*.txt\n**/deep/\n/a/b/\nconfig/other/\n",
    ];
    for ignore in variations {
        let d = tempfile::tempdir().unwrap();
        for p in named.iter().chain(&unnamed) {
            let p = d.path().join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, b"x").unwrap();
        }
        fs::write(d.path().join(".agentdiffignore"), ignore).unwrap();
        // A nested ignore file is content, not rules: it cannot hide anything either.
        fs::write(d.path().join("a/.agentdiffignore"), "*\n").unwrap();
        let mut opts = ScanOptions::new();
        opts.reinclude = deny.iter().map(|s| s.to_string()).collect();
        let m = scan_ok(d.path(), &opts);
        for p in named {
            assert!(
                m.entries.contains_key(p),
                "{p} hidden by {ignore:?}: {:?}",
                m.entries.keys().collect::<Vec<_>>()
            );
        }
        for p in ["a/b/c/x.txt", "vendor/deep/k.txt", "config/other/pw"] {
            let absent = !m.entries.contains_key(p);
            let reported = m
                .excluded
                .iter()
                .any(|e| p == e.path || p.starts_with(&format!("{}/", e.path)));
            assert!(
                absent || !reported,
                "{p} recorded although excluded by {ignore:?}"
            );
            assert!(
                m.entries.contains_key(p) || reported,
                "{p} neither recorded nor reported excluded under {ignore:?}"
            );
        }
    }
}

/// Directories with git's layout are listed in the manifest whatever their name, and the
/// ignore file hides nothing inside one.
#[test]
fn git_layouts_are_found_by_the_walk_and_no_ignore_rule_hides_their_content() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    for rel in ["docs/tools", "src/.git", "ignored/repo"] {
        fs::create_dir_all(root.join(rel).join("refs")).unwrap();
        fs::create_dir_all(root.join(rel).join("objects")).unwrap();
        fs::write(root.join(rel).join("HEAD"), "ref: refs/heads/main\n").unwrap();
        fs::write(root.join(rel).join("config"), "[core]\n").unwrap();
    }
    // A worktree's git directory: `commondir` instead of `objects`.
    fs::create_dir_all(root.join("wt/refs")).unwrap();
    fs::write(root.join("wt/HEAD"), "x\n").unwrap();
    fs::write(root.join("wt/commondir"), "../docs/tools\n").unwrap();
    // Not a layout: `refs` is a file.
    fs::create_dir_all(root.join("nope/objects")).unwrap();
    fs::write(root.join("nope/HEAD"), "x\n").unwrap();
    fs::write(root.join("nope/refs"), "x\n").unwrap();
    fs::write(root.join(".agentdiffignore"), "ignored/\nconfig\n").unwrap();
    // As every policy's scan does: an ignored directory is searched for `.git` below it.
    let mut opts = ScanOptions::new();
    opts.reinclude = vec!["**/.git/**".into()];
    let m = scan_ok(root, &opts);
    assert_eq!(
        m.git_layouts,
        vec!["docs/tools", "ignored/repo", "src/.git", "wt"]
    );
    for p in [
        "docs/tools/config",
        "ignored/repo/config",
        "src/.git/config",
    ] {
        assert!(
            m.entries.contains_key(p),
            "{p} hidden: {:?}",
            m.entries.keys()
        );
    }
}

/// Git follows symlinks in its layout (a symlinked `HEAD` is a symbolic ref): a directory made
/// of links is a git layout too.
#[test]
fn a_git_layout_made_of_symlinks_is_found() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    fs::create_dir_all(root.join("store/objects")).unwrap();
    fs::create_dir_all(root.join("docs/links/refs")).unwrap();
    symlink("refs/heads/main", root.join("docs/links/HEAD")).unwrap();
    symlink("../../store/objects", root.join("docs/links/objects")).unwrap();
    let m = scan_ok(root, &ScanOptions::new());
    assert_eq!(m.git_layouts, vec!["docs/links"]);
}

/// A root with git's layout (a project made a bare repository) is listed as `""`; the ignore
/// file still applies to its other entries.
#[test]
fn a_root_with_git_layout_is_listed_and_keeps_its_ignore_rules() {
    let t = tempfile::tempdir().unwrap();
    let root = t.path();
    fs::create_dir_all(root.join("refs")).unwrap();
    fs::create_dir_all(root.join("objects")).unwrap();
    fs::write(root.join("HEAD"), "ref: refs/heads/main\n").unwrap();
    fs::write(root.join("notes.log"), "x\n").unwrap();
    fs::write(root.join("config"), "[core]\n").unwrap();
    fs::create_dir_all(root.join("hooks")).unwrap();
    fs::write(root.join("hooks/post-checkout"), "x\n").unwrap();
    fs::write(root.join(".agentdiffignore"), "*.log\nconfig\nhooks/\n").unwrap();
    let m = scan_ok(root, &ScanOptions::new());
    assert_eq!(m.git_layouts, vec![""]);
    assert!(!m.entries.contains_key("notes.log"));
    // Git's own names at such a root are git metadata: no ignore rule hides them.
    for p in ["HEAD", "config", "hooks/post-checkout"] {
        assert!(m.entries.contains_key(p), "{p}: {:?}", m.entries.keys());
    }
}
