//! Judging one path: where the kernel lands, which project paths that is, and what the policy
//! says about writing or reading it.

use std::cell::Cell;
use std::path::{Path, PathBuf};

use super::deny_read::Anchors;
use super::links;
use super::paths::{home_dir, readings, Reading};
use super::resolve::{resolve, FileId, Resolution};
use super::ToolCall;
use crate::{Action, Decision, Phase, Policy, PolicyError};

/// What a call is judged against.
pub(crate) struct Context<'a> {
    pub(crate) policy: &'a Policy,
    /// The project root, symlink-free.
    pub(crate) root: PathBuf,
    /// The home directory, symlink-free, for `~/` patterns.
    pub(crate) home: Option<PathBuf>,
    /// Relative tool paths start here: the call's `cwd`, else the root.
    pub(crate) base: PathBuf,
    /// Hard-link searches done for this call (each may walk the whole tree).
    link_searches: Cell<usize>,
}

/// Hard-link searches per call; a further multiply-linked file counts as not fully searched.
const MAX_LINK_SEARCHES: usize = 4;

/// The decisions taken for a call and what was not understood.
#[derive(Debug, Default)]
pub(crate) struct Judgement {
    pub(crate) decisions: Vec<Decision>,
    pub(crate) unknowns: Vec<String>,
}

impl Judgement {
    pub(crate) fn unknown(&mut self, why: String) {
        self.unknowns.push(why);
    }

    /// The strictest decision, unless it is `allow` and something was not understood.
    pub(crate) fn finish(self) -> super::HookVerdict {
        let strictest = Decision::strictest(self.decisions.clone());
        let decision = match strictest {
            Some(d) if d.action == Action::Allow && !self.unknowns.is_empty() => None,
            other => other,
        };
        let mut unknowns = self.unknowns;
        if decision.is_none() && unknowns.is_empty() {
            unknowns.push("nothing in the call was judged".to_owned());
        }
        super::HookVerdict {
            decision,
            decisions: self.decisions,
            unknowns,
        }
    }
}

impl<'a> Context<'a> {
    pub(crate) fn new(
        policy: &'a Policy,
        root: &Path,
        call: &ToolCall,
    ) -> Result<Context<'a>, PolicyError> {
        let root_error = |source| PolicyError::Root {
            path: root.to_owned(),
            source,
        };
        let resolved = resolve(Path::new("/"), root)
            .map_err(|e| root_error(std::io::Error::other(e.to_string())))?;
        if resolved.file.is_none() {
            return Err(root_error(std::io::Error::from(
                std::io::ErrorKind::NotFound,
            )));
        }
        let root = resolved.target;
        let home = home_dir().and_then(|h| resolve(Path::new("/"), &h).ok().map(|r| r.target));
        let base = call.cwd.clone().unwrap_or_else(|| root.clone());
        Ok(Context {
            policy,
            root,
            home,
            base,
            link_searches: Cell::new(0),
        })
    }

    /// This context with relative paths starting at `base` (an `apply_patch` working directory
    /// inside the root). Its hard-link search budget starts where this context's is.
    pub(crate) fn with_base(&self, base: PathBuf) -> Context<'a> {
        Context {
            policy: self.policy,
            root: self.root.clone(),
            home: self.home.clone(),
            base,
            link_searches: Cell::new(self.link_searches.get()),
        }
    }

    /// Where `raw` (a directory a tool names) leads, when that is inside the root.
    pub(crate) fn inside_root(&self, raw: &str) -> Result<PathBuf, String> {
        if readings(raw, self.home.as_deref()).len() > 1 {
            return Err(
                "it may be read in more than one way (Claude Code trims a path and expands `~`)"
                    .to_owned(),
            );
        }
        let resolution = resolve(&self.base, Path::new(raw)).map_err(|e| e.to_string())?;
        match self.relative(&resolution.target) {
            Some(_) => Ok(resolution.target),
            None => Err(format!(
                "it leads to {}, outside the project root {}",
                resolution.target.display(),
                self.root.display()
            )),
        }
    }

    /// The names of a multiply-linked file inside the root, within the per-call budget.
    fn link_names(&self, id: FileId) -> links::Links {
        let done = self.link_searches.get();
        if done >= MAX_LINK_SEARCHES {
            return links::Links::default();
        }
        self.link_searches.set(done + 1);
        links::names_in_root(&self.root, id)
    }

    fn anchors(&self) -> Anchors<'_> {
        Anchors {
            root: &self.root,
            home: self.home.as_deref(),
        }
    }

    fn decision(&self, action: Action, subject: &str, rule: &str, reason: String) -> Decision {
        Decision {
            action,
            subject: subject.to_owned(),
            rule: rule.to_owned(),
            pattern: None,
            reason,
            policy_version: self.policy.version(),
            phase: Phase::PreToolUse,
        }
    }

    /// The project-relative name of a symlink-free absolute path, if it is below the root.
    fn relative(&self, abs: &Path) -> Option<String> {
        let rel = abs.strip_prefix(&self.root).ok()?;
        Some(
            rel.components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/"),
        )
    }

    fn display(&self, abs: &Path) -> String {
        self.relative(abs)
            .filter(|r| !r.is_empty())
            .unwrap_or_else(|| abs.display().to_string())
    }

    /// Judges every reading of `raw` ([`readings`]) with `judge`; decisions and unknowns of a
    /// reading other than `raw` itself say which reading they are about. A reading that cannot
    /// be told is review for a write (`hook.unresolvable`) and not understood for a read.
    fn each_reading(
        &self,
        raw: &str,
        write: bool,
        out: &mut Judgement,
        judge: impl Fn(&Self, &str, &mut Judgement),
    ) {
        for reading in readings(raw, self.home.as_deref()) {
            let (decisions, unknowns) = (out.decisions.len(), out.unknowns.len());
            let text = match reading {
                Reading::Path(text) => {
                    judge(self, &text, out);
                    text
                }
                Reading::Unknown(why) if write => {
                    out.decisions.push(self.decision(
                        Action::Review,
                        raw,
                        "hook.unresolvable",
                        format!("{why}, so the file the tool writes is not known"),
                    ));
                    continue;
                }
                Reading::Unknown(why) => {
                    out.unknown(why);
                    continue;
                }
            };
            if text != raw {
                let note = format!(
                    "`{raw}` read as `{text}` (Claude Code trims a path and expands `~`): "
                );
                for d in out.decisions.iter_mut().skip(decisions) {
                    d.reason = format!("{note}{}", d.reason);
                }
                for u in out.unknowns.iter_mut().skip(unknowns) {
                    *u = format!("{note}{u}");
                }
            }
        }
    }

    /// Decide writing the path a tool named, in every reading.
    pub(crate) fn judge_write(&self, raw: &str, out: &mut Judgement) {
        self.each_reading(raw, true, out, Self::judge_write_one);
    }

    fn judge_write_one(&self, raw: &str, out: &mut Judgement) {
        let resolution = match resolve(&self.base, Path::new(raw)) {
            Ok(r) => r,
            Err(e) => {
                out.decisions.push(self.decision(
                    Action::Deny,
                    raw,
                    "hook.unresolvable",
                    format!("cannot tell which file the kernel would write: {e}"),
                ));
                return;
            }
        };
        for name in resolution.final_links.iter().chain([&resolution.target]) {
            out.decisions.push(self.decide_write(raw, name));
        }
        if let Some(id) = multiply_linked(&resolution) {
            self.judge_write_links(&resolution.target, id, out);
        }
    }

    fn decide_write(&self, raw: &str, abs: &Path) -> Decision {
        let Some(rel) = self.relative(abs) else {
            return self.decision(
                Action::Deny,
                raw,
                "hook.outside_root",
                format!(
                    "the kernel would write {}, outside the project root {}",
                    abs.display(),
                    self.root.display()
                ),
            );
        };
        if rel.is_empty() {
            return self.decision(
                Action::Deny,
                raw,
                "hook.project_root",
                "the tool call targets the project root itself".to_owned(),
            );
        }
        match self.policy.decide_path(&rel, Phase::PreToolUse) {
            Ok(mut d) => {
                if Path::new(raw) != Path::new(&rel) && Path::new(raw) != abs {
                    d.reason = format!("`{raw}` leads to `{rel}`; {}", d.reason);
                }
                d
            }
            Err(err) => self.decision(Action::Deny, raw, "hook.invalid_path", err.to_string()),
        }
    }

    fn judge_write_links(&self, target: &Path, id: FileId, out: &mut Judgement) {
        let Some(me) = self.relative(target) else {
            return; // already denied as outside
        };
        let found = self.link_names(id);
        for name in found.names.iter().filter(|n| **n != me) {
            match self.policy.decide_path(name, Phase::PreToolUse) {
                Ok(mut d) => {
                    d.reason = format!(
                        "`{me}` is a hard link to `{name}` (the same file), so writing it \
                         writes `{name}`; {}",
                        d.reason
                    );
                    out.decisions.push(d);
                }
                Err(err) => out.decisions.push(self.decision(
                    Action::Deny,
                    name,
                    "hook.invalid_path",
                    err.to_string(),
                )),
            }
        }
        if !found.complete {
            out.decisions.push(self.decision(
                Action::Review,
                &me,
                "hook.hard_link",
                format!(
                    "`{me}` has {} hard links and not all of them could be found in the \
                     project, so the files it shares content with are unknown",
                    id.nlink
                ),
            ));
        } else if (found.names.len() as u64) < id.nlink {
            out.decisions.push(self.decision(
                Action::Deny,
                &me,
                "hook.outside_root",
                format!(
                    "`{me}` is a hard link to {} file name(s) outside the project root; \
                     writing it writes them too",
                    id.nlink - found.names.len() as u64
                ),
            ));
        }
    }

    /// Decide reading one named file, in every reading. Inside the root and outside
    /// `deny_read`: allow.
    pub(crate) fn judge_read(&self, raw: &str, out: &mut Judgement) {
        self.each_reading(raw, false, out, Self::judge_read_one);
    }

    fn judge_read_one(&self, raw: &str, out: &mut Judgement) {
        let resolution = match resolve(&self.base, Path::new(raw)) {
            Ok(r) => r,
            Err(e) => {
                out.unknown(format!("cannot resolve `{raw}`: {e}"));
                return;
            }
        };
        if self.deny_reads(raw, &resolution, out) {
            return;
        }
        if let Some(id) = multiply_linked(&resolution) {
            let found = self.link_names(id);
            for name in &found.names {
                if let Some(d) = self.deny_read_of(raw, &self.root.join(name)) {
                    out.decisions.push(d);
                    return;
                }
            }
            if !found.complete || (found.names.len() as u64) < id.nlink {
                out.unknown(format!(
                    "`{raw}` is hard-linked to files that are not all inside the project"
                ));
                return;
            }
        }
        self.allow_inside(raw, &resolution.target, "hook.read_inside_root", out);
    }

    /// Decide listing or searching below a directory (or one file). `content` is true for a
    /// tool that reads file contents (Grep), false for one that lists names (Glob, LS).
    pub(crate) fn judge_scope(&self, raw: &str, content: bool, out: &mut Judgement) {
        self.each_reading(raw, false, out, |ctx, text, out| {
            ctx.judge_scope_one(text, content, out)
        });
    }

    fn judge_scope_one(&self, raw: &str, content: bool, out: &mut Judgement) {
        let resolution = match resolve(&self.base, Path::new(raw)) {
            Ok(r) => r,
            Err(e) => {
                out.unknown(format!("cannot resolve `{raw}`: {e}"));
                return;
            }
        };
        if self.deny_reads(raw, &resolution, out) {
            return;
        }
        if resolution.file.is_some_and(|f| f.regular) && content {
            return self.judge_read_one(raw, out);
        }
        if content {
            if let Some(i) = self
                .policy
                .deny_read()
                .first_reaching_below(&resolution.target, self.anchors())
            {
                out.unknown(format!(
                    "a search of {} may read files that filesystem.deny_read[{i}] `{}` names",
                    self.display(&resolution.target),
                    self.policy.deny_read().text(i)
                ));
                return;
            }
            if !self.judge_links_below(raw, &resolution.target, out) {
                return;
            }
        }
        self.allow_inside(raw, &resolution.target, "hook.search_inside_root", out);
    }

    /// A content search reads every file below `dir` under whatever other names those files
    /// have. Each multiply-linked file there is judged on its names inside the root (one in
    /// `deny_read` denies); one with names outside the root, or a walk that could not see every
    /// file, leaves the search undecided. True when nothing below stands in the way of `allow`.
    fn judge_links_below(&self, raw: &str, dir: &Path, out: &mut Judgement) -> bool {
        if self.relative(dir).is_none() {
            return true; // outside the root: never allowed anyway
        }
        let (found, complete) = links::linked_below(dir, MAX_LINK_SEARCHES);
        for (below, id) in &found {
            let shown = self.display(&dir.join(below));
            let names = self.link_names(*id);
            for name in &names.names {
                if let Some(mut d) = self.deny_read_of(raw, &self.root.join(name)) {
                    d.reason = format!(
                        "a search of `{raw}` reads {shown}, a hard link to `{name}` (the same \
                         file); {}",
                        d.reason
                    );
                    out.decisions.push(d);
                    return false;
                }
            }
            if !names.complete || (names.names.len() as u64) < id.nlink {
                out.unknown(format!(
                    "a search of `{raw}` reads {shown}, which has {} hard links, not all of them \
                     found inside the project",
                    id.nlink
                ));
                return false;
            }
        }
        if !complete {
            out.unknown(format!(
                "a search of `{raw}` could not check every file below it for hard links (it \
                 stops after {} entries or {MAX_LINK_SEARCHES} multiply-linked files)",
                links::MAX_ENTRIES
            ));
            return false;
        }
        true
    }

    /// Deny when the target or a final symlink's name is in `deny_read`; true if denied.
    fn deny_reads(&self, raw: &str, resolution: &Resolution, out: &mut Judgement) -> bool {
        for name in resolution.final_links.iter().chain([&resolution.target]) {
            if let Some(d) = self.deny_read_of(raw, name) {
                out.decisions.push(d);
                return true;
            }
        }
        false
    }

    fn deny_read_of(&self, raw: &str, abs: &Path) -> Option<Decision> {
        let rules = self.policy.deny_read();
        let i = rules.first_match(abs, self.anchors())?;
        let shown = self.display(abs);
        let mut d = self.decision(
            Action::Deny,
            &shown,
            &format!("filesystem.deny_read[{i}]"),
            format!(
                "`{raw}` reads {shown}, which filesystem.deny_read[{i}] `{}` protects",
                rules.text(i)
            ),
        );
        d.pattern = Some(rules.text(i).to_owned());
        Some(d)
    }

    fn allow_inside(&self, raw: &str, target: &Path, rule: &str, out: &mut Judgement) {
        match self.relative(target) {
            Some(rel) => out.decisions.push(self.decision(
                Action::Allow,
                if rel.is_empty() { "." } else { &rel },
                rule,
                "a read inside the project root that filesystem.deny_read does not name".to_owned(),
            )),
            None => out.unknown(format!(
                "`{raw}` is outside the project root {}",
                self.root.display()
            )),
        }
    }

    /// Judge a path an unmodelled tool names: only a policy `deny` (for writing or reading)
    /// stands; the value may not even be a path, so nothing else is concluded from it.
    pub(crate) fn judge_foreign(&self, raw: &str, out: &mut Judgement) {
        let mut scratch = Judgement::default();
        self.judge_write(raw, &mut scratch);
        self.judge_read(raw, &mut scratch);
        out.decisions.extend(
            scratch
                .decisions
                .into_iter()
                .filter(|d| d.action == Action::Deny && d.rule.starts_with("filesystem.")),
        );
    }
}

/// The file's identity when it is a regular file with more than one name.
fn multiply_linked(resolution: &Resolution) -> Option<FileId> {
    resolution.file.filter(|f| f.regular && f.nlink > 1)
}
