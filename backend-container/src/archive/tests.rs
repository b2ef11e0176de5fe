use super::*;

const OWNER: UserSpec = UserSpec {
    uid: 65532,
    gid: 65532,
};

/// One entry with a raw name (no checks: hostile archives are the point).
fn raw(b: &mut tar::Builder<Vec<u8>>, name: &[u8], kind: tar::EntryType, data: &[u8], link: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name);
    h.as_gnu_mut().unwrap().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    h.set_cksum();
    b.append(&h, data).unwrap();
}

/// (name, kind, data, link target)
type RawEntry<'a> = (&'a [u8], tar::EntryType, &'a [u8], &'a [u8]);

fn archive(entries: &[RawEntry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, kind, data, link) in entries {
        raw(&mut b, name, *kind, data, link);
    }
    b.into_inner().unwrap()
}

/// A sandbox: `dest` to unpack into, next to a `bait` directory that must stay untouched.
struct Sandbox {
    _dir: tempfile::TempDir,
    dest: PathBuf,
    bait: PathBuf,
}

fn sandbox() -> Sandbox {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("ws").join("dest");
    std::fs::create_dir_all(&dest).unwrap();
    let bait = dir.path().join("bait");
    std::fs::create_dir(&bait).unwrap();
    std::fs::write(bait.join("f"), "bait").unwrap();
    Sandbox {
        _dir: dir,
        dest,
        bait,
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The archive is refused, and nothing changed outside `dest`.
fn refused(bytes: &[u8], limits: &Limits) -> ArchiveError {
    let s = sandbox();
    let before = listing(s.dest.parent().unwrap().parent().unwrap());
    let err = unpack(bytes, &s.dest, limits).unwrap_err();
    let after: Vec<String> = listing(s.dest.parent().unwrap().parent().unwrap())
        .into_iter()
        .filter(|p| !p.starts_with("ws/dest/"))
        .collect();
    assert_eq!(after, before, "something was written outside dest");
    assert_eq!(std::fs::read_to_string(s.bait.join("f")).unwrap(), "bait");
    err
}

use tar::EntryType as T;

#[test]
fn round_trip_keeps_content_modes_and_links() {
    let src = tempfile::tempdir().unwrap();
    let s = src.path();
    std::fs::create_dir_all(s.join("sub/empty")).unwrap();
    std::fs::write(s.join("a.txt"), "alpha").unwrap();
    std::fs::write(s.join("sub/run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(s.join("sub/run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", s.join("out-link")).unwrap();
    std::os::unix::fs::symlink("a.txt", s.join("in-link")).unwrap();
    let mut bytes = Vec::new();
    let packed = pack(s, OWNER, &mut bytes).unwrap();
    assert_eq!(packed.entries, 7);
    assert_eq!(packed.file_bytes, 15);
    assert_eq!(packed.stream_bytes, bytes.len() as u64);
    for e in tar::Archive::new(&bytes[..]).entries().unwrap() {
        let e = e.unwrap();
        assert_eq!(e.header().uid().unwrap(), 65532);
        assert_eq!(e.header().gid().unwrap(), 65532);
    }

    let sb = sandbox();
    let got = unpack(&bytes[..], &sb.dest, &Limits::default()).unwrap();
    assert_eq!(got.entries, 7);
    assert_eq!(got.file_bytes, 15);
    let d = &sb.dest;
    assert_eq!(std::fs::read_to_string(d.join("a.txt")).unwrap(), "alpha");
    let mode = std::fs::metadata(d.join("sub/run.sh")).unwrap().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert!(d.join("sub/empty").is_dir());
    assert_eq!(
        std::fs::read_link(d.join("out-link")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        std::fs::read_link(d.join("in-link")).unwrap(),
        Path::new("a.txt")
    );
}

#[test]
fn pack_never_follows_a_symlinked_directory() {
    let src = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(outside.path(), src.path().join("d")).unwrap();
    let mut bytes = Vec::new();
    pack(src.path(), OWNER, &mut bytes).unwrap();
    let names: Vec<String> = tar::Archive::new(&bytes[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    assert_eq!(names, [".", "d"]);
}

#[test]
fn pack_refuses_a_fifo_instead_of_leaving_it_out() {
    let src = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&src.path().join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let err = pack(src.path(), OWNER, Vec::new()).unwrap_err();
    assert!(matches!(err, ArchiveError::Unshippable(p) if p == "pipe"));
}

#[test]
fn traversal_is_refused() {
    for name in [&b"../escape"[..], b"a/../../escape", b"./../escape", b".."] {
        let bytes = archive(&[(name, T::Regular, b"x", b"")]);
        assert!(
            matches!(
                refused(&bytes, &Limits::default()),
                ArchiveError::Traversal(_)
            ),
            "{name:?}"
        );
    }
}

#[test]
fn absolute_names_are_refused() {
    let bytes = archive(&[(b"/tmp/escape", T::Regular, b"x", b"")]);
    assert!(matches!(
        refused(&bytes, &Limits::default()),
        ArchiveError::Absolute(_)
    ));
}

#[test]
fn nothing_is_written_through_a_symlink() {
    let s = sandbox();
    let bait = s.bait.display().to_string();
    let bytes = archive(&[
        (b"l", T::Symlink, b"", bait.as_bytes()),
        (b"l/f", T::Regular, b"owned", b""),
    ]);
    let err = unpack(&bytes[..], &s.dest, &Limits::default()).unwrap_err();
    assert!(
        matches!(err, ArchiveError::NotUnderDirectory { .. }),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(s.bait.join("f")).unwrap(), "bait");
    // Through a relative link to a parent as well.
    let bytes = archive(&[
        (b"up", T::Symlink, b"", b".."),
        (b"up/x", T::Regular, b"x", b""),
    ]);
    assert!(matches!(
        refused(&bytes, &Limits::default()),
        ArchiveError::NotUnderDirectory { .. }
    ));
}

#[test]
fn a_path_given_twice_is_refused() {
    // A file replaced by a link to outside, then written through: refused at the second entry.
    let bytes = archive(&[
        (b"f", T::Regular, b"x", b""),
        (b"f", T::Symlink, b"", b"/etc/passwd"),
    ]);
    assert!(matches!(
        refused(&bytes, &Limits::default()),
        ArchiveError::Duplicate(_)
    ));
}

#[test]
fn hard_links_only_to_files_of_the_archive() {
    for target in [&b"/etc/passwd"[..], b"../bait/f", b"missing", b"l", b""] {
        let bytes = archive(&[
            (b"l", T::Symlink, b"", b"/etc/passwd"),
            (b"h", T::Link, b"", target),
        ]);
        let err = refused(&bytes, &Limits::default());
        assert!(
            matches!(
                err,
                ArchiveError::HardLinkOutside { .. }
                    | ArchiveError::Traversal(_)
                    | ArchiveError::Absolute(_)
            ),
            "{target:?}: {err}"
        );
    }
    let s = sandbox();
    let bytes = archive(&[(b"f", T::Regular, b"data", b""), (b"h", T::Link, b"", b"f")]);
    unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    assert_eq!(std::fs::read_to_string(s.dest.join("h")).unwrap(), "data");
}

#[test]
fn a_huge_entry_count_is_refused() {
    let names: Vec<Vec<u8>> = (0..50).map(|i| format!("f{i}").into_bytes()).collect();
    let entries: Vec<RawEntry<'_>> = names
        .iter()
        .map(|n| (&n[..], T::Regular, &b""[..], &b""[..]))
        .collect();
    let bytes = archive(&entries);
    let limits = Limits {
        max_entries: 20,
        ..Limits::default()
    };
    assert!(matches!(
        refused(&bytes, &limits),
        ArchiveError::TooManyEntries(20)
    ));
}

#[test]
fn a_huge_size_is_refused_before_it_is_written() {
    let limits = Limits {
        max_file_bytes: 100,
        ..Limits::default()
    };
    let bytes = archive(&[(b"big", T::Regular, &[7u8; 101], b"")]);
    assert!(matches!(
        refused(&bytes, &limits),
        ArchiveError::TooLarge(100)
    ));
    // A header claiming terabytes with no data behind it.
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..3].copy_from_slice(b"big");
    h.set_entry_type(T::Regular);
    h.set_mode(0o644);
    h.set_size(1 << 40);
    h.set_cksum();
    let bytes = h.as_bytes().to_vec();
    let err = refused(&bytes, &Limits::default());
    assert!(matches!(err, ArchiveError::TooLarge(_)), "{err}");
}

#[test]
fn an_endless_stream_is_cut_off() {
    let limits = Limits {
        max_entries: 2,
        max_file_bytes: 10,
        max_path_bytes: 64,
    };
    // A long-name record far larger than any limit allows.
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.as_gnu_mut().unwrap().name[..13].copy_from_slice(b"././@LongLink");
    h.set_entry_type(T::GNULongName);
    h.set_size(2 << 20);
    h.set_cksum();
    b.append(&h, &vec![b'a'; 2 << 20][..]).unwrap();
    raw(&mut b, b"x", T::Regular, b"", b"");
    let bytes = b.into_inner().unwrap();
    assert!(matches!(refused(&bytes, &limits), ArchiveError::Read(_)));
}

#[test]
fn devices_and_fifos_are_refused() {
    for kind in [T::Char, T::Block, T::Fifo] {
        let bytes = archive(&[(b"dev", kind, b"", b"")]);
        assert!(
            matches!(
                refused(&bytes, &Limits::default()),
                ArchiveError::Special { .. }
            ),
            "{kind:?}"
        );
    }
}

#[test]
fn a_symlink_comes_back_as_a_symlink() {
    let s = sandbox();
    let bytes = archive(&[
        (b"d", T::Directory, b"", b""),
        (b"d/l", T::Symlink, b"", b"../../../bait/f"),
    ]);
    unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    let meta = std::fs::symlink_metadata(s.dest.join("d/l")).unwrap();
    assert!(meta.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(s.dest.join("d/l")).unwrap(),
        Path::new("../../../bait/f")
    );
    assert_eq!(std::fs::read_to_string(s.bait.join("f")).unwrap(), "bait");
}

#[test]
fn setuid_and_setgid_bits_are_dropped_and_reported() {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("suid").unwrap();
    h.set_entry_type(T::Regular);
    h.set_mode(0o6755);
    h.set_size(1);
    h.set_cksum();
    b.append(&h, &b"x"[..]).unwrap();
    let bytes = b.into_inner().unwrap();
    let s = sandbox();
    let got = unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    assert_eq!(got.dropped_special_bits, ["suid"]);
    let mode = std::fs::metadata(s.dest.join("suid")).unwrap().mode();
    assert_eq!(mode & 0o7777, 0o755);
}

#[test]
fn a_read_only_directory_is_filled_before_it_is_closed() {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_path("ro").unwrap();
    h.set_entry_type(T::Directory);
    h.set_mode(0o555);
    h.set_size(0);
    h.set_cksum();
    b.append(&h, io::empty()).unwrap();
    raw(&mut b, b"ro/f", T::Regular, b"x", b"");
    let bytes = b.into_inner().unwrap();
    let s = sandbox();
    unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    let mode = std::fs::metadata(s.dest.join("ro")).unwrap().mode();
    assert_eq!(mode & 0o777, 0o555);
    assert!(s.dest.join("ro/f").is_file());
}

#[test]
fn a_directory_listed_after_its_content_is_accepted_once() {
    let mut b = tar::Builder::new(Vec::new());
    raw(&mut b, b"late/f", T::Regular, b"x", b"");
    let mut h = tar::Header::new_gnu();
    h.set_path("late").unwrap();
    h.set_entry_type(T::Directory);
    h.set_mode(0o750);
    h.set_size(0);
    h.set_cksum();
    b.append(&h, io::empty()).unwrap();
    let bytes = b.into_inner().unwrap();
    let s = sandbox();
    unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    let mode = std::fs::metadata(s.dest.join("late")).unwrap().mode();
    assert_eq!(mode & 0o777, 0o750);
    // Listed twice is still a duplicate.
    let mut twice = bytes[..bytes.len() - 1024].to_vec();
    twice.extend_from_slice(h.as_bytes());
    twice.extend_from_slice(&[0u8; 1024]);
    assert!(matches!(
        refused(&twice, &Limits::default()),
        ArchiveError::Duplicate(_)
    ));
}

/// One PAX record (`LEN key=value\n`, LEN counting itself).
fn pax_record(key: &str, value: &str) -> Vec<u8> {
    let body = format!(" {key}={value}\n");
    let mut len = body.len() + 1;
    while format!("{len}{body}").len() != len {
        len += 1;
    }
    format!("{len}{body}").into_bytes()
}

/// A PAX extended header for the next entry.
fn pax(b: &mut tar::Builder<Vec<u8>>, records: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_path("PaxHeader/x").unwrap();
    h.set_entry_type(T::XHeader);
    h.set_size(records.len() as u64);
    h.set_cksum();
    b.append(&h, records).unwrap();
}

#[test]
fn a_pax_size_is_the_size_that_is_counted_and_limited() {
    let build = |content: &[u8]| {
        let mut b = tar::Builder::new(Vec::new());
        raw(&mut b, b"small", T::Regular, b"abc", b"");
        pax(&mut b, &pax_record("size", &content.len().to_string()));
        // The ustar header says 0 bytes; the PAX record says how many follow.
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..7].copy_from_slice(b"big.bin");
        h.set_entry_type(T::Regular);
        h.set_mode(0o644);
        h.set_size(0);
        h.set_cksum();
        b.append(&h, content).unwrap();
        b.into_inner().unwrap()
    };
    let bytes = build(&[9u8; 4096]);
    let s = sandbox();
    let shipped = unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    assert_eq!(
        std::fs::metadata(s.dest.join("big.bin")).unwrap().len(),
        4096
    );
    assert_eq!(shipped.file_bytes, 4096 + 3);
    let limits = Limits {
        max_file_bytes: 1000,
        ..Limits::default()
    };
    assert!(matches!(
        refused(&bytes, &limits),
        ArchiveError::TooLarge(1000)
    ));
}

#[test]
fn a_time_past_any_clock_is_clamped_not_a_panic() {
    let mut bytes = archive(&[
        (b"f", T::Regular, b"x", b""),
        (b"d", T::Directory, b"", b""),
    ]);
    // GNU base-256: the high bit of the first byte, then the largest value the field holds.
    for block in [0, 1024] {
        let field = &mut bytes[block + 136..block + 148];
        field[0] = 0x80;
        field[1..].fill(0xff);
        let mut h = tar::Header::new_old();
        h.as_mut_bytes().copy_from_slice(&bytes[block..block + 512]);
        h.set_cksum();
        bytes[block..block + 512].copy_from_slice(h.as_bytes());
    }
    let s = sandbox();
    unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
    let modified = std::fs::metadata(s.dest.join("f"))
        .unwrap()
        .modified()
        .unwrap();
    // The filesystem may clamp further (ext4 stops in 2446); it is a time in the future.
    assert!(modified > SystemTime::now(), "{modified:?}");
    assert!(modified <= UNIX_EPOCH + Duration::from_secs(MAX_MTIME_SECS));
}

#[test]
fn a_stream_cut_short_is_refused() {
    let bytes = archive(&[
        (b"a", T::Regular, b"aaa", b""),
        (b"b", T::Regular, b"b", b""),
    ]);
    // Cleanly after the first entry (header + one data block): it looks like a shorter archive.
    assert!(matches!(
        refused(&bytes[..1024], &Limits::default()),
        ArchiveError::Truncated
    ));
    // Inside the second entry's data.
    let err = refused(&bytes[..1024 + 512 + 1], &Limits::default());
    assert!(
        matches!(err, ArchiveError::ShortEntry { .. } | ArchiveError::Read(_)),
        "{err}"
    );
    // Every entry present but no end-of-archive marker.
    let complete = bytes.len() - 1024;
    assert!(matches!(
        refused(&bytes[..complete], &Limits::default()),
        ArchiveError::Truncated
    ));
    let s = sandbox();
    unpack(&bytes[..], &s.dest, &Limits::default()).unwrap();
}

#[test]
fn global_headers_count_toward_the_entry_limit() {
    let mut b = tar::Builder::new(Vec::new());
    for _ in 0..10 {
        let records = pax_record("comment", "x");
        let mut h = tar::Header::new_ustar();
        h.set_path("pax_global_header").unwrap();
        h.set_entry_type(T::XGlobalHeader);
        h.set_size(records.len() as u64);
        h.set_cksum();
        b.append(&h, &records[..]).unwrap();
    }
    raw(&mut b, b"f", T::Regular, b"", b"");
    let bytes = b.into_inner().unwrap();
    let limits = Limits {
        max_entries: 5,
        ..Limits::default()
    };
    assert!(matches!(
        refused(&bytes, &limits),
        ArchiveError::TooManyEntries(5)
    ));
}

mod no_header_panics {
    use super::*;
    use proptest::prelude::*;

    const KINDS: &[u8] = b"0123456789gxKLSVMNA\0";

    /// A header with arbitrary bytes in its numeric and name fields but a valid checksum, so the
    /// parser gets past the checksum to the fields themselves.
    fn header(name: &[u8], kind: u8, fields: &[u8; 60], base256: u8, size: &[u8; 12]) -> [u8; 512] {
        let mut h = tar::Header::new_gnu();
        let bytes = h.as_mut_bytes();
        bytes[..name.len()].copy_from_slice(name);
        // mode, uid, gid (100..124), mtime (136..148): arbitrary, optionally base-256.
        bytes[100..124].copy_from_slice(&fields[..24]);
        bytes[136..148].copy_from_slice(&fields[24..36]);
        for (bit, start) in [(1u8, 100usize), (2, 108), (4, 116), (8, 136), (16, 124)] {
            if base256 & bit != 0 {
                bytes[start] |= 0x80;
            }
        }
        if base256 & 16 == 0 {
            bytes[124..136].copy_from_slice(size);
        }
        bytes[156] = kind;
        bytes[157..181].copy_from_slice(&fields[36..60]);
        h.set_cksum();
        *h.as_bytes()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn unpack_never_panics_on_a_header(
            name in proptest::collection::vec(any::<u8>(), 1..100),
            kind in proptest::sample::select(KINDS),
            fields in proptest::array::uniform32(any::<u8>()).prop_flat_map(|a| {
                proptest::array::uniform32(any::<u8>()).prop_map(move |b| {
                    let mut out = [0u8; 60];
                    out[..32].copy_from_slice(&a);
                    out[32..].copy_from_slice(&b[..28]);
                    out
                })
            }),
            base256 in any::<u8>(),
            size in proptest::array::uniform12(any::<u8>()),
            data in proptest::collection::vec(any::<u8>(), 0..1500),
            marker in any::<bool>(),
        ) {
            let mut bytes = header(&name, kind, &fields, base256, &size).to_vec();
            bytes.extend(&data);
            if marker {
                bytes.extend([0u8; 1024]);
            }
            let s = sandbox();
            let limits = Limits {
                max_entries: 100,
                max_file_bytes: 1 << 20,
                max_path_bytes: 4096,
            };
            // Accepted or refused, but answered.
            let _ = unpack(&bytes[..], &s.dest, &limits);
        }
    }
}
