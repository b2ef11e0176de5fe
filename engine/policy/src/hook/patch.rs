//! The files a patch text touches.
//!
//! Two formats are read: the `apply_patch` envelope (`*** Begin Patch` … `*** End Patch` with
//! `*** Add File:`, `*** Update File:` (optionally followed by `*** Move to:`) and
//! `*** Delete File:` sections) and unified diffs (`--- a/x` / `+++ b/x`, git's `rename from/to`
//! and `copy from/to`). Every file header found is reported whether or not the whole text is
//! well-formed, so a denied file is denied even in a broken patch; [`PatchFiles::well_formed`]
//! says whether the text was understood completely.
//!
//! A unified-diff name is reported in every reading a patch tool may give it ([`diff_names`]):
//! `git apply` reads a C-quoted name (`"b/\056env"`) with its escapes and an unquoted one to the
//! end of the line (less a trailing timestamp), GNU `patch` stops an unquoted name at the first
//! blank (`+++ b/.env x` writes `.env`); each is reported as written (`-p0`) and without its
//! first component (`-p1`). Context-diff (`*** name`), `Index:` and `diff --git` names count
//! too, since GNU patch and git may take the file name from them. The caller judges every
//! reading, so any reading that reaches a denied path denies. One pass over the lines: linear in
//! the text (each line's readings are at most its number of blanks plus a few).

/// The files a patch names and whether the text parsed as a whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PatchFiles {
    pub paths: Vec<String>,
    pub well_formed: bool,
}

const ENVELOPE_HEADERS: [&str; 4] = [
    "*** Add File: ",
    "*** Update File: ",
    "*** Delete File: ",
    "*** Move to: ",
];

/// Whether a text looks like a patch at all (for arguments of tools the hook does not model).
pub fn looks_like_patch(text: &str) -> bool {
    text.lines().any(|line| {
        line.starts_with("*** Begin Patch")
            || line.starts_with("+++ ")
            || ENVELOPE_HEADERS.iter().any(|h| line.starts_with(h))
    })
}

/// Read the files a patch names.
pub fn parse(text: &str) -> PatchFiles {
    let mut files = PatchFiles::default();
    let envelope = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .is_some_and(|l| l.trim() == "*** Begin Patch");
    files.well_formed = if envelope {
        parse_envelope(text, &mut files.paths)
    } else {
        parse_unified(text, &mut files.paths)
    };
    if files.paths.is_empty() {
        files.well_formed = false;
    }
    files
}

fn add(paths: &mut Vec<String>, path: &str) {
    if !path.is_empty() && !paths.iter().any(|p| p == path) {
        paths.push(path.to_owned());
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Section {
    None,
    Add,
    Update,
    Delete,
    Done,
}

/// The `apply_patch` envelope; headers outside it are still collected.
fn parse_envelope(text: &str, paths: &mut Vec<String>) -> bool {
    let mut ok = true;
    let mut section = Section::None;
    let mut begun = false;
    let mut hunk_lines = 0usize;
    for line in text.lines() {
        if let Some(name) = ENVELOPE_HEADERS.iter().find_map(|h| line.strip_prefix(h)) {
            let name = name.trim();
            add(paths, name);
            if name.is_empty() || !begun || section == Section::Done {
                ok = false;
            }
            let next = if line.starts_with("*** Add") {
                Section::Add
            } else if line.starts_with("*** Update") {
                Section::Update
            } else if line.starts_with("*** Delete") {
                Section::Delete
            } else {
                // `Move to` only directly follows an `Update File` header.
                if section != Section::Update || hunk_lines != 0 {
                    ok = false;
                }
                Section::Update
            };
            section = next;
            hunk_lines = 0;
            continue;
        }
        let trimmed = line.trim();
        if trimmed == "*** Begin Patch" {
            ok &= !begun;
            begun = true;
            continue;
        }
        if trimmed == "*** End Patch" {
            ok &= begun && section != Section::Done && section != Section::None;
            section = Section::Done;
            continue;
        }
        hunk_lines += 1;
        ok &= match section {
            Section::Add => line.starts_with('+'),
            Section::Update => {
                line.starts_with("@@")
                    || line.starts_with([' ', '+', '-'])
                    || line.is_empty()
                    || trimmed == "*** End of File"
            }
            Section::Delete | Section::None | Section::Done => trimmed.is_empty(),
        };
    }
    ok && section == Section::Done
}

/// Unified diff headers (`---`/`+++` in pairs) and git's rename/copy lines.
fn parse_unified(text: &str, paths: &mut Vec<String>) -> bool {
    let mut ok = true;
    let mut open_minus = false;
    let mut headers = 0usize;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("--- ") {
            ok &= !open_minus;
            open_minus = true;
            diff_name(rest, paths);
        } else if let Some(rest) = line.strip_prefix("+++ ") {
            ok &= open_minus;
            open_minus = false;
            headers += 1;
            diff_name(rest, paths);
        } else if let Some(rest) = ["rename from ", "rename to ", "copy from ", "copy to "]
            .iter()
            .find_map(|h| line.strip_prefix(h))
        {
            // git reads these names without a prefix to strip.
            let rest = rest.trim();
            add(paths, &unquote(rest).unwrap_or_else(|| rest.to_owned()));
            headers += 1;
        } else if let Some(rest) = line.strip_prefix("diff --git ") {
            git_header_names(rest, paths);
        } else if let Some(rest) = line.strip_prefix("Index: ") {
            diff_name(rest, paths);
        } else if let Some(rest) = line.strip_prefix("*** ").filter(|r| {
            !r.ends_with(" ****") && !ENVELOPE_HEADERS.iter().any(|h| line.starts_with(h))
        }) {
            // A context diff's old-file header: GNU patch may write the file it names.
            diff_name(rest, paths);
            ok = false;
        } else if open_minus {
            ok = false;
        } else if ENVELOPE_HEADERS.iter().any(|h| line.starts_with(h)) {
            // An envelope header without `*** Begin Patch`: collect, but not well-formed.
            if let Some(name) = ENVELOPE_HEADERS.iter().find_map(|h| line.strip_prefix(h)) {
                add(paths, name.trim());
            }
            ok = false;
        }
    }
    ok && !open_minus && headers > 0
}

fn diff_name(rest: &str, paths: &mut Vec<String>) {
    for name in diff_names(rest) {
        add(paths, &name);
    }
}

/// A name as written and without its first component.
fn add_with_stripped(paths: &mut Vec<String>, name: &str) {
    if name.is_empty() || name == "/dev/null" {
        return;
    }
    add(paths, name);
    if let Some(stripped) = strip_first_component(name) {
        add(paths, &stripped);
    }
}

/// Every name a patch tool may read from the text after `--- `/`+++ ` (or `Index: `), each as
/// written and with its first component stripped.
fn diff_names(rest: &str) -> Vec<String> {
    let mut readings = Vec::new();
    let rest = rest.trim_start();
    if let Some(name) = unquote(rest) {
        readings.push(name);
    }
    // git: to the tab, else to the end, less trailing blanks (and a timestamp, a prefix below).
    let to_tab = rest.split('\t').next().unwrap_or(rest).trim_end();
    readings.push(to_tab.to_owned());
    // GNU patch stops at the first blank; git drops a trailing timestamp after a blank. Every
    // prefix that ends at a blank covers both, whatever the timestamp looks like.
    let bytes = to_tab.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if (b == b' ' || b == b'\t') && i > 0 && bytes[i - 1] != b' ' {
            readings.push(to_tab[..i].to_owned());
        }
    }
    let mut out = Vec::new();
    for name in &readings {
        add_with_stripped(&mut out, name);
    }
    out
}

/// `-p1`: the name without its first component (and the slashes after it), as git and GNU patch
/// strip it; `None` when nothing is left.
fn strip_first_component(name: &str) -> Option<String> {
    // An absolute name's first component is the empty one before its `/`.
    let rest = match name.strip_prefix('/') {
        Some(rest) => rest,
        None => name.split_once('/')?.1,
    };
    let rest = rest.trim_start_matches('/');
    (!rest.is_empty()).then(|| rest.to_owned())
}

/// A git C-quoted name (`"…"` with `\\`, `\"`, `\t`, `\n`, octal escapes …) at the start of
/// `text`; `None` when it is not one.
fn unquote(text: &str) -> Option<String> {
    let body = text.strip_prefix('"')?;
    let mut out = Vec::new();
    let mut bytes = body.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'"' => return Some(String::from_utf8_lossy(&out).into_owned()),
            b'\\' => {
                let e = bytes.next()?;
                out.push(match e {
                    b'a' => 7,
                    b'b' => 8,
                    b't' => b'\t',
                    b'n' => b'\n',
                    b'v' => 11,
                    b'f' => 12,
                    b'r' => b'\r',
                    b'0'..=b'7' => {
                        let d2 = bytes.next()?;
                        let d3 = bytes.next()?;
                        if !(b'0'..=b'7').contains(&d2) || !(b'0'..=b'7').contains(&d3) {
                            return None;
                        }
                        let value = u32::from(e - b'0') * 64
                            + u32::from(d2 - b'0') * 8
                            + u32::from(d3 - b'0');
                        u8::try_from(value).ok()?
                    }
                    other => other,
                });
            }
            other => out.push(other),
        }
    }
    None
}

/// `diff --git A B`: git takes the names from here when no `---`/`+++` follow (a mode change, a
/// binary patch). Unquoted names with blanks are ambiguous, so every split before ` b/` counts.
fn git_header_names(rest: &str, paths: &mut Vec<String>) {
    if let Some(first) = unquote(rest) {
        add_with_stripped(paths, &first);
    }
    for (i, _) in rest.match_indices(" b/").chain(rest.match_indices(" \"b/")) {
        diff_name(&rest[..i], paths);
        diff_name(&rest[i + 1..], paths);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_sections() {
        let text = "*** Begin Patch\n*** Update File: src/a.rs\n*** Move to: src/b.rs\n@@\n-x\n+y\n*** Add File: .env\n+A=1\n*** Delete File: old.txt\n*** End Patch\n";
        let p = parse(text);
        assert!(p.well_formed);
        assert_eq!(p.paths, ["src/a.rs", "src/b.rs", ".env", "old.txt"]);
    }

    #[test]
    fn broken_envelopes_still_name_their_files() {
        for text in [
            "*** Update File: .git/config\n@@\n+x\n",
            "*** Begin Patch\n*** Update File: .git/config\n@@\n+x\n",
            "*** Begin Patch\n*** Add File: a\nnot plus\n*** End Patch\n",
            "*** Begin Patch\n*** Move to: a\n*** End Patch\n",
        ] {
            let p = parse(text);
            assert!(!p.well_formed, "{text:?}");
            assert!(!p.paths.is_empty(), "{text:?}");
        }
        assert_eq!(parse("garbage").paths, Vec::<String>::new());
        assert!(!parse("garbage").well_formed);
        assert!(!parse("").well_formed);
    }

    #[test]
    fn unified_diffs() {
        let p = parse("--- a/src/a.rs\n+++ b/src/a.rs\n@@ -1 +1 @@\n-x\n+y\n");
        assert!(p.well_formed);
        assert_eq!(p.paths, ["a/src/a.rs", "src/a.rs", "b/src/a.rs"]);
        let p = parse("--- /dev/null\n+++ b/new\n");
        assert_eq!(p.paths, ["b/new", "new"]);
        let p = parse("diff --git a/x b/y\nrename from x\nrename to .env\n");
        assert!(p.well_formed);
        assert_eq!(p.paths, ["a/x", "x", "b/y", "y", ".env"]);
        assert!(!parse("--- a\n--- b\n").well_formed);
    }

    /// `git apply` and GNU `patch -p1` read these names differently; every reading is reported.
    #[test]
    fn unified_names_in_every_reading() {
        let names = |text: &str| parse(text).paths;
        // GNU patch stops at the blank: `.env`; git reads `.env x`.
        let p = names("--- a/.env x\n+++ b/.env x\n@@ -1 +1 @@\n-x\n+y\n");
        assert!(p.contains(&".env".to_owned()), "{p:?}");
        assert!(p.contains(&".env x".to_owned()), "{p:?}");
        // A timestamp after a blank or a tab.
        let p = names("--- a/.env 2024-01-01 00:00:00.000000000 +0000\n+++ b/.env\t2024-01-01\n");
        assert!(p.contains(&".env".to_owned()), "{p:?}");
        // Any first component is stripped by -p1, not only `a/` and `b/`.
        let p = names("--- x/.env\n+++ y/.git/config\n");
        assert!(
            p.contains(&".env".to_owned()) && p.contains(&".git/config".to_owned()),
            "{p:?}"
        );
        // git's quoted names, with escapes.
        let p = names("--- \"a/.e\\156v\"\n+++ \"b/.git/con\\146ig\"\n");
        assert!(
            p.contains(&".env".to_owned()) && p.contains(&".git/config".to_owned()),
            "{p:?}"
        );
        // /dev/null is no file, nor is its last component.
        assert_eq!(names("--- /dev/null\n+++ b/new\n"), ["b/new", "new"]);
        // An absolute name loses only its leading slash to -p1.
        assert!(names("--- /etc/x\n+++ /etc/x\n").contains(&"etc/x".to_owned()));
        // Context diffs, Index: lines and git headers without ---/+++ (a binary patch).
        assert!(
            names("*** .env\n--- x\n***************\n*** 1 ****\n").contains(&".env".to_owned())
        );
        assert!(names("Index: .env\n--- x\n+++ x\n").contains(&".env".to_owned()));
        let p = names("diff --git a/.env b/.env\nindex 1..2\nGIT binary patch\n");
        assert!(p.contains(&".env".to_owned()), "{p:?}");
    }
}
