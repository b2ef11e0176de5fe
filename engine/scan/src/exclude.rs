//! What the scan skips on purpose, and why: the run store, default generated directories (unless a
//! deny glob names them) and `ROOT/.agentdiffignore` (Git semantics via the `ignore` crate).
//!
//! Invariant: an ignore rule never hides a path a deny (or `observe.include`) glob names, nor a
//! protected path ([`agentdiff_policy::never_ignored`]: git metadata, agentdiff's configuration
//! and ignore files, Claude Code's settings, `.env*`, what the built-in policy denies), nor
//! anything inside a directory with git's layout. A path such a glob matches is scanned even when `.agentdiffignore` lists it or a parent directory of
//! it, at any depth; an ignored directory that could hold such a path is searched
//! ([`Verdict::Search`]): walked, with only the named paths recorded. The ignore rules themselves
//! come from the before-state (`IgnoreSource::Lines` for the after-scan), never from what the
//! command wrote, and the ignore file is protected configuration in every policy.
//!
//! Not defended: default-excluded directories (`node_modules`, `target`, …) are re-included only
//! by a glob whose leading segments name them literally (see [`DEFAULT_EXCLUDED_DIRS`]).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use globset::Candidate;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::Match;

use agentdiff_policy::glob::RuleSet;

use super::manifest::exclusion_reason;
use super::ScanError;

/// The run store below the root; always excluded, never re-included.
pub const STORE_DIR: &str = ".agentdiff";

/// The ignore file read from the root.
pub const IGNORE_FILE: &str = ".agentdiffignore";

/// Directory names excluded by default at any depth (defined in `agentdiff_host`, which plugin
/// discovery also reads, to refuse programs planted below them).
pub use agentdiff_host::system::DEFAULT_EXCLUDED_DIRS;

/// Upper bound for `.agentdiffignore`; a larger file is almost certainly not an ignore file.
const MAX_IGNORE_FILE_BYTES: usize = 1 << 20;

/// What the walk does with one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Record it (and walk it, for a directory).
    Scan,
    /// Skip it, for this reason.
    Exclude(&'static str),
    /// An ignored directory that may hold a path a deny glob names: walk it, recording only
    /// named paths (the directory itself is reported excluded for this reason).
    Search(&'static str),
}

/// The compiled exclusion rules of one scan.
pub(crate) struct Rules {
    ignore: Gitignore,
    /// Literal leading segments of each re-including deny glob (never empty).
    reinclude: Vec<Vec<String>>,
    /// The deny and include globs themselves: a path they name is never ignored.
    named: Arc<RuleSet>,
    /// Each glob's literal leading segments (possibly empty) and whether it is literal throughout.
    prefixes: Vec<(Vec<String>, bool)>,
}

/// The globs a scan never ignores, compiled once per process for one list: both scans of a run
/// name the same globs, and compiling them is most of a small tree's scan.
fn named_rules(reinclude: &[String]) -> Result<Arc<RuleSet>, ScanError> {
    static LAST: Mutex<Option<(Vec<String>, Arc<RuleSet>)>> = Mutex::new(None);
    let mut last = LAST.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((patterns, rules)) = last.as_ref() {
        if patterns.as_slice() == reinclude {
            return Ok(Arc::clone(rules));
        }
    }
    let rules = RuleSet::compile("filesystem.deny", reinclude.to_vec(), true)
        .map(Arc::new)
        .map_err(|p| ScanError::IgnoreFile(format!("invalid deny pattern: {}", p.join("; "))))?;
    *last = Some((reinclude.to_vec(), Arc::clone(&rules)));
    Ok(rules)
}

impl Rules {
    pub(crate) fn new(
        root: &Path,
        ignore_lines: &[String],
        reinclude: &[String],
    ) -> Result<Self, ScanError> {
        let mut builder = GitignoreBuilder::new(root);
        for line in ignore_lines {
            builder
                .add_line(None, line)
                .map_err(|e| ScanError::IgnoreFile(format!("invalid pattern {line:?}: {e}")))?;
        }
        let ignore = builder
            .build()
            .map_err(|e| ScanError::IgnoreFile(format!("cannot compile patterns: {e}")))?;
        // Protected paths are named whatever the caller passed: no ignore rule hides them. They
        // do not re-include default-excluded directories (those are swept instead).
        let mut named_globs = reinclude.to_vec();
        named_globs.extend(agentdiff_policy::never_ignored());
        let named = named_rules(&named_globs)?;
        let prefixes = named_globs
            .iter()
            .map(|g| {
                let lit = literal_prefix(g);
                let whole = lit.len() == g.trim().trim_matches('/').split('/').count();
                (lit, whole)
            })
            .collect();
        let reinclude = reinclude
            .iter()
            .map(|g| literal_prefix(g))
            .filter(|p| !p.is_empty())
            .collect();
        Ok(Self {
            ignore,
            reinclude,
            named,
            prefixes,
        })
    }

    /// Why `rel` (a project-relative path, `/`-separated) is excluded, or `None` to scan it.
    #[cfg(test)]
    pub(crate) fn excluded(&self, rel: &str, name: &str, is_dir: bool) -> Option<&'static str> {
        match self.verdict(rel, name, is_dir, false) {
            Verdict::Scan => None,
            Verdict::Exclude(r) | Verdict::Search(r) => Some(r),
        }
    }

    /// What to do with `rel` (project-relative, `/`-separated). `inside_ignored`: a parent
    /// directory is ignored (the walk is searching it for named paths).
    pub(crate) fn verdict(
        &self,
        rel: &str,
        name: &str,
        is_dir: bool,
        inside_ignored: bool,
    ) -> Verdict {
        if rel == STORE_DIR {
            return Verdict::Exclude(exclusion_reason::AGENTDIFF_STORE);
        }
        if is_dir && nested_git_objects(rel) {
            return Verdict::Exclude(exclusion_reason::DEFAULT_GENERATED);
        }
        if is_dir
            && DEFAULT_EXCLUDED_DIRS.contains(&name)
            && !self.reincluded(rel)
            && !nested_git(rel, name)
        {
            return Verdict::Exclude(exclusion_reason::DEFAULT_GENERATED);
        }
        // The ignore file cannot hide itself: a change to the rules must stay visible.
        let ignored = inside_ignored
            || (rel != IGNORE_FILE
                && matches!(
                    self.ignore.matched_path_or_any_parents(rel, is_dir),
                    Match::Ignore(_)
                ));
        if !ignored || self.named.first_match(&Candidate::new(rel)).is_some() {
            return Verdict::Scan;
        }
        if is_dir && self.may_hold_named(rel) {
            return Verdict::Search(exclusion_reason::AGENTDIFFIGNORE);
        }
        Verdict::Exclude(exclusion_reason::AGENTDIFFIGNORE)
    }

    /// What to do with `rel` inside a git directory: as [`Rules::verdict`] without the ignore
    /// file, whose rules never hide git metadata (git runs code from it).
    pub(crate) fn verdict_unignored(&self, rel: &str, name: &str, is_dir: bool) -> Verdict {
        match self.verdict(rel, name, is_dir, false) {
            Verdict::Exclude(exclusion_reason::AGENTDIFFIGNORE)
            | Verdict::Search(exclusion_reason::AGENTDIFFIGNORE) => Verdict::Scan,
            v => v,
        }
    }

    /// Whether a deny or include glob could name a path below directory `rel`: its literal
    /// leading segments agree with `rel` as far as both go, and it is not a literal path that
    /// ends at or above `rel`.
    fn may_hold_named(&self, rel: &str) -> bool {
        let segs: Vec<&str> = rel.split('/').collect();
        self.prefixes.iter().any(|(lit, whole)| {
            if *whole && lit.len() <= segs.len() {
                return false;
            }
            let n = lit.len().min(segs.len());
            lit[..n].iter().zip(&segs[..n]).all(|(a, b)| a == b)
        })
    }

    /// A default-excluded directory is re-included when a deny glob's literal leading segments and
    /// the directory's path are prefix-comparable: `node_modules/evil/**` re-includes `node_modules`
    /// (on the way) and `node_modules/evil/target` (below the named path).
    fn reincluded(&self, rel: &str) -> bool {
        let segs: Vec<&str> = rel.split('/').collect();
        self.reinclude.iter().any(|lit| {
            let n = lit.len().min(segs.len());
            lit[..n].iter().zip(&segs[..n]).all(|(a, b)| a == b)
        })
    }
}

/// A nested repository's control directory (`sub/.git`): not excluded by default, because Git
/// executes what it holds (hooks, `core.fsmonitor` and other commands in `config`) when the user
/// runs Git there, so a change to it must be seen. Its object store is excluded instead.
fn nested_git(rel: &str, name: &str) -> bool {
    name == ".git" && rel != ".git"
}

/// The object store of a nested repository's control directory (`sub/.git/objects`): content
/// addressed and often large; Git runs nothing from it.
fn nested_git_objects(rel: &str) -> bool {
    rel.strip_suffix("/.git/objects")
        .is_some_and(|parent| !parent.is_empty())
}

/// The segments of `glob` before the first one containing a glob metacharacter.
pub(crate) fn literal_prefix(glob: &str) -> Vec<String> {
    let trimmed = glob.trim();
    let trimmed = trimmed.strip_prefix("./").unwrap_or(trimmed);
    let trimmed = trimmed.trim_start_matches('/');
    let mut out = Vec::new();
    for seg in trimmed.split('/') {
        if seg.is_empty() || seg == "." {
            continue;
        }
        if seg == ".."
            || seg
                .chars()
                .any(|c| matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\' | '!'))
        {
            break;
        }
        out.push(seg.to_string());
    }
    out
}

/// Parses the bytes of `.agentdiffignore` into lines (must be UTF-8 and bounded).
pub(crate) fn parse_ignore_file(bytes: &[u8]) -> Result<Vec<String>, ScanError> {
    if bytes.len() > MAX_IGNORE_FILE_BYTES {
        return Err(ScanError::IgnoreFile(format!(
            "larger than {MAX_IGNORE_FILE_BYTES} bytes; shorten it"
        )));
    }
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ScanError::IgnoreFile(format!("not valid UTF-8 ({e}); save it as UTF-8")))?;
    Ok(text.lines().map(str::to_string).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(lines: &[&str], reinclude: &[&str]) -> Rules {
        let lines: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
        let re: Vec<String> = reinclude.iter().map(|s| s.to_string()).collect();
        Rules::new(Path::new("/r"), &lines, &re).unwrap()
    }

    #[test]
    fn literal_prefix_stops_at_first_wildcard() {
        assert_eq!(literal_prefix(".git/**"), vec![".git"]);
        assert_eq!(
            literal_prefix("./node_modules/evil/**"),
            vec!["node_modules", "evil"]
        );
        assert_eq!(literal_prefix("/a/b/c.txt"), vec!["a", "b", "c.txt"]);
        assert!(literal_prefix("**/*.key").is_empty());
        assert!(literal_prefix("*/target").is_empty());
        assert_eq!(literal_prefix("a/../b"), vec!["a"]);
    }

    #[test]
    fn a_nested_git_directory_is_scanned_but_its_objects_are_not() {
        let r = rules(&[], &[]);
        assert_eq!(r.excluded(".git", ".git", true), Some("default_generated"));
        assert_eq!(r.excluded("sub/.git", ".git", true), None);
        assert_eq!(r.excluded("a/b/.git", ".git", true), None);
        assert_eq!(r.excluded("sub/.git/hooks", "hooks", true), None);
        assert_eq!(
            r.excluded("sub/.git/objects", "objects", true),
            Some("default_generated")
        );
        // A file named `.git` (a submodule's gitfile) and the root's objects keep their rules.
        assert_eq!(r.excluded("sub/.git", ".git", false), None);
        let root_git = rules(&[], &[".git/**"]);
        assert_eq!(root_git.excluded(".git/objects", "objects", true), None);
        // Inside a default-excluded directory nothing is walked, nested `.git` included.
        assert_eq!(
            r.excluded("node_modules", "node_modules", true),
            Some("default_generated")
        );
    }

    #[test]
    fn store_is_excluded_even_when_named_by_a_deny_glob() {
        let r = rules(&[], &[".agentdiff/**"]);
        assert_eq!(
            r.excluded(".agentdiff", ".agentdiff", true),
            Some("agentdiff_store")
        );
        // Only the root-level store; a nested `.agentdiff` is ordinary content.
        assert_eq!(r.excluded("sub/.agentdiff", ".agentdiff", true), None);
    }

    #[test]
    fn default_dirs_excluded_at_any_depth_but_not_files() {
        let r = rules(&[], &[]);
        assert_eq!(
            r.excluded("node_modules", "node_modules", true),
            Some("default_generated")
        );
        assert_eq!(
            r.excluded("a/b/target", "target", true),
            Some("default_generated")
        );
        assert_eq!(r.excluded("build", "build", false), None);
        assert_eq!(r.excluded("src", "src", true), None);
    }

    #[test]
    fn deny_globs_reinclude_named_default_dirs_only() {
        let r = rules(
            &[],
            &[".git/**", "node_modules/evil/**", "**/*.key", "*/target/x"],
        );
        assert_eq!(r.excluded(".git", ".git", true), None);
        assert_eq!(r.excluded("node_modules", "node_modules", true), None);
        assert_eq!(r.excluded("node_modules/evil/target", "target", true), None);
        assert_eq!(
            r.excluded("node_modules/other/node_modules", "node_modules", true),
            Some("default_generated")
        );
        assert_eq!(
            r.excluded("sub/.venv", ".venv", true),
            Some("default_generated")
        );
        assert_eq!(
            r.excluded("target", "target", true),
            Some("default_generated")
        );
        let r = rules(&[], &[".git/config"]);
        assert_eq!(r.excluded(".git", ".git", true), None);
    }

    #[test]
    fn agentdiffignore_git_semantics_with_negation() {
        let r = rules(&["*.log", "!keep.log", "tmp/", "# comment"], &[]);
        assert_eq!(r.excluded("a.log", "a.log", false), Some("agentdiffignore"));
        assert_eq!(
            r.excluded("d/a.log", "a.log", false),
            Some("agentdiffignore")
        );
        assert_eq!(r.excluded("keep.log", "keep.log", false), None);
        assert_eq!(r.excluded("tmp", "tmp", true), Some("agentdiffignore"));
        // `tmp/` matches directories only.
        assert_eq!(r.excluded("tmp", "tmp", false), None);
    }

    #[test]
    fn ignore_file_cannot_hide_itself() {
        let r = rules(&["*", ".agentdiffignore"], &[]);
        assert_eq!(
            r.excluded(".agentdiffignore", ".agentdiffignore", false),
            None
        );
        assert_eq!(r.excluded("x", "x", false), Some("agentdiffignore"));
    }

    /// The compiled deny globs are kept for the next scan of the same list only: rules built
    /// one after the other from different lists each name their own paths.
    #[test]
    fn each_list_of_deny_globs_names_its_own_paths() {
        let secret = |r: &Rules| r.verdict("secret.crt", "secret.crt", false, true);
        let key = |r: &Rules| r.verdict("id.p12", "id.p12", false, true);
        let crt = rules(&["*"], &["*.crt"]);
        assert_eq!(secret(&crt), Verdict::Scan);
        assert_eq!(key(&crt), Verdict::Exclude("agentdiffignore"));
        let keys = rules(&["*"], &["*.p12"]);
        assert_eq!(secret(&keys), Verdict::Exclude("agentdiffignore"));
        assert_eq!(key(&keys), Verdict::Scan);
        let again = rules(&["*"], &["*.crt"]);
        assert_eq!(secret(&again), Verdict::Scan);
        assert_eq!(key(&again), Verdict::Exclude("agentdiffignore"));
        let none = rules(&["*"], &[]);
        assert_eq!(secret(&none), Verdict::Exclude("agentdiffignore"));
    }

    #[test]
    fn an_ignore_rule_never_hides_a_path_a_deny_glob_names() {
        let r = rules(
            &["*", "!keep"],
            &[".env", "**/*.pem", "config/secrets/**", "docs/a.txt"],
        );
        let v = |rel: &str, is_dir: bool, inside: bool| {
            let name = rel.rsplit('/').next().unwrap();
            r.verdict(rel, name, is_dir, inside)
        };
        assert_eq!(v(".env", false, false), Verdict::Scan);
        assert_eq!(
            v("x.txt", false, false),
            Verdict::Exclude("agentdiffignore")
        );
        // An ignored directory is searched for named paths at every depth.
        assert_eq!(v("a", true, false), Verdict::Search("agentdiffignore"));
        assert_eq!(v("a/b", true, true), Verdict::Search("agentdiffignore"));
        assert_eq!(v("a/b/c.pem", false, true), Verdict::Scan);
        assert_eq!(
            v("a/b/c.txt", false, true),
            Verdict::Exclude("agentdiffignore")
        );
        assert_eq!(v("config/secrets", true, true), Verdict::Scan);
        assert_eq!(v("config/secrets/k", false, true), Verdict::Scan);
        // A literal deny path ends where it ends: nothing below docs/a.txt can match.
        let r = rules(&["docs/", "other/"], &["docs/a.txt"]);
        assert_eq!(
            r.verdict("docs", "docs", true, false),
            Verdict::Search("agentdiffignore")
        );
        assert_eq!(r.verdict("docs/a.txt", "a.txt", false, true), Verdict::Scan);
        assert_eq!(
            r.verdict("docs/b.txt", "b.txt", false, true),
            Verdict::Exclude("agentdiffignore")
        );
        // Protected paths may be at any depth, so every ignored directory is searched for them.
        assert_eq!(
            r.verdict("other", "other", true, false),
            Verdict::Search("agentdiffignore")
        );
        assert_eq!(
            r.verdict("other/x.txt", "x.txt", false, true),
            Verdict::Exclude("agentdiffignore")
        );
    }

    /// With no deny glob at all (a policy that names none, or a scan without a policy), an
    /// ignore-everything file still hides no protected path.
    #[test]
    fn an_ignore_rule_never_hides_a_protected_path_whatever_the_policy() {
        let r = rules(&["*", "**/.git/", ".env*", "agentdiff.yaml"], &[]);
        let v = |rel: &str, is_dir: bool, inside: bool| {
            let name = rel.rsplit('/').next().unwrap();
            r.verdict(rel, name, is_dir, inside)
        };
        for (rel, inside) in [
            ("src/.git/config", true),
            ("src/.git/hooks/pre-commit", true),
            (".env", false),
            ("web/.env.local", true),
            ("web/.envrc", true),
            ("agentdiff.yaml", false),
            ("sub/agentdiff.yaml", true),
            ("sub/.agentdiffignore", true),
            (".claude/settings.json", true),
            (".claude/settings.local.json", true),
            ("a/id.key", true),
            ("a/cert.pem", true),
        ] {
            assert_eq!(v(rel, false, inside), Verdict::Scan, "{rel}");
        }
        assert_eq!(v("src/.git", true, true), Verdict::Scan);
        assert_eq!(v("src", true, false), Verdict::Search("agentdiffignore"));
        assert_eq!(
            v("src/m.py", false, true),
            Verdict::Exclude("agentdiffignore")
        );
        // Inside a directory with git's layout the ignore file does not apply at all.
        assert_eq!(
            r.verdict_unignored("docs/tools/config", "config", false),
            Verdict::Scan
        );
    }

    #[test]
    fn invalid_ignore_file_is_an_error() {
        assert!(parse_ignore_file(b"\xff\xfe").is_err());
        assert_eq!(parse_ignore_file(b"a\nb\r\n").unwrap(), vec!["a", "b"]);
    }
}
