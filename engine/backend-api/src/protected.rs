//! What a sandboxing backend keeps read-only below the project root besides the evidence store
//! and the repository metadata: the configuration that decides later runs and sessions. A
//! command that could write it would change how its own successors are judged (weaken
//! `agentdiff.yaml`, or write `.claude/settings.local.json` with `"disableAllHooks": true`)
//! and have that decided only after the run.
//!
//! Each backend protects the entries that exist at the launch (bwrap binds them read-only, srt's
//! derived settings deny writing them); what does not exist yet gets no placeholder, so a
//! command may create it and it is decided after the run (the built-in policy denies the policy
//! and ignore files).

/// Root-relative paths and why each is protected.
pub const PROTECTED_CONFIGURATION: [(&str, &str); 5] = [
    ("agentdiff.yaml", "agentdiff policy"),
    // Misnamed policies: the loader refuses a run while one is there.
    ("agentdiff.yml", "agentdiff policy"),
    ("agentdiff.json", "agentdiff policy"),
    (".agentdiffignore", "agentdiff ignore rules"),
    (".claude", "Claude Code project settings (hooks)"),
];
