//! Exit codes of `agentdiff` (documented in docs/cli.md). agentdiff's own outcomes use codes
//! outside the range most commands use, so a child's own exit code can be passed through unchanged.

use std::fmt;

/// Usage error: bad flags or arguments.
pub const USAGE: u8 = 64;
/// Invalid policy or configuration file.
pub const INVALID_CONFIG: u8 = 65;
/// The named run does not exist or its id is invalid.
pub const NO_SUCH_RUN: u8 = 66;
/// A capsule failed verification (corrupt, tampered, unsealed).
pub const INVALID_CAPSULE: u8 = 67;
/// Rollback or promote preserved at least one conflicting path, or could not restore one.
pub const CONFLICT: u8 = 68;
/// The requested runtime backend cannot run here (fail closed; nothing was launched).
pub const BACKEND_UNAVAILABLE: u8 = 69;
/// agentdiff itself failed.
pub const INTERNAL: u8 = 70;
/// The gate failed on denied findings (`--fail-on deny` or `review`).
pub const GATE_DENIED: u8 = 71;
/// The gate failed on review findings (`--fail-on review`).
pub const GATE_REVIEW: u8 = 72;
/// Command policy blocked the launch.
pub const BLOCKED: u8 = 73;
/// `agentdiff conformance`: at least one MUST check failed.
pub const CONFORMANCE_FAILED: u8 = 74;
/// Another agentdiff holds the project lock (`run`, `rollback`, `promote`; see `--wait`).
pub const BUSY: u8 = 75;
/// `run --summary-file`: the run succeeded but its report could not be appended (the run is
/// recorded and sealed).
pub const SUMMARY_NOT_WRITTEN: u8 = 76;
/// `agentdiff verify`: the capsule is intact but could not be authenticated here (no key for
/// this user, another user's or machine's key, or an older seal format).
pub const UNAUTHENTICATED: u8 = 77;
/// The run's deadline expired (as timeout(1)).
pub const TIMED_OUT: u8 = 124;
/// `run`: the command could not be launched (not found or not executable), as a shell says.
pub const LAUNCH_FAILED: u8 = 127;
/// `run`: killed by (or agentdiff interrupted by) signal N exits `SIGNALLED + N`.
pub const SIGNALLED: u8 = 128;

/// Every fixed code agentdiff itself ends with, as documented in docs/cli.md's table (the
/// hook's own code lives with the hook).
#[cfg(test)]
const ALL: &[u8] = &[
    USAGE,
    INVALID_CONFIG,
    NO_SUCH_RUN,
    INVALID_CAPSULE,
    CONFLICT,
    BACKEND_UNAVAILABLE,
    INTERNAL,
    GATE_DENIED,
    GATE_REVIEW,
    BLOCKED,
    CONFORMANCE_FAILED,
    BUSY,
    SUMMARY_NOT_WRITTEN,
    UNAUTHENTICATED,
    TIMED_OUT,
    LAUNCH_FAILED,
    HOOK_BLOCK,
];

/// Exit code of a failed hook: Claude Code treats exit 2 from a PreToolUse hook as "block this
/// call" and shows stderr to the agent; every other non-zero code lets the call run.
pub const HOOK_BLOCK: u8 = 2;

/// Exit code of a command killed by signal `sig` (clamped so it stays a valid code).
pub fn signalled(sig: i32) -> u8 {
    SIGNALLED.saturating_add(sig.clamp(0, 127) as u8)
}

/// An error that carries the exit code it should end the program with.
#[derive(Debug)]
pub struct Coded {
    pub code: u8,
    pub error: anyhow::Error,
}

impl fmt::Display for Coded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&chain_text(&self.error))
    }
}

/// An error and its causes as `outer: inner: …`. A cause whose text the message before it already
/// ends with is left out: many messages embed their source (`cannot read X: {source}`), and
/// printing it twice reads like two failures. Only a trailing repeat is dropped, so a distinct
/// cause that merely appears inside an earlier message is still printed.
pub fn chain_text(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.is_empty() {
            text = part;
        } else if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
    }
    text
}

impl std::error::Error for Coded {}

/// Wrap an error with the exit code it must produce.
pub fn with_code(code: u8, error: impl Into<anyhow::Error>) -> anyhow::Error {
    anyhow::Error::new(Coded {
        code,
        error: error.into(),
    })
}

/// The exit code for an error: the innermost [`Coded`] wins; anything else is internal.
pub fn code_of(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(|e| e.downcast_ref::<Coded>())
        .map(|c| c.code)
        .unwrap_or(INTERNAL)
}

/// One-line rendering of an error and its causes, with control characters escaped.
pub fn render(err: &anyhow::Error) -> String {
    agentdiff_host::redact::escape_terminal(&chain_text(err))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error whose message embeds its source, as many library errors do.
    #[derive(Debug)]
    struct Embeds {
        source: std::io::Error,
    }

    impl fmt::Display for Embeds {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "cannot read policy file p.yaml: {}", self.source)
        }
    }

    impl std::error::Error for Embeds {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.source)
        }
    }

    /// A cause the message already embeds is printed once; other causes still follow.
    #[test]
    fn causes_are_printed_once() {
        let io = || std::io::Error::new(std::io::ErrorKind::NotFound, "No such file");
        let err = anyhow::Error::new(Embeds { source: io() }).context("loading the policy");
        assert_eq!(
            render(&err),
            "loading the policy: cannot read policy file p.yaml: No such file"
        );
        let err = anyhow::Error::new(io()).context("reading p.yaml");
        assert_eq!(render(&err), "reading p.yaml: No such file");
        // A cause found inside (not at the end of) an earlier message is its own failure.
        let err = anyhow::Error::new(io()).context("No such file name given; reading p.yaml");
        assert_eq!(
            render(&err),
            "No such file name given; reading p.yaml: No such file"
        );
        let coded = with_code(65, anyhow::Error::new(Embeds { source: io() }));
        assert_eq!(
            render(&coded),
            "cannot read policy file p.yaml: No such file"
        );
    }

    /// The table in docs/cli.md lists exactly the codes defined here: a code added, removed or
    /// renumbered on one side only fails this test.
    #[test]
    fn the_documented_table_matches_the_constants() {
        let doc = include_str!("../../../docs/cli.md");
        let table = doc
            .split("## Exit codes")
            .nth(1)
            .and_then(|t| t.split("\n## ").next())
            .unwrap();
        let mut documented: Vec<u8> = table
            .lines()
            .filter_map(|l| l.strip_prefix("| ")?.split(' ').next()?.parse().ok())
            .filter(|&c| c != 0)
            .collect();
        documented.sort_unstable();
        let mut defined = super::ALL.to_vec();
        defined.sort_unstable();
        assert_eq!(documented, defined);
        assert!(table.contains("| 128+N |"), "signal exits are documented");
    }
}
