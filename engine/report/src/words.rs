//! The words every surface uses for a decision, a change and a cleanup outcome, defined once so
//! the terminal, markdown and HTML reports cannot drift apart. Surfaces may emphasise a word
//! (bold, upper case) but never reword it.

use agentdiff_backend_api::CleanupOutcome;
use agentdiff_policy::Action;
use agentdiff_scan::{ChangeType, EntryKind};
use agentdiff_store::schema::ChangeRecord;
use agentdiff_store::Verdict;

/// `allow`, `review` or `deny`.
pub fn action_word(a: Action) -> &'static str {
    match a {
        Action::Allow => "allow",
        Action::Review => "review",
        Action::Deny => "deny",
    }
}

/// The kind of change in one word: `added`, `modified`, `mode change` or `deleted` (the values
/// the HTML report filters on).
pub fn change_word(c: &ChangeRecord) -> &'static str {
    match c.change_type {
        ChangeType::Created => "added",
        ChangeType::Modified if c.mode_changed && !c.content_changed => "mode change",
        ChangeType::Modified => "modified",
        ChangeType::Deleted => "deleted",
    }
}

/// [`change_word`] with what it leaves out: ` + mode` when the content and the mode changed, and
/// the entry kind when it is not a file (`modified (symlink)`).
pub fn change_text(c: &ChangeRecord) -> String {
    let mut word = change_word(c).to_string();
    if c.change_type == ChangeType::Modified && c.mode_changed && c.content_changed {
        word.push_str(" + mode");
    }
    match c.entry_kind {
        EntryKind::Symlink => word.push_str(" (symlink)"),
        EntryKind::Directory => word.push_str(" (directory)"),
        EntryKind::File => {}
    }
    word
}

/// What cleanup did to a process that was still running after the command ended.
pub fn cleanup_word(o: CleanupOutcome) -> &'static str {
    match o {
        CleanupOutcome::AlreadyExited => "already exited",
        CleanupOutcome::Terminated => "terminated",
        CleanupOutcome::Killed => "killed",
        CleanupOutcome::PidReused => "pid reused, not signalled",
        CleanupOutcome::AccessDenied => "access denied",
        CleanupOutcome::Escaped => "still running",
    }
}

/// Whether a cleanup outcome is an alarm a surface should emphasise (the process escaped).
pub fn cleanup_alarm(o: CleanupOutcome) -> bool {
    o == CleanupOutcome::Escaped
}

/// The seal verdict in a word or two, as `agentdiff verify` concluded it.
pub fn verdict_word(v: Verdict) -> &'static str {
    match v {
        Verdict::Authenticated => "authenticated",
        Verdict::IntactNotAuthenticated => "intact, not authenticated",
        Verdict::Forged => "FORGED",
        Verdict::Unsealed => "unsealed",
    }
}

/// What the verdict means for the report it heads.
pub fn verdict_meaning(v: Verdict) -> &'static str {
    match v {
        Verdict::Authenticated => {
            "every artifact and object matches the seal, and the seal's MAC checks under this \
             user's key"
        }
        Verdict::IntactNotAuthenticated => {
            "everything matches the seal, but the seal could not be authenticated here: anyone \
             able to rewrite the whole capsule could have made it"
        }
        Verdict::Forged => "something does not match the seal: do not trust this report",
        Verdict::Unsealed => {
            "the run never finished (interrupted, or still running): nothing can be verified"
        }
    }
}
