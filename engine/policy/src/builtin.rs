//! The built-in policy (used when the project has no policy file) and the starter written by
//! `agentdiff policy init`.

use super::decide::{Action, Decision, Phase};
use super::egress::EgressSpec;
use super::schema::{
    CaptureSettings, EnvironmentSettings, Limits, NetworkMode, ObserveSettings, RollbackSettings,
    RuntimeSettings, SectionSpec, Spec, Weights,
};

/// Paths the built-in policy denies: environment files, Git control data (the root's, and a
/// nested repository's, which Git executes from when the user runs it there: hooks,
/// `core.fsmonitor`), SSH material, keys.
pub const BUILTIN_DENY: [&str; 7] = [
    ".env",
    ".env.*",
    ".git/**",
    "**/.git/**",
    ".ssh/**",
    "**/*.key",
    "**/*.pem",
];

/// The rule that decides changes to agentdiff's own configuration, in every policy.
pub const PROTECTED_CONFIG_RULE: &str = "builtin.protected_config";

/// Names that configure what agentdiff observes and decides: the policy file, the names `policy
/// load` refuses as misnamed policies (creating one makes later runs fail), and ignore files.
/// All are protected at any depth: a run started below a nested `agentdiff.yaml` takes its
/// directory as the project root and loads it as the policy.
const PROTECTED_ROOT_NAMES: [&str; 3] = ["agentdiff.yaml", "agentdiff.yml", "agentdiff.json"];
const PROTECTED_ANY_DEPTH: &str = ".agentdiffignore";
/// A run store; a nested one makes runs started below it take its directory as their root.
const STORE_NAME: &str = ".agentdiff";
/// Claude Code's project settings, where `agentdiff hook install` puts the hook that judges an
/// agent's calls: a call (or a sandboxed shell call) that rewrote them would unhook the sessions
/// that follow. Not `.claude/settings.local.json`: Claude Code itself writes a person's "don't
/// ask again" answers there, so a wrapped Claude Code would see its own writes denied.
const AGENT_HOOK_SETTINGS: [&str; 1] = [".claude/settings.json"];

/// A change to agentdiff's own configuration is denied, whatever the policy's patterns say: a run
/// that edits the policy or an ignore file would otherwise switch off observation or decisions
/// for every later run (a policy cannot allow it, because the policy is what is being changed).
/// `extra` holds further project-relative paths the policy in force was loaded from.
pub(crate) fn protected_config(
    subject: &str,
    extra: &[String],
    version: u32,
    phase: Phase,
) -> Option<Decision> {
    let name = subject.rsplit('/').next().unwrap_or(subject);
    let what = if PROTECTED_ROOT_NAMES.contains(&subject) {
        "a policy file"
    } else if PROTECTED_ROOT_NAMES.contains(&name) {
        "a policy file for runs started below it"
    } else if subject.split('/').any(|seg| seg == STORE_NAME) {
        "a run store for runs started below it"
    } else if name == PROTECTED_ANY_DEPTH {
        "an ignore file"
    } else if AGENT_HOOK_SETTINGS.contains(&subject) {
        "the agent hook's settings (Claude Code's, which run the hook)"
    } else if extra.iter().any(|p| p == subject) {
        "the policy file in force"
    } else {
        return None;
    };
    Some(Decision {
        action: Action::Deny,
        subject: subject.to_owned(),
        rule: PROTECTED_CONFIG_RULE.to_owned(),
        pattern: None,
        reason: format!(
            "path is {what} of agentdiff; changing it would change what later runs observe or \
             decide, so it is denied in every policy"
        ),
        policy_version: version,
        phase,
    })
}

/// The files agentdiff reads as configuration (and the agent hook's settings), as scanner globs that no ignore rule can hide.
/// Only the root ignore file is read, so a nested one is protected where it is observed but does
/// not force every ignored directory to be searched for it.
pub(crate) fn protected_globs() -> Vec<String> {
    let mut globs: Vec<String> = PROTECTED_ROOT_NAMES
        .iter()
        .map(|n| (*n).to_owned())
        .collect();
    globs.push(PROTECTED_ANY_DEPTH.to_owned());
    globs.extend(AGENT_HOOK_SETTINGS.iter().map(|n| (*n).to_owned()));
    globs
}

/// Paths no ignore rule (`.agentdiffignore`) can hide from a scan, whatever the policy: what the
/// built-in policy denies, git metadata at any depth (git runs code from it), agentdiff's own
/// configuration and ignore files at any depth, Claude Code's settings files (they run hooks) and
/// environment files (`.env`, `.envrc`: loaded or run by tools in that directory). Being observed
/// is not being denied: the policy still decides each change.
pub fn never_ignored() -> Vec<String> {
    let mut globs: Vec<String> = BUILTIN_DENY.iter().map(|g| (*g).to_owned()).collect();
    globs.extend(
        [
            "**/.git",
            "**/.env*",
            "**/.claude/settings*.json",
            "**/.agentdiffignore",
        ]
        .iter()
        .map(|g| (*g).to_owned()),
    );
    globs.extend(PROTECTED_ROOT_NAMES.iter().map(|n| format!("**/{n}")));
    globs
}

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
        egress: EgressSpec::default(),
        limits: Limits::default(),
        rollback: RollbackSettings::default(),
        capture: CaptureSettings::default(),
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
    - "**/.git/**"
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
