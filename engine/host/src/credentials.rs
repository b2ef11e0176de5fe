//! The one list of credential locations every control protects (below each home, and the
//! system's own): the srt settings derived from the policy deny reading them, the bwrap sandbox
//! hides them, and the pre-tool-use hook's default `filesystem.deny_read` denies them to reading
//! tools. Keeping one list means a location added
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

/// Credential locations of the system itself (absolute paths): password hashes, host and TLS
/// private keys, Kerberos keytabs, stored network passwords, cluster credentials. Their modes
/// keep them from other users, but a command agentdiff runs as root reads them; the controls
/// treat them as the home locations are treated. A directory entry covers everything below it.
pub const SYSTEM_CREDENTIAL_LOCATIONS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/krb5.keytab",
    "/etc/NetworkManager/system-connections",
    "/etc/wpa_supplicant",
    "/etc/kubernetes",
    "/var/lib/kubelet/pki",
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
        for (i, l) in SYSTEM_CREDENTIAL_LOCATIONS.iter().enumerate() {
            assert!(
                l.starts_with('/') && !l.contains("..") && !l.ends_with('/'),
                "{l}"
            );
            assert!(!SYSTEM_CREDENTIAL_LOCATIONS[..i].contains(l), "{l} twice");
        }
    }
}
