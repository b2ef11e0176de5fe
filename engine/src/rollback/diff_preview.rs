//! A small unified diff of text content for `--dry-run` previews.
//!
//! Only valid UTF-8 without NUL bytes is shown; binary content, very large files and changes too
//! large for the bounded line comparison return `None` (the caller says why no diff is shown).
//! The `---`/`+++` labels name paths, so they pass through the one display escape: a newline in
//! a file name cannot print a fake header or report line.
//!
//! Sensitive files (a change the run's policy denied, or a path [`is_sensitive_path`] names:
//! `.env*`, keys, credentials) never get a content diff unless the user asks with
//! `--show-secrets`: the preview shows sizes and hashes only ([`withheld`]).

use agentdiff_host::redact::escape_terminal;
pub use agentdiff_policy::score::is_sensitive_path;
use agentdiff_policy::Action;
use agentdiff_scan::Entry;

/// Largest side shown inline.
pub const MAX_PREVIEW_BYTES: u64 = 1024 * 1024;
/// Bound on the comparison table (lines × lines) after trimming the common prefix and suffix.
const MAX_CELLS: usize = 4_000_000;
const CONTEXT: usize = 3;

/// Why a preview could not be produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoPreview {
    Binary,
    TooLarge,
}

impl NoPreview {
    pub fn describe(self) -> &'static str {
        match self {
            NoPreview::Binary => "no diff shown: binary or non-UTF-8 content",
            NoPreview::TooLarge => "no diff shown: the content is too large to compare inline",
        }
    }
}

/// Whether a plan item's content diff is withheld: its recorded decision was `deny`, or its path
/// names secrets.
pub fn is_sensitive(path: &str, decision: Action) -> bool {
    decision == Action::Deny || is_sensitive_path(path)
}

/// What a withheld diff shows instead: each side's size and SHA-256 prefix.
pub fn withheld(
    from: Option<&Entry>,
    from_label: &str,
    to: Option<&Entry>,
    to_label: &str,
) -> String {
    format!(
        "content diff withheld: sensitive file (pass --show-secrets to see it)\n{from_label}: {}\n{to_label}: {}\n",
        side_summary(from),
        side_summary(to)
    )
}

/// One side of a withheld diff: `absent`, or its size and SHA-256 prefix (never content).
pub fn side_summary(e: Option<&Entry>) -> String {
    match e {
        None => "absent".to_owned(),
        Some(e) => format!(
            "{} bytes, sha256 {}",
            e.size,
            e.sha256
                .as_deref()
                .map(|h| h.get(..16).unwrap_or(h))
                .unwrap_or("unknown")
        ),
    }
}

fn as_text(bytes: &[u8]) -> Result<&str, NoPreview> {
    if bytes.len() as u64 > MAX_PREVIEW_BYTES {
        return Err(NoPreview::TooLarge);
    }
    if bytes.contains(&0) {
        return Err(NoPreview::Binary);
    }
    std::str::from_utf8(bytes).map_err(|_| NoPreview::Binary)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tag {
    Same,
    Del,
    Add,
}

/// Unified diff from `old` to `new` (`---`/`+++` labels as given). Identical content gives a
/// diff with only the header lines.
pub fn unified(
    old: &[u8],
    new: &[u8],
    old_label: &str,
    new_label: &str,
) -> Result<String, NoPreview> {
    let (old, new) = (as_text(old)?, as_text(new)?);
    let a: Vec<&str> = old.split_inclusive('\n').collect();
    let b: Vec<&str> = new.split_inclusive('\n').collect();
    let script = edit_script(&a, &b)?;
    let mut out = format!(
        "--- {}\n+++ {}\n",
        escape_terminal(old_label),
        escape_terminal(new_label)
    );
    // Line positions (1-based) of each script element in a and b.
    let mut pos = Vec::with_capacity(script.len());
    let (mut i, mut j) = (0usize, 0usize);
    for (tag, _) in &script {
        pos.push((i, j));
        match tag {
            Tag::Same => {
                i += 1;
                j += 1;
            }
            Tag::Del => i += 1,
            Tag::Add => j += 1,
        }
    }
    let changed: Vec<usize> = script
        .iter()
        .enumerate()
        .filter(|(_, (t, _))| *t != Tag::Same)
        .map(|(k, _)| k)
        .collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(CONTEXT);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 2 * CONTEXT + 1 {
            end = changed[k];
            k += 1;
        }
        let end = (end + CONTEXT + 1).min(script.len());
        let (a0, b0) = pos[start];
        let a_len = script[start..end]
            .iter()
            .filter(|(t, _)| *t != Tag::Add)
            .count();
        let b_len = script[start..end]
            .iter()
            .filter(|(t, _)| *t != Tag::Del)
            .count();
        let a_start = if a_len == 0 { a0 } else { a0 + 1 };
        let b_start = if b_len == 0 { b0 } else { b0 + 1 };
        out.push_str(&format!("@@ -{a_start},{a_len} +{b_start},{b_len} @@\n"));
        for (tag, line) in &script[start..end] {
            out.push(match tag {
                Tag::Same => ' ',
                Tag::Del => '-',
                Tag::Add => '+',
            });
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    Ok(out)
}

fn edit_script<'s>(a: &[&'s str], b: &[&'s str]) -> Result<Vec<(Tag, &'s str)>, NoPreview> {
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let max_suffix = a.len().min(b.len()) - prefix;
    let suffix = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(max_suffix)
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[prefix..a.len() - suffix], &b[prefix..b.len() - suffix]);
    let (n, m) = (am.len(), bm.len());
    if (n + 1).saturating_mul(m + 1) > MAX_CELLS {
        return Err(NoPreview::TooLarge);
    }
    // lcs[i][j] = LCS length of am[i..] and bm[j..].
    let w = m + 1;
    let mut lcs = vec![0u32; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i * w + j] = if am[i] == bm[j] {
                lcs[(i + 1) * w + j + 1] + 1
            } else {
                lcs[(i + 1) * w + j].max(lcs[i * w + j + 1])
            };
        }
    }
    let mut script: Vec<(Tag, &str)> = a[..prefix].iter().map(|l| (Tag::Same, *l)).collect();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && am[i] == bm[j] {
            script.push((Tag::Same, am[i]));
            i += 1;
            j += 1;
        } else if j < m && (i == n || lcs[i * w + j + 1] >= lcs[(i + 1) * w + j]) {
            script.push((Tag::Add, bm[j]));
            j += 1;
        } else {
            script.push((Tag::Del, am[i]));
            i += 1;
        }
    }
    script.extend(a[a.len() - suffix..].iter().map(|l| (Tag::Same, *l)));
    // Deletions before additions within a run of changes reads more naturally.
    let mut k = 0;
    while k < script.len() {
        if script[k].0 == Tag::Same {
            k += 1;
            continue;
        }
        let start = k;
        while k < script.len() && script[k].0 != Tag::Same {
            k += 1;
        }
        script[start..k].sort_by_key(|(t, _)| match t {
            Tag::Del => 0,
            _ => 1,
        });
    }
    Ok(script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appended_line() {
        let d = unified(b"a\nb\n", b"a\nb\nx\n", "old", "new").unwrap();
        assert_eq!(d, "--- old\n+++ new\n@@ -1,2 +1,3 @@\n a\n b\n+x\n");
    }

    #[test]
    fn changed_middle_line_with_context() {
        let old = b"1\n2\n3\n4\n5\n6\n7\n8\n9\n";
        let new = b"1\n2\n3\n4\nfive\n6\n7\n8\n9\n";
        let d = unified(old, new, "a", "b").unwrap();
        assert_eq!(
            d,
            "--- a\n+++ b\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
        );
    }

    #[test]
    fn from_empty_and_missing_newline() {
        let d = unified(b"", b"x", "a", "b").unwrap();
        assert_eq!(
            d,
            "--- a\n+++ b\n@@ -0,0 +1,1 @@\n+x\n\\ No newline at end of file\n"
        );
    }

    #[test]
    fn binary_is_not_shown() {
        assert_eq!(unified(b"a\0", b"b", "a", "b"), Err(NoPreview::Binary));
        assert_eq!(unified(b"\xff", b"b", "a", "b"), Err(NoPreview::Binary));
    }
}
