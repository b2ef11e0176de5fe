//! The built-in policy (used when the project has no policy file) and the starter written by
//! `agentdiff policy init`.

use super::decide::Action;
use super::schema::{
    EnvironmentSettings, Limits, NetworkMode, ObserveSettings, RollbackSettings, RuntimeSettings,
    SectionSpec, Spec, Weights,
};

/// Paths the built-in policy denies: environment files, Git control data, SSH material, keys.
pub const BUILTIN_DENY: [&str; 6] = [
    ".env", ".env.*", ".git/**", ".ssh/**", "**/*.key", "**/*.pem",
];

/// Conservative defaults: credentials and Git data denied, every other write reviewed, command
/// launch allowed.
pub(crate) fn spec() -> Spec {
    Spec {
        version: 1,
        filesystem: SectionSpec {
            allow: Vec::new(),
            review: Vec::new(),
            deny: BUILTIN_DENY.iter().map(|p| (*p).to_owned()).collect(),
            default: Action::Review,
        },
        process: SectionSpec {
            allow: Vec::new(),
            review: Vec::new(),
            deny: Vec::new(),
            default: Action::Allow,
        },
        network_mode: NetworkMode::Observe,
        limits: Limits::default(),
        rollback: RollbackSettings::default(),
        weights: Weights::default(),
        environment: EnvironmentSettings::default(),
        runtime: RuntimeSettings::default(),
        observe: ObserveSettings::default(),
        deny_read: None,
    }
}

/// The commented starter policy (valid version 1).
pub const STARTER: &str = r#"# agentdiff mutation policy (schema version 1).
# Reference: docs/policy.md. Check it with `agentdiff policy validate`
# and try a path with `agentdiff policy explain PATH`.
#
# Precedence is fixed, whatever the order below: deny > review > allow_write > default.
# Paths are project-relative with `/` separators. `*` and `?` stay within one path segment,
# `**` spans any number of segments, and `dir/**` also matches `dir` itself.
version: 1

filesystem:
  # Writes the task needs. Keep this as small as the task allows.
  allow_write:
    - src/**
    - tests/**
  # Changes a person should look at.
  review:
    - docs/**
    - Cargo.toml
    - package.json
  # Never acceptable: credentials, keys, version-control data.
  deny:
    - .env
    - .env.*
    - .git/**
    - .ssh/**
    - "**/*.pem"
    - "**/*.key"
  # Everything else.
  default: review

process:
  # Rules match the executable basename of the launched command (argv[0]), never a shell string.
  allow: []
  review: []
  deny: []
  default: allow

network:
  # observe: compare listening endpoints before and after. "off": skip that observation.
  # Neither mode blocks network access. Keep "off" quoted.
  mode: observe

limits:
  # Exceeding a limit is a review finding that adds to the blast-radius score.
  files_changed: 40
  files_deleted: 10
  processes_spawned: 16
  duration_seconds: 1800

rollback:
  enabled: true
  max_backup_file_mb: 10

scoring:
  # Override individual blast-radius weights (non-negative integers); others keep defaults.
  weights:
    sensitive_path: 35
"#;
