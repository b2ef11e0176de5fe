//! Path decisions, recoverability, limits and blast-radius counts for a run's changes.

use agentdiff_backend_api::RunEvidence;
use agentdiff_policy::score::{self, Counts, SCOPE_DRIFT_ALLOWANCE};
use agentdiff_policy::{Action, Decision, Phase, Policy};
use agentdiff_scan::{
    programs, BackupSkip, BackupState, Change, ChangeType, Entry, EntryKind, LinkNames, Manifest,
    UnsupportedChange,
};
use std::collections::BTreeMap;

use super::{ChangeRecord, EvidenceFinding, LimitViolation};

/// Decide every change and say whether rollback can undo it. A changed file with more than one
/// hard link is also decided as each of its other names (`links`, [`agentdiff_scan::LinkNames`]).
pub fn classify_changes(
    policy: &Policy,
    changes: &[Change],
    private_workspace: bool,
    git_dirs: &[String],
    links: &BTreeMap<String, LinkNames>,
) -> Vec<ChangeRecord> {
    changes
        .iter()
        .map(|c| {
            let own = decide_with_git_dirs(policy, &c.path, git_dirs);
            let decision = match links.get(&c.path) {
                Some(names) => decide_linked(policy, &c.path, names, git_dirs, own),
                None => own,
            };
            let (reversible, recovery_reason) = if private_workspace {
                (
                    false,
                    "made in a private workspace: the host tree was not changed; apply it with \
                     `agentdiff promote`"
                        .to_string(),
                )
            } else {
                recoverability(c)
            };
            ChangeRecord {
                path: c.path.clone(),
                change_type: c.change_type,
                entry_kind: c.entry_kind,
                content_changed: c.content_changed,
                mode_changed: c.mode_changed,
                decision: decision.action,
                policy_decision: decision,
                reversible,
                recovery_reason,
                sensitive: score::is_sensitive_path(&c.path),
                dependency: score::is_dependency_path(&c.path),
                before_sha256: c.before.as_ref().and_then(|e| e.sha256.clone()),
                after_sha256: c.after.as_ref().and_then(|e| e.sha256.clone()),
            }
        })
        .collect()
}

/// Where `path` lies in git metadata, as the same path below `ROOT/.git` would: below a git
/// directory or `.git` file found before the run (whatever its name: `--separate-git-dir`, a
/// worktree's or submodule's) or with git's layout in either scan, below any component named
/// `.git` (a pointer file the command planted), or under one of git's own names at a root that
/// has git's layout (`""`: the project made a bare repository). The entry itself stands for the repository's `HEAD`, which replacing it changes.
fn as_git_metadata(path: &str, git_dirs: &[String]) -> Option<String> {
    let below = |dir: &str| {
        if path == dir {
            Some(String::new())
        } else {
            path.strip_prefix(dir)
                .and_then(|r| r.strip_prefix('/'))
                .map(str::to_owned)
        }
    };
    // A root with git's layout (`""`) is a bare repository for git only through its own names.
    let in_root_repo = || {
        let first = path.split('/').next().unwrap_or(path);
        (git_dirs.iter().any(String::is_empty)
            && agentdiff_host::git_dirs::GIT_DIR_ENTRIES.contains(&first))
        .then(|| path.to_owned())
    };
    let rest = git_dirs
        .iter()
        .filter(|g| !g.is_empty())
        .find_map(|g| below(g))
        .or_else(|| {
            let mut parts = path.split('/');
            parts
                .position(|p| p == ".git")
                .map(|_| parts.collect::<Vec<_>>().join("/"))
        })
        .or_else(in_root_repo)?;
    Some(if rest.is_empty() {
        ".git/HEAD".to_owned()
    } else {
        format!(".git/{rest}")
    })
}

/// The policy's decision for `path`, and, when it is git metadata, the decision for its `.git`
/// equivalent: the strictest counts, so the built-in policy's `.git/**` denies a hook written to
/// a separate git directory as it denies one in `.git/hooks`.
pub(crate) fn decide_with_git_dirs(policy: &Policy, path: &str, git_dirs: &[String]) -> Decision {
    let own = decide(policy, path);
    let Some(equivalent) = as_git_metadata(path, git_dirs) else {
        return own;
    };
    let mut as_git = decide(policy, &equivalent);
    if as_git.action <= own.action {
        return own;
    }
    as_git.reason = format!("git metadata (decided as {equivalent}): {}", as_git.reason);
    as_git.subject = path.to_owned();
    as_git
}

/// The strictest of `own` and the decisions for a multiply-linked file's other names: writing
/// `src/alias` writes `.claude/settings.json` when they are the same file, and creating the link
/// made a second door to it. Links whose names are not all in the scanned tree (outside the root,
/// in an excluded directory) are at least a review: what else the file is is unknown.
fn decide_linked(
    policy: &Policy,
    path: &str,
    names: &LinkNames,
    git_dirs: &[String],
    own: Decision,
) -> Decision {
    let mut strictest = own;
    for other in &names.others {
        let mut d = decide_with_git_dirs(policy, other, git_dirs);
        if d.action > strictest.action {
            d.reason = format!(
                "`{path}` is a hard link to `{other}` (the same file), so writing it writes \
                 `{other}`: {}",
                d.reason
            );
            d.subject = path.to_owned();
            strictest = d;
        }
    }
    if !names.complete && Action::Review > strictest.action {
        let unknown = match names.unnamed() {
            0 => "an after tree could not be read, so not all of them are known".to_owned(),
            n => format!("{n} of them are outside the scanned tree"),
        };
        strictest = Decision {
            action: Action::Review,
            subject: path.to_owned(),
            rule: HARD_LINK_RULE.into(),
            pattern: None,
            reason: format!(
                "`{path}` has {} hard links and {unknown}: writing it writes a file the policy \
                 did not judge",
                names.nlink
            ),
            policy_version: policy.version(),
            phase: Phase::PostRun,
        };
    }
    strictest
}

/// The rule a multiply-linked change with unknown other names is reviewed under.
pub(crate) const HARD_LINK_RULE: &str = "run.hard_link";

fn decide(policy: &Policy, path: &str) -> Decision {
    match policy.decide_path(path, Phase::PostRun) {
        Ok(d) => d,
        // Scanner paths are already normalised; a path the policy cannot judge is treated as the
        // strictest outcome rather than waved through.
        Err(e) => Decision {
            action: Action::Deny,
            subject: path.to_string(),
            rule: "path_validation".into(),
            pattern: None,
            reason: format!("path could not be evaluated: {e}"),
            policy_version: policy.version(),
            phase: Phase::PostRun,
        },
    }
}

/// `uncaptured_denied` findings: an entry that could not be captured (a FIFO, socket or device,
/// a name that is not UTF-8) appeared, vanished or changed kind where the policy denies writes.
/// It is not a change record (there is no content to show or restore), but it must not turn a
/// denied path into a mere review: a hook planted as `.git/hooks/\xffx` or a key written as
/// `\xffid.pem` is denied like its readable twin.
///
/// The recorded path escapes undecodable bytes as `\xNN`, so it is decided as written, with each
/// escape read as U+FFFD (one unknown character, as the name really is), and through every
/// ancestor directory (which `dir/**` patterns match even when the name itself cannot be
/// judged); the strictest decision counts. A name no reading can judge stays a review warning.
pub fn classify_uncaptured(policy: &Policy, changes: &[UnsupportedChange]) -> Vec<EvidenceFinding> {
    changes
        .iter()
        .filter_map(|u| {
            let d = uncaptured_readings(&u.path)
                .iter()
                .filter_map(|p| policy.decide_path(p, Phase::PostRun).ok())
                .max_by_key(|d| d.action)?;
            (d.action == Action::Deny).then(|| EvidenceFinding {
                kind: "uncaptured_denied".into(),
                action: Action::Deny,
                detail: format!(
                    "{}: {} {} where the policy denies writes ({}); it could not be captured, \
                     so it cannot be shown or rolled back",
                    u.path,
                    u.after_kind
                        .as_deref()
                        .or(u.before_kind.as_deref())
                        .unwrap_or("entry"),
                    super::decide::change_word(u.change_type),
                    d.rule
                ),
                process: None,
                container: None,
            })
        })
        .collect()
}

/// Findings shown per program (or per git directory) before the rest are counted in one line.
const MAX_PROGRAM_FINDINGS: usize = 50;

/// Paths named in one git directory's finding before the rest are counted.
const MAX_GIT_PATHS_SHOWN: usize = 5;

/// `excluded_program` findings (review at least): a program appeared or changed below an excluded
/// path, which the scan lists but does not capture (see `agentdiff_scan::programs`). It is not a
/// change record (nothing was hashed or backed up, so it cannot be shown or rolled back), and it
/// can run later outside any sandbox: a plugin on `PATH`, an npm bin, a Python start-up hook.
/// A path the policy denies (a hook in an unnamed `.git`) is denied; anything else is a review.
/// Git metadata is one finding per git directory (its path first, then the paths that changed),
/// decided as git metadata: a repository planted in `node_modules/` is denied like one in `.git`.
/// Past [`MAX_PROGRAM_FINDINGS`] the rest are counted in one finding; the full list is in the
/// after-scan's manifest. `excluded_sweep_incomplete` (review): the after-sweep could not see
/// somewhere the before-sweep could, so a program there cannot be ruled out.
pub fn classify_programs(
    policy: &Policy,
    before: &Manifest,
    after: &Manifest,
    git_dirs: &[String],
) -> Vec<EvidenceFinding> {
    let (git, changed): (Vec<_>, Vec<_>) = programs::changed_programs(
        before.excluded_programs.as_ref(),
        after.excluded_programs.as_ref(),
    )
    .into_iter()
    .partition(|c| c.program.reason == programs::ProgramReason::GitMetadata);
    let mut out = git_metadata_findings(policy, &git, git_dirs);
    out.extend(
        changed
            .iter()
            .take(MAX_PROGRAM_FINDINGS)
            .map(|c| program_finding(policy, c, git_dirs)),
    );
    if changed.len() > MAX_PROGRAM_FINDINGS {
        let rest = &changed[MAX_PROGRAM_FINDINGS..];
        let action = rest
            .iter()
            .map(|c| decide_with_git_dirs(policy, &c.program.path, git_dirs).action)
            .fold(Action::Review, Action::strictest);
        out.push(program_finding_rest(
            action,
            format!("{} more new or changed programs", rest.len()),
        ));
    }
    for why in programs::newly_incomplete(
        before.excluded_programs.as_ref(),
        after.excluded_programs.as_ref(),
    ) {
        out.push(EvidenceFinding {
            kind: "excluded_sweep_incomplete".into(),
            action: Action::Review,
            detail: format!("excluded paths not fully swept for programs: {why}"),
            process: None,
            container: None,
        });
    }
    out
}

/// The finding of one program that appeared or changed below an excluded path.
fn program_finding(
    policy: &Policy,
    c: &programs::ProgramChange<'_>,
    git_dirs: &[String],
) -> EvidenceFinding {
    let p = c.program;
    let decided = decide_with_git_dirs(policy, &p.path, git_dirs);
    let verb = match c.change_type {
        programs::ProgramChangeType::Created => "new",
        programs::ProgramChangeType::Modified => "changed",
    };
    EvidenceFinding {
        kind: "excluded_program".into(),
        action: Action::strictest(Action::Review, decided.action),
        detail: format!(
            "{}: {verb} {} (mode {:o}) in an excluded directory: not captured or backed up, and \
             it may run later outside the sandbox{}",
            p.path,
            p.reason.describe(),
            p.mode,
            denied_words(&decided)
        ),
        process: None,
        container: None,
    }
}

/// The one finding that counts what was not listed one by one.
fn program_finding_rest(action: Action, what: String) -> EvidenceFinding {
    EvidenceFinding {
        kind: "excluded_program".into(),
        action,
        detail: format!(
            "{what} in excluded directories (listed in the after-scan's manifest, \
             `excluded_programs`)"
        ),
        process: None,
        container: None,
    }
}

fn denied_words(decided: &Decision) -> String {
    if decided.action == Action::Deny {
        format!("; the policy denies writes here ({})", decided.rule)
    } else {
        String::new()
    }
}

/// One finding per git directory below an excluded path in which git metadata appeared or
/// changed: the directory first, the paths after; the strictest decision of its paths counts.
fn git_metadata_findings(
    policy: &Policy,
    changed: &[programs::ProgramChange<'_>],
    git_dirs: &[String],
) -> Vec<EvidenceFinding> {
    let mut by_dir: std::collections::BTreeMap<String, Vec<&programs::ProgramChange<'_>>> =
        std::collections::BTreeMap::new();
    for c in changed {
        by_dir
            .entry(git_dir_of(&c.program.path, git_dirs))
            .or_default()
            .push(c);
    }
    let mut out = Vec::new();
    let mut rest = (0usize, Action::Review);
    for (i, (dir, changes)) in by_dir.iter().enumerate() {
        let decided = changes
            .iter()
            .map(|c| decide_with_git_dirs(policy, &c.program.path, git_dirs))
            .max_by_key(|d| d.action);
        let action = decided.as_ref().map_or(Action::Review, |d| {
            Action::strictest(Action::Review, d.action)
        });
        if i >= MAX_PROGRAM_FINDINGS {
            rest = (rest.0 + 1, Action::strictest(rest.1, action));
            continue;
        }
        let shown: Vec<String> = changes
            .iter()
            .take(MAX_GIT_PATHS_SHOWN)
            .map(|c| {
                let verb = match c.change_type {
                    programs::ProgramChangeType::Created => "new",
                    programs::ProgramChangeType::Modified => "changed",
                };
                format!("{verb} {}", c.program.path)
            })
            .collect();
        let more = changes.len().saturating_sub(MAX_GIT_PATHS_SHOWN);
        let more = if more > 0 {
            format!(", {more} more")
        } else {
            String::new()
        };
        out.push(EvidenceFinding {
            kind: "excluded_program".into(),
            action,
            detail: format!(
                "{}: git metadata created or changed in an excluded directory ({}{more}): not \
                 captured or backed up, and git runs code from it (hooks, core.fsmonitor, \
                 core.pager) when used there{}",
                dir,
                shown.join(", "),
                decided.as_ref().map(denied_words).unwrap_or_default()
            ),
            process: None,
            container: None,
        });
    }
    if rest.0 > 0 {
        let what = format!(
            "{} more git directories with new or changed metadata",
            rest.0
        );
        out.push(program_finding_rest(rest.1, what));
    }
    out
}

/// The git directory `path` is git metadata of: up to its first `.git` component, else the
/// deepest git directory it lies in (the path itself when none is known).
fn git_dir_of(path: &str, git_dirs: &[String]) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    if let Some(i) = parts.iter().position(|p| *p == ".git") {
        return parts[..=i].join("/");
    }
    git_dirs
        .iter()
        .filter(|d| {
            path == d.as_str()
                || path
                    .strip_prefix(d.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        })
        .max_by_key(|d| d.len())
        .cloned()
        .unwrap_or_else(|| path.to_owned())
}

/// `comparison_incomplete` findings (deny): part of the before/after comparison could not be made
/// (a tree object destroyed or changed while the command ran, or too large to read back). What
/// the readable side showed there is listed as unverified changes, but a change the unreadable
/// side hid cannot be ruled out, so the run fails closed rather than reading as "nothing
/// changed".
pub fn classify_incomplete(incomplete: &[String]) -> Vec<EvidenceFinding> {
    incomplete
        .iter()
        .map(|why| EvidenceFinding {
            kind: "comparison_incomplete".into(),
            action: Action::Deny,
            detail: format!("the before/after comparison is incomplete: {}", why),
            process: None,
            container: None,
        })
        .collect()
}

/// The paths an uncaptured entry is decided through (see [`classify_uncaptured`]).
fn uncaptured_readings(path: &str) -> Vec<String> {
    let mut out = vec![path.to_owned(), unescape_lossy(path)];
    let mut rest = path;
    while let Some((parent, _)) = rest.rsplit_once('/') {
        out.push(parent.to_owned());
        out.push(unescape_lossy(parent));
        rest = parent;
    }
    out
}

/// `\xNN` escapes (as `fs::escape_bytes` writes undecodable bytes) read as U+FFFD.
fn unescape_lossy(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(i) = rest.find("\\x") {
        let hex = rest
            .get(i + 2..i + 4)
            .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
        out.push_str(&rest[..i]);
        match hex {
            Some(_) => {
                out.push('\u{fffd}');
                rest = &rest[i + 4..];
            }
            None => {
                out.push_str("\\x");
                rest = &rest[i + 2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Why a changed file's before-state cannot be restored from a backup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NoBackup {
    #[error("no backup taken (rollback disabled in the policy)")]
    NotRequested,
    #[error("not a regular file; never backed up")]
    NotApplicable,
    #[error("no verified backup: {}{}", skip_words(*.reason), detail_words(.detail.as_deref()))]
    Skipped {
        reason: BackupSkip,
        detail: Option<String>,
    },
}

fn skip_words(reason: BackupSkip) -> &'static str {
    match reason {
        BackupSkip::TooLarge => "larger than rollback.max_backup_file_mb",
        BackupSkip::Hardlinked => "hardlinked",
        BackupSkip::ChangedDuringCapture => "changed while it was captured",
        BackupSkip::NotHashed => "could not be read",
        BackupSkip::StoreFailed => "the backup could not be stored",
    }
}

fn detail_words(detail: Option<&str>) -> String {
    detail.map(|d| format!(" ({d})")).unwrap_or_default()
}

fn backed_up(entry: &Entry) -> Result<(), NoBackup> {
    match &entry.backup {
        BackupState::Stored => Ok(()),
        BackupState::NotRequested => Err(NoBackup::NotRequested),
        BackupState::NotApplicable => Err(NoBackup::NotApplicable),
        BackupState::Skipped { reason, detail } => Err(NoBackup::Skipped {
            reason: *reason,
            detail: detail.clone(),
        }),
    }
}

/// Whether rollback can undo the change, and why (not).
fn recoverability(c: &Change) -> (bool, String) {
    let link_before = c.before.as_ref().filter(|b| b.kind == EntryKind::Symlink);
    match (c.kind_changed, link_before) {
        (true, Some(b)) => {
            return match b.exact_symlink_target() {
                Some(_) => (
                    true,
                    "what replaced the symlink is removed and the link restored".into(),
                ),
                None => (false, agentdiff_scan::INEXACT_LINK_TARGET.into()),
            }
        }
        (true, None) => {
            return (
                false,
                "the entry changed kind (e.g. file ↔ symlink); restore it by hand".into(),
            )
        }
        _ => {}
    }
    match c.entry_kind {
        // The link itself is put back from its recorded target (never followed).
        EntryKind::Symlink => {
            let recorded = match c.change_type {
                ChangeType::Created => return (true, "created symlink can be removed".into()),
                _ => c.before.as_ref(),
            };
            match recorded.map(|e| e.exact_symlink_target()) {
                Some(Some(_)) => (true, "the link is restored to its recorded target".into()),
                Some(None) => (false, agentdiff_scan::INEXACT_LINK_TARGET.into()),
                None => (false, "no before-state recorded".into()),
            }
        }
        EntryKind::Directory => match c.change_type {
            ChangeType::Created => (true, "created directory is removed once it is empty".into()),
            ChangeType::Deleted => (true, "directory is re-created with its mode".into()),
            ChangeType::Modified => (true, "directory mode is restored".into()),
        },
        EntryKind::File => match c.change_type {
            ChangeType::Created => match &c.after {
                Some(a) if a.nlink > 1 => (
                    true,
                    "created name of a hardlinked file is removed; its other names keep the file"
                        .into(),
                ),
                _ => (true, "created file can be removed".into()),
            },
            ChangeType::Modified | ChangeType::Deleted => match &c.before {
                Some(b) if b.nlink > 1 => (
                    false,
                    "hardlinked file; hardlinks are never restored".into(),
                ),
                Some(b) => match backed_up(b) {
                    Ok(()) => (true, "before-state backed up and verifiable".into()),
                    Err(reason) => (false, reason.to_string()),
                },
                None => (false, "no before-state recorded".into()),
            },
        },
    }
}

/// Budgets from `limits` and the blast-radius counts.
pub fn evaluate_limits(
    policy: &Policy,
    changes: &[ChangeRecord],
    evidence: &RunEvidence,
) -> (Vec<LimitViolation>, Counts) {
    // Directories are listed as changes but do not count as files changed or in the score, so
    // `rm -rf dir` weighs what its files weigh.
    let files: Vec<&ChangeRecord> = changes
        .iter()
        .filter(|c| c.entry_kind != EntryKind::Directory)
        .collect();
    let limits = policy.limits();
    let mut violations = Vec::new();
    let mut check = |name: &str, limit: Option<u64>, observed: u64| {
        if let Some(limit) = limit {
            if observed > limit {
                violations.push(LimitViolation {
                    limit: name.to_string(),
                    limit_value: limit,
                    observed,
                });
            }
        }
    };
    check("files_changed", limits.files_changed, files.len() as u64);
    check(
        "files_deleted",
        limits.files_deleted,
        files
            .iter()
            .filter(|c| c.change_type == ChangeType::Deleted)
            .count() as u64,
    );
    check(
        "processes_spawned",
        limits.processes_spawned,
        evidence.processes.len().saturating_sub(1) as u64,
    );
    check(
        "duration_seconds",
        limits.duration_seconds,
        evidence.exit.duration_ms / 1000,
    );

    let count =
        |pred: &dyn Fn(&ChangeRecord) -> bool| files.iter().filter(|c| pred(c)).count() as u64;
    let non_allowed = count(&|c| c.decision != Action::Allow);
    let counts = Counts {
        review_created: count(&|c| {
            c.decision == Action::Review && c.change_type == ChangeType::Created
        }),
        review_modified: count(&|c| {
            c.decision == Action::Review && c.change_type == ChangeType::Modified
        }),
        review_deleted: count(&|c| {
            c.decision == Action::Review && c.change_type == ChangeType::Deleted
        }),
        denied_mutation: count(&|c| {
            c.decision == Action::Deny && c.change_type != ChangeType::Deleted
        }),
        denied_deletion: count(&|c| {
            c.decision == Action::Deny && c.change_type == ChangeType::Deleted
        }),
        sensitive_path: count(&|c| c.sensitive),
        dependency_change: count(&|c| c.dependency),
        mode_change: count(&|c| c.mode_changed),
        orphan_process: evidence.cleanup.leftovers() as u64,
        opened_port: evidence.ports.opened.len() as u64,
        budget_violation: violations.len() as u64,
        scope_drift: non_allowed.saturating_sub(SCOPE_DRIFT_ALLOWANCE),
    };
    (violations, counts)
}
