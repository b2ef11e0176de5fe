//! Decision types and the fixed-precedence evaluation: deny > review > allow > default.

use std::fmt;

use globset::Candidate;
use serde::{Deserialize, Serialize};

use super::glob::RuleSet;

/// What the policy says about one subject. Ordered from the most to the least permissive, so
/// the strictest of several actions is their maximum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Review,
    Deny,
}

impl Action {
    /// The stricter of two actions.
    pub fn strictest(self, other: Action) -> Action {
        self.max(other)
    }

    /// The lowercase name used in policy files and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Review => "review",
            Action::Deny => "deny",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// When a decision was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before launch, about the command itself.
    Command,
    /// After the run, about an observed change.
    PostRun,
    /// In an agent hook, before a tool call runs.
    PreToolUse,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Command => "command",
            Phase::PostRun => "post_run",
            Phase::PreToolUse => "pre_tool_use",
        })
    }
}

/// One decision with its full provenance: which rule (section and index) and pattern decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub action: Action,
    /// The normalised path or executable basename the decision is about.
    pub subject: String,
    /// The deciding rule, e.g. `filesystem.deny[0]` or `filesystem.default`.
    pub rule: String,
    /// The matching pattern, when a pattern decided.
    pub pattern: Option<String>,
    /// Why, in one sentence.
    pub reason: String,
    pub policy_version: u32,
    pub phase: Phase,
}

impl Decision {
    /// The strictest of several decisions; among equally strict ones the first is kept so the
    /// result is deterministic. `None` for an empty input.
    pub fn strictest(decisions: impl IntoIterator<Item = Decision>) -> Option<Decision> {
        let mut best: Option<Decision> = None;
        for d in decisions {
            match &best {
                Some(b) if b.action >= d.action => {}
                _ => best = Some(d),
            }
        }
        best
    }
}

/// The three pattern sections of one subject kind (filesystem or process) and its default.
#[derive(Debug, Clone)]
pub(crate) struct Rules {
    pub(crate) kind: &'static str,
    pub(crate) deny: RuleSet,
    pub(crate) review: RuleSet,
    pub(crate) allow: RuleSet,
    pub(crate) default: Action,
}

impl Rules {
    /// Evaluate `subject` (already normalised) with fixed precedence. The pattern order inside a
    /// section only chooses which index is reported (the first matching one), never the action.
    pub(crate) fn decide(&self, subject: String, version: u32, phase: Phase) -> Decision {
        let candidate = Candidate::from_bytes(subject.as_bytes());
        let what = if self.kind == "process" {
            "executable"
        } else {
            "path"
        };
        let sections = [
            (
                &self.deny,
                Action::Deny,
                "deny takes precedence over review and allow",
            ),
            (
                &self.review,
                Action::Review,
                "review takes precedence over allow",
            ),
            (
                &self.allow,
                Action::Allow,
                "no deny or review pattern matches",
            ),
        ];
        for (set, action, why) in sections {
            if let Some(index) = set.first_match(&candidate) {
                let pattern = set.pattern(index).to_owned();
                let rule = format!("{}[{index}]", set.section());
                let reason = format!("{what} matches {rule} `{pattern}`; {why}");
                return Decision {
                    action,
                    subject,
                    rule,
                    pattern: Some(pattern),
                    reason,
                    policy_version: version,
                    phase,
                };
            }
        }
        Decision {
            action: self.default,
            reason: format!(
                "no {} pattern matches; {}.default is {}",
                self.kind, self.kind, self.default
            ),
            subject,
            rule: format!("{}.default", self.kind),
            pattern: None,
            policy_version: version,
            phase,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn action_order_and_serde() {
        assert!(Action::Allow < Action::Review && Action::Review < Action::Deny);
        assert_eq!(Action::Allow.strictest(Action::Deny), Action::Deny);
        assert_eq!(
            serde_json::to_string(&Action::Review).unwrap(),
            "\"review\""
        );
        assert_eq!(
            serde_json::to_string(&Phase::PreToolUse).unwrap(),
            "\"pre_tool_use\""
        );
        assert_eq!(
            serde_json::to_string(&Phase::PostRun).unwrap(),
            "\"post_run\""
        );
    }

    #[test]
    fn strictest_keeps_the_first_of_equals() {
        let mk = |action, subject: &str| Decision {
            action,
            subject: subject.to_owned(),
            rule: "r".to_owned(),
            pattern: None,
            reason: String::new(),
            policy_version: 1,
            phase: Phase::PostRun,
        };
        let best = Decision::strictest([
            mk(Action::Review, "a"),
            mk(Action::Deny, "b"),
            mk(Action::Deny, "c"),
        ])
        .unwrap();
        assert_eq!(best.subject, "b");
        assert!(Decision::strictest(Vec::new()).is_none());
    }
}
