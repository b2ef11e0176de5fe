//! Compiled pattern sections with provenance.
//!
//! Globs are segment-aware: `*`, `?` and classes never match `/`, `**` spans zero or more whole
//! segments. A pattern ending in `/**` also matches the directory itself (`src/**` matches
//! `src`), so that deleting, replacing or creating the directory is decided by the same rule as
//! its contents (docs/policy.md explains why).

use globset::{Candidate, GlobBuilder, GlobSet, GlobSetBuilder};

/// One section (e.g. `filesystem.deny`) compiled into a single [`GlobSet`].
#[derive(Debug, Clone)]
pub struct RuleSet {
    section: &'static str,
    patterns: Vec<String>,
    set: GlobSet,
    /// For each glob in `set`, the index of the pattern it came from.
    owner: Vec<usize>,
}

impl RuleSet {
    /// Compile the patterns of one section. Errors name the failing rule (`section[i]`).
    pub fn compile(
        section: &'static str,
        patterns: Vec<String>,
        directory_itself: bool,
    ) -> Result<RuleSet, Vec<String>> {
        let mut builder = GlobSetBuilder::new();
        let mut owner = Vec::new();
        let mut problems = Vec::new();
        for (index, pattern) in patterns.iter().enumerate() {
            let mut variants = vec![pattern.as_str()];
            if directory_itself {
                if let Some(dir) = pattern.strip_suffix("/**") {
                    if !dir.is_empty() {
                        variants.push(dir);
                    }
                }
            }
            for variant in variants {
                match GlobBuilder::new(variant)
                    .literal_separator(true)
                    .backslash_escape(false)
                    .build()
                {
                    Ok(glob) => {
                        builder.add(glob);
                        owner.push(index);
                    }
                    Err(err) => {
                        problems.push(format!(
                            "{section}[{index}]: invalid glob {pattern:?}: {}",
                            err.kind()
                        ));
                        break;
                    }
                }
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let set = builder
            .build()
            .map_err(|err| vec![format!("{section}: cannot compile patterns: {err}")])?;
        Ok(RuleSet {
            section,
            patterns,
            set,
            owner,
        })
    }

    /// A section without patterns.
    pub(crate) fn empty(section: &'static str) -> RuleSet {
        RuleSet {
            section,
            patterns: Vec::new(),
            set: GlobSet::empty(),
            owner: Vec::new(),
        }
    }

    /// The lowest pattern index matching the candidate, if any. The cheap `is_match` check runs
    /// first so the common no-match case allocates nothing.
    pub fn first_match(&self, candidate: &Candidate<'_>) -> Option<usize> {
        if !self.set.is_match_candidate(candidate) {
            return None;
        }
        self.set
            .matches_candidate(candidate)
            .into_iter()
            .filter_map(|glob| self.owner.get(glob).copied())
            .min()
    }

    pub(crate) fn section(&self) -> &'static str {
        self.section
    }

    pub(crate) fn pattern(&self, index: usize) -> &str {
        self.patterns.get(index).map_or("", String::as_str)
    }

    pub(crate) fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(patterns: &[&str]) -> RuleSet {
        RuleSet::compile(
            "filesystem.deny",
            patterns.iter().map(|p| (*p).to_owned()).collect(),
            true,
        )
        .unwrap()
    }

    fn first(set: &RuleSet, path: &str) -> Option<usize> {
        set.first_match(&Candidate::from_bytes(path.as_bytes()))
    }

    #[test]
    fn star_and_question_never_cross_a_separator() {
        let s = set(&["src/*.rs", "a?c"]);
        assert_eq!(first(&s, "src/main.rs"), Some(0));
        assert_eq!(first(&s, "src/sub/main.rs"), None);
        assert_eq!(first(&s, "abc"), Some(1));
        assert_eq!(first(&s, "a/c"), None);
    }

    #[test]
    fn double_star_spans_zero_or_more_segments() {
        let s = set(&["**/*.pem", "docs/**/index.md"]);
        assert_eq!(first(&s, "key.pem"), Some(0));
        assert_eq!(first(&s, "a/b/c/key.pem"), Some(0));
        assert_eq!(first(&s, "docs/index.md"), Some(1));
        assert_eq!(first(&s, "docs/a/b/index.md"), Some(1));
        assert_eq!(first(&s, "docsx/index.md"), None);
    }

    #[test]
    fn trailing_double_star_matches_the_directory_itself() {
        let s = set(&["src/**"]);
        assert_eq!(first(&s, "src"), Some(0));
        assert_eq!(first(&s, "src/a"), Some(0));
        assert_eq!(first(&s, "src/a/b"), Some(0));
        assert_eq!(first(&s, "srcx"), None);
        assert_eq!(first(&s, "other/src"), None);
    }

    #[test]
    fn classes_and_alternatives() {
        let s = set(&["a[!x]b", "{docs,site}/*.md", "k[0-9]"]);
        assert_eq!(first(&s, "ayb"), Some(0));
        assert_eq!(first(&s, "axb"), None);
        assert_eq!(first(&s, "a/b"), None);
        assert_eq!(first(&s, "site/a.md"), Some(1));
        assert_eq!(first(&s, "k7"), Some(2));
    }

    #[test]
    fn star_matches_dotfiles() {
        let s = set(&["**/*.key"]);
        assert_eq!(first(&s, ".ssh/.id.key"), Some(0));
    }

    #[test]
    fn lowest_index_is_reported() {
        let s = set(&["*.md", "**", "README.md"]);
        assert_eq!(first(&s, "README.md"), Some(0));
        assert_eq!(first(&s, "x/y"), Some(1));
    }

    #[test]
    fn invalid_glob_names_its_rule() {
        let err = RuleSet::compile("filesystem.review", vec!["a[".to_owned()], true).unwrap_err();
        assert!(err[0].starts_with("filesystem.review[0]"), "{err:?}");
    }
}
