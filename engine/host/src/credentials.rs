//! The one list of credential locations every control protects: the srt settings derived from
//! the policy deny reading them, the bwrap sandbox hides them, and the pre-tool-use hook's default
//! `filesystem.deny_read` denies them to reading tools. Keeping one list means a location added
//! for one control is not silently missing from another.
//!
//! Not defended: a secret stored anywhere else (a project file other than `.env*`, a custom
//! path, another program's config) is not on the list; `hide` options and `deny_read` extend it.

/// Credential locations below a home directory. A directory entry covers everything below it.
pub const HOME_CREDENTIAL_LOCATIONS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".config/gh",
    ".config/hub",
    ".kube",
    ".docker",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".npmrc",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".terraform.d/credentials.tfrc.json",
    ".vault-token",
];

/// Secret files inside the project (patterns relative to the project root); only the hook
/// judges these, since a sandbox must let the command read its own project. Git's config often
/// holds a token in a remote URL (`https://user:token@host/…`) or an `extraheader`; the other
/// files are the token-bearing tool configs a project may carry next to its code. Patterns are
/// anchored at the root: a `**/` pattern could match below every directory, so no content search
/// (Grep) anywhere could be allowed.
pub const PROJECT_SECRET_PATTERNS: &[&str] = &[
    ".env",
    ".env.*",
    ".git/config",
    ".git/config.worktree",
    ".git/modules/**/config",
    ".git/worktrees/*/config.worktree",
    ".git/credentials",
    ".git-credentials",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".docker/config.json",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_are_relative_and_unique() {
        for (i, l) in HOME_CREDENTIAL_LOCATIONS.iter().enumerate() {
            assert!(
                !l.starts_with('/') && !l.starts_with('~') && !l.contains(".."),
                "{l}"
            );
            assert!(!HOME_CREDENTIAL_LOCATIONS[..i].contains(l), "{l} twice");
        }
    }
}
