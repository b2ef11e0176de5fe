//! `filesystem.deny_read`: paths the pre-tool-use hook denies to reading tools.
//!
//! A pattern is a segment-aware glob (the same syntax as the other filesystem patterns),
//! anchored at the project root, at the home directory (`~/…`) or at `/` (`/…`). A pattern
//! also matches everything below what it names (`~/.ssh` covers `~/.ssh/id_rsa`), because a
//! credential directory is read through its files.
//!
//! Not defended: this is a hook rule, so it holds only for tool calls the hook sees and judges
//! (Read, NotebookRead, Grep, Glob, LS, and arguments of other tools). A shell command, or a
//! tool the hook does not model, can still read these files; the sandboxing backends are the
//! control for that.

use std::path::Path;
use std::sync::OnceLock;

use globset::{Glob, GlobBuilder, GlobMatcher};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Anchor {
    Project,
    Home,
    Absolute,
}

#[derive(Debug, Clone)]
enum Segment {
    AnyDepth,
    One(LazyMatcher),
}

/// One segment of a checked pattern. A segment without glob syntax is compared as it is (most
/// of the default list: `.ssh`, `etc`, `shadow`); a glob's matcher is built on first use: every
/// policy load compiles the section, only the hook matches against it, and building matchers is
/// most of a policy's compile.
#[derive(Debug, Clone)]
enum LazyMatcher {
    Literal(String),
    Glob {
        glob: Glob,
        matcher: OnceLock<GlobMatcher>,
    },
}

impl LazyMatcher {
    fn new(part: &str) -> Result<LazyMatcher, globset::Error> {
        if !part.contains(['*', '?', '[', ']', '{', '}', '\\']) {
            return Ok(LazyMatcher::Literal(part.to_owned()));
        }
        let glob = GlobBuilder::new(part)
            .literal_separator(true)
            .backslash_escape(false)
            .build()?;
        Ok(LazyMatcher::Glob {
            glob,
            matcher: OnceLock::new(),
        })
    }

    fn is_match(&self, part: &str) -> bool {
        match self {
            LazyMatcher::Literal(l) => l == part,
            LazyMatcher::Glob { glob, matcher } => matcher
                .get_or_init(|| glob.compile_matcher())
                .is_match(part),
        }
    }
}

#[derive(Debug, Clone)]
struct ReadPattern {
    anchor: Anchor,
    /// The pattern below its anchor, split into segments.
    segments: Vec<Segment>,
}

/// The compiled `filesystem.deny_read` section.
#[derive(Debug, Clone)]
pub struct DenyRead {
    texts: Vec<String>,
    patterns: Vec<ReadPattern>,
}

/// Where the anchors of the patterns are, as symlink-free absolute paths.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Anchors<'a> {
    pub(crate) root: &'a Path,
    pub(crate) home: Option<&'a Path>,
}

/// Check one `deny_read` entry's syntax; returns it with backslashes unified, or a reason.
pub(crate) fn check_read_pattern(
    pattern: &str,
) -> Result<String, super::super::path::PatternError> {
    let (prefix, rest) = split_anchor(pattern);
    super::super::path::check_pattern(rest).map(|rest| format!("{prefix}{rest}"))
}

fn split_anchor(pattern: &str) -> (&str, &str) {
    if let Some(rest) = pattern.strip_prefix("~/") {
        ("~/", rest)
    } else if let Some(rest) = pattern.strip_prefix('/') {
        ("/", rest)
    } else {
        ("", pattern)
    }
}

impl DenyRead {
    /// Compile checked patterns (see [`check_read_pattern`]); errors name `filesystem.deny_read[i]`.
    pub(crate) fn compile(texts: Vec<String>) -> Result<DenyRead, Vec<String>> {
        let mut patterns = Vec::new();
        let mut problems = Vec::new();
        for (i, text) in texts.iter().enumerate() {
            let (prefix, rest) = split_anchor(text);
            let anchor = match prefix {
                "~/" => Anchor::Home,
                "/" => Anchor::Absolute,
                _ => Anchor::Project,
            };
            let mut segments = Vec::new();
            for part in rest.split('/') {
                if part == "**" {
                    segments.push(Segment::AnyDepth);
                    continue;
                }
                match LazyMatcher::new(part) {
                    Ok(matcher) => segments.push(Segment::One(matcher)),
                    Err(err) => {
                        problems.push(format!(
                            "filesystem.deny_read[{i}]: invalid glob {text:?}: {}",
                            err.kind()
                        ));
                        break;
                    }
                }
            }
            patterns.push(ReadPattern { anchor, segments });
        }
        if problems.is_empty() {
            Ok(DenyRead { texts, patterns })
        } else {
            Err(problems)
        }
    }

    /// No patterns.
    pub(crate) fn empty() -> DenyRead {
        DenyRead {
            texts: Vec::new(),
            patterns: Vec::new(),
        }
    }

    /// The default section: the engine's credential locations under `~/`, then the project's
    /// secret files, then the system's credential locations ([`agentdiff_host::credentials`]).
    pub fn default_patterns() -> Vec<String> {
        use agentdiff_host::credentials as c;
        let home = c::HOME_CREDENTIAL_LOCATIONS
            .iter()
            .map(|l| format!("~/{l}"));
        let project = c::PROJECT_SECRET_PATTERNS.iter().map(|p| (*p).to_owned());
        let system = c::SYSTEM_CREDENTIAL_LOCATIONS
            .iter()
            .map(|p| (*p).to_owned());
        home.chain(project).chain(system).collect()
    }

    pub fn patterns(&self) -> &[String] {
        &self.texts
    }

    /// The first pattern that matches `abs` (a symlink-free absolute path) or a directory
    /// above it.
    pub(crate) fn first_match(&self, abs: &Path, anchors: Anchors<'_>) -> Option<usize> {
        self.patterns.iter().position(|p| {
            relative_parts(abs, p.anchor, anchors)
                .is_some_and(|parts| prefix_matches(&p.segments, &parts))
        })
    }

    /// The first pattern that could match something strictly below the directory `abs`.
    pub(crate) fn first_reaching_below(&self, abs: &Path, anchors: Anchors<'_>) -> Option<usize> {
        self.patterns
            .iter()
            .position(|p| match relative_parts(abs, p.anchor, anchors) {
                Some(parts) => could_extend(&p.segments, &parts),
                // The anchor itself may lie below `abs` (searching `/` reaches `~/.ssh`).
                None => anchor_path(p.anchor, anchors).is_some_and(|a| a.starts_with(abs)),
            })
    }

    pub(crate) fn text(&self, index: usize) -> &str {
        self.texts.get(index).map_or("", String::as_str)
    }
}

fn anchor_path<'a>(anchor: Anchor, anchors: Anchors<'a>) -> Option<&'a Path> {
    match anchor {
        Anchor::Project => Some(anchors.root),
        Anchor::Home => anchors.home,
        Anchor::Absolute => Some(Path::new("/")),
    }
}

fn relative_parts(abs: &Path, anchor: Anchor, anchors: Anchors<'_>) -> Option<Vec<String>> {
    let rel = abs.strip_prefix(anchor_path(anchor, anchors)?).ok()?;
    Some(
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect(),
    )
}

fn segment_matches(segment: &Segment, part: &str) -> bool {
    match segment {
        Segment::AnyDepth => true,
        Segment::One(glob) => glob.is_match(part),
    }
}

/// Whether the pattern matches `parts[..k]` for some `k` (the path itself or a directory
/// above it). Linear in `segments.len() * parts.len()` at worst, with a memo of positions.
fn prefix_matches(segments: &[Segment], parts: &[String]) -> bool {
    // reach[j]: pattern segments 0..i can match parts 0..j.
    let mut reach = vec![false; parts.len() + 1];
    reach[0] = true;
    for segment in segments {
        let mut next = vec![false; parts.len() + 1];
        for j in 0..=parts.len() {
            if !reach[j] {
                continue;
            }
            match segment {
                Segment::AnyDepth => {
                    for slot in next.iter_mut().skip(j) {
                        *slot = true;
                    }
                    break;
                }
                Segment::One(_) => {
                    if let Some(part) = parts.get(j) {
                        if segment_matches(segment, part) {
                            next[j + 1] = true;
                        }
                    }
                }
            }
        }
        reach = next;
    }
    // A whole match of a non-empty prefix: the path or one of its directories is named.
    reach.iter().skip(1).any(|&r| r)
}

/// Whether the pattern could match a path that starts with `parts` and is longer.
fn could_extend(segments: &[Segment], parts: &[String]) -> bool {
    // live[i]: pattern segments 0..i match the parts consumed so far.
    let mut live = vec![false; segments.len() + 1];
    live[0] = true;
    close_over_any_depth(segments, &mut live);
    for part in parts {
        let mut next = vec![false; segments.len() + 1];
        for (i, &on) in live.iter().enumerate() {
            if !on {
                continue;
            }
            match segments.get(i) {
                Some(Segment::AnyDepth) => next[i] = true,
                Some(seg) if segment_matches(seg, part) => next[i + 1] = true,
                Some(_) => {}
                // The whole pattern matched a directory above: everything below is named too.
                None => next[i] = true,
            }
        }
        close_over_any_depth(segments, &mut next);
        live = next;
    }
    live.iter().any(|&on| on)
}

/// `**` also matches zero segments: a live position before it makes the one after it live.
fn close_over_any_depth(segments: &[Segment], live: &mut [bool]) {
    for i in 0..segments.len() {
        if live[i] && matches!(segments.get(i), Some(Segment::AnyDepth)) {
            live[i + 1] = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(p: &[&str]) -> DenyRead {
        DenyRead::compile(p.iter().map(|s| (*s).to_owned()).collect()).unwrap()
    }

    #[test]
    fn anchors_and_directories() {
        let r = rules(&["~/.ssh", ".env", "/etc/shadow", "**/*.pem"]);
        let a = Anchors {
            root: Path::new("/p"),
            home: Some(Path::new("/home/u")),
        };
        assert_eq!(r.first_match(Path::new("/home/u/.ssh/id_rsa"), a), Some(0));
        assert_eq!(r.first_match(Path::new("/home/u/.ssh"), a), Some(0));
        assert_eq!(r.first_match(Path::new("/home/u/.sshx"), a), None);
        assert_eq!(r.first_match(Path::new("/p/.env"), a), Some(1));
        assert_eq!(r.first_match(Path::new("/p/src/.env"), a), None);
        assert_eq!(r.first_match(Path::new("/etc/shadow"), a), Some(2));
        assert_eq!(r.first_match(Path::new("/p/a/b/c.pem"), a), Some(3));
        assert_eq!(r.first_match(Path::new("/q/c.pem"), a), None);
    }

    #[test]
    fn reaching_below_a_directory() {
        let r = rules(&[".env", "~/.ssh"]);
        let a = Anchors {
            root: Path::new("/p"),
            home: Some(Path::new("/home/u")),
        };
        assert_eq!(r.first_reaching_below(Path::new("/p"), a), Some(0));
        assert_eq!(r.first_reaching_below(Path::new("/p/src"), a), None);
        assert_eq!(r.first_reaching_below(Path::new("/home"), a), Some(1));
        assert_eq!(
            r.first_reaching_below(Path::new("/home/u/.ssh"), a),
            Some(1)
        );
        let r = rules(&["**/secrets/*"]);
        assert_eq!(r.first_reaching_below(Path::new("/p/src"), a), Some(0));
        assert_eq!(r.first_reaching_below(Path::new("/elsewhere"), a), None);
    }

    /// A segment without glob syntax is compared as it is and decides as its glob would.
    #[test]
    fn literal_segments_decide_as_globs_do() {
        let a = Anchors {
            root: Path::new("/p"),
            home: Some(Path::new("/home/u")),
        };
        let literal = rules(&["/etc/ssl/private", ".env.local"]);
        let glob = rules(&["/etc/ssl/priv[a]te", ".env.loca[l]"]);
        assert!(matches!(
            literal.patterns[0].segments[0],
            Segment::One(LazyMatcher::Literal(_))
        ));
        assert!(matches!(
            glob.patterns[0].segments[2],
            Segment::One(LazyMatcher::Glob { .. })
        ));
        for path in [
            "/etc/ssl/private",
            "/etc/ssl/private/k.pem",
            "/etc/ssl/privatex",
            "/etc/ssl/Private",
            "/etc/ssl",
            "/p/.env.local",
            "/p/.env.localx",
            "/p/x/.env.local",
        ] {
            let path = Path::new(path);
            assert_eq!(
                literal.first_match(path, a),
                glob.first_match(path, a),
                "{path:?}"
            );
            assert_eq!(
                literal.first_reaching_below(path, a),
                glob.first_reaching_below(path, a),
                "{path:?}"
            );
        }
    }

    #[test]
    fn syntax() {
        assert_eq!(check_read_pattern("~/.ssh").unwrap(), "~/.ssh");
        assert_eq!(check_read_pattern("/etc/shadow").unwrap(), "/etc/shadow");
        assert!(check_read_pattern("~/../x").is_err());
        assert!(check_read_pattern("//x").is_err());
        assert!(check_read_pattern("").is_err());
    }
}
