//! The files a patch text touches.
//!
//! Two formats are read: the `apply_patch` envelope (`*** Begin Patch` … `*** End Patch` with
//! `*** Add File:`, `*** Update File:` (optionally followed by `*** Move to:`) and
//! `*** Delete File:` sections) and unified diffs (`--- a/x` / `+++ b/x`, git's `rename from/to`
//! and `copy from/to`). Every file header found is reported whether or not the whole text is
//! well-formed, so a denied file is denied even in a broken patch; [`PatchFiles::well_formed`]
//! says whether the text was understood completely. A unified-diff name with an `a/` or `b/`
//! prefix is reported both with and without it, since the tool may apply it with `-p0` or `-p1`.
//! One pass over the lines: linear in the text.

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
            add(paths, rest.trim());
            headers += 1;
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
    let name = rest.split('\t').next().unwrap_or(rest).trim();
    if name == "/dev/null" || name.is_empty() {
        return;
    }
    add(paths, name);
    if let Some(stripped) = name.strip_prefix("a/").or_else(|| name.strip_prefix("b/")) {
        add(paths, stripped);
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
        assert_eq!(p.paths, ["x", ".env"]);
        assert!(!parse("--- a\n--- b\n").well_formed);
    }
}
