//! Suite results and their renderings: TAP 13 with YAML diagnostics, and JSON.

use agentdiff_backend_api::{Availability, Capabilities};
use serde::{Deserialize, Serialize};

use crate::probes::ProbeResult;

/// How binding a requirement is. A failed MUST makes the backend non-conformant; a failed SHOULD
/// is reported but does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum RequirementLevel {
    Must,
    Should,
}

impl RequirementLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            RequirementLevel::Must => "MUST",
            RequirementLevel::Should => "SHOULD",
        }
    }
}

/// The outcome of one check. A skipped check is never counted as passed; a MUST check that
/// could not be run for lack of input (no fail-closed case) makes the report non-conformant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    Passed,
    Skipped {
        reason: String,
    },
    Failed {
        reason: String,
    },
    /// The check needs input the suite was not given; nothing was verified.
    NotRun {
        reason: String,
    },
}

impl Outcome {
    pub fn failed(reason: impl Into<String>) -> Self {
        Outcome::Failed {
            reason: reason.into(),
        }
    }
    pub fn skipped(reason: impl Into<String>) -> Self {
        Outcome::Skipped {
            reason: reason.into(),
        }
    }
    pub fn is_passed(&self) -> bool {
        matches!(self, Outcome::Passed)
    }
    pub fn is_failed(&self) -> bool {
        matches!(self, Outcome::Failed { .. })
    }
    pub fn is_skipped(&self) -> bool {
        matches!(self, Outcome::Skipped { .. })
    }
    pub fn not_run(reason: impl Into<String>) -> Self {
        Outcome::NotRun {
            reason: reason.into(),
        }
    }
    pub fn is_not_run(&self) -> bool {
        matches!(self, Outcome::NotRun { .. })
    }
}

/// One check's result.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckResult {
    pub id: String,
    pub level: RequirementLevel,
    pub statement: String,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// What the check saw (argv received, exit info, probe evidence…).
    pub details: serde_json::Value,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    pub total: usize,
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    pub must_failed: usize,
    pub should_failed: usize,
    /// MUST checks that were not run for lack of input.
    #[serde(default)]
    pub must_not_run: usize,
}

/// A complete suite run against one backend.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub suite_version: u32,
    pub backend: String,
    pub capabilities: Capabilities,
    pub availability: Availability,
    pub checks: Vec<CheckResult>,
    /// Probe results gathered by the honesty checks.
    pub probes: Vec<ProbeResult>,
    pub summary: Summary,
}

impl Report {
    pub fn summarise(checks: &[CheckResult]) -> Summary {
        let mut s = Summary {
            total: checks.len(),
            ..Summary::default()
        };
        for c in checks {
            match &c.outcome {
                Outcome::Passed => s.passed += 1,
                Outcome::Skipped { .. } => s.skipped += 1,
                Outcome::NotRun { .. } => {
                    if c.level == RequirementLevel::Must {
                        s.must_not_run += 1;
                    } else {
                        s.skipped += 1;
                    }
                }
                Outcome::Failed { .. } => {
                    s.failed += 1;
                    match c.level {
                        RequirementLevel::Must => s.must_failed += 1,
                        RequirementLevel::Should => s.should_failed += 1,
                    }
                }
            }
        }
        s
    }

    /// True when no MUST check failed and every MUST check was run.
    pub fn conformant(&self) -> bool {
        self.summary.must_failed == 0 && self.summary.must_not_run == 0
    }

    /// Ids of MUST checks that were not run, in suite order.
    pub fn not_run_ids(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| c.level == RequirementLevel::Must && c.outcome.is_not_run())
            .map(|c| c.id.as_str())
            .collect()
    }

    pub fn check(&self, id: &str) -> Option<&CheckResult> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// Ids of failed checks, in suite order.
    pub fn failed_ids(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| c.outcome.is_failed())
            .map(|c| c.id.as_str())
            .collect()
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| {
            format!(
                "{{\"error\":{}}}",
                json_str(&format!("report serialisation: {e}"))
            )
        })
    }

    /// TAP version 13. Every test line names the check id; skipped checks use the `# SKIP`
    /// directive (TAP consumers count them apart from passes); failures and skips carry a YAML
    /// block. YAML scalars are written as JSON strings and nested data as JSON flow collections,
    /// both valid YAML 1.2.
    pub fn to_tap(&self) -> String {
        let mut out = String::from("TAP version 13\n");
        out.push_str(&format!("1..{}\n", self.checks.len()));
        out.push_str(&format!("# backend: {}\n", tap_comment(&self.backend)));
        for (i, c) in self.checks.iter().enumerate() {
            let n = i + 1;
            let desc = tap_description(&format!("{} [{}] {}", c.id, c.level.as_str(), c.statement));
            match &c.outcome {
                Outcome::Passed => out.push_str(&format!("ok {n} - {desc}\n")),
                Outcome::Skipped { reason } => {
                    out.push_str(&format!("ok {n} - {desc} # SKIP {}\n", tap_comment(reason)));
                }
                Outcome::Failed { .. } => {
                    out.push_str(&format!("not ok {n} - {desc}\n"));
                }
                Outcome::NotRun { .. } => {
                    out.push_str(&format!("not ok {n} - {desc} (not run)\n"));
                }
            }
            if !c.outcome.is_passed() {
                out.push_str("  ---\n");
                out.push_str(&format!("  id: {}\n", json_str(&c.id)));
                out.push_str(&format!("  level: {}\n", c.level.as_str()));
                match &c.outcome {
                    Outcome::Failed { reason } => {
                        out.push_str("  outcome: failed\n");
                        out.push_str(&format!("  reason: {}\n", json_str(reason)));
                    }
                    Outcome::Skipped { reason } => {
                        out.push_str("  outcome: skipped\n");
                        out.push_str(&format!("  reason: {}\n", json_str(reason)));
                    }
                    Outcome::NotRun { reason } => {
                        out.push_str("  outcome: not_run\n");
                        out.push_str(&format!("  reason: {}\n", json_str(reason)));
                    }
                    Outcome::Passed => {}
                }
                if !c.details.is_null() {
                    let details =
                        serde_json::to_string(&c.details).unwrap_or_else(|_| "null".into());
                    out.push_str(&format!("  details: {details}\n"));
                }
                out.push_str(&format!("  duration_ms: {}\n", c.duration_ms));
                out.push_str("  ...\n");
            }
        }
        let s = &self.summary;
        out.push_str(&format!(
            "# passed {} failed {} (MUST {}, SHOULD {}) skipped {} not run (MUST) {}\n",
            s.passed, s.failed, s.must_failed, s.should_failed, s.skipped, s.must_not_run
        ));
        out.push_str(&format!(
            "# {}\n",
            if self.conformant() {
                "conformant: no MUST check failed".to_string()
            } else if s.must_failed > 0 {
                "NOT conformant: at least one MUST check failed".to_string()
            } else {
                format!(
                    "NOT conformant: MUST check(s) not run: {}",
                    self.not_run_ids().join(", ")
                )
            }
        ));
        out
    }
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// A TAP description may not contain `#` (it starts a directive) or a line break.
fn tap_description(s: &str) -> String {
    tap_comment(s).replace('#', "\\#")
}

fn tap_comment(s: &str) -> String {
    agentdiff_host::redact::escape_terminal(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(id: &str, level: RequirementLevel, outcome: Outcome) -> CheckResult {
        CheckResult {
            id: id.into(),
            level,
            statement: format!("statement of {id} # with hash\nand newline"),
            outcome,
            details: serde_json::json!({"argv": ["a b", ""]}),
            duration_ms: 3,
        }
    }

    fn report(checks: Vec<CheckResult>) -> Report {
        Report {
            suite_version: 1,
            backend: "x".into(),
            capabilities: Capabilities::default(),
            availability: Availability::Ready { detail: "".into() },
            summary: Report::summarise(&checks),
            checks,
            probes: vec![],
        }
    }

    #[test]
    fn skips_are_not_passes_and_should_failures_do_not_break_conformance() {
        let r = report(vec![
            result("A-1", RequirementLevel::Must, Outcome::Passed),
            result(
                "A-2",
                RequirementLevel::Must,
                Outcome::skipped("not declared"),
            ),
            result("A-3", RequirementLevel::Should, Outcome::failed("meh")),
        ]);
        assert_eq!(r.summary.passed, 1);
        assert_eq!(r.summary.skipped, 1);
        assert_eq!(r.summary.should_failed, 1);
        assert!(r.conformant());
        let r2 = report(vec![result(
            "B-1",
            RequirementLevel::Must,
            Outcome::failed("no"),
        )]);
        assert!(!r2.conformant());
        assert_eq!(r2.failed_ids(), vec!["B-1"]);
    }

    #[test]
    fn tap_has_plan_directives_and_yaml_blocks() {
        let r = report(vec![
            result("A-1", RequirementLevel::Must, Outcome::Passed),
            result(
                "A-2",
                RequirementLevel::Must,
                Outcome::skipped("not # declared"),
            ),
            result(
                "A-3",
                RequirementLevel::Must,
                Outcome::failed("bad \"quote\"\nline"),
            ),
        ]);
        let tap = r.to_tap();
        let lines: Vec<&str> = tap.lines().collect();
        assert_eq!(lines[0], "TAP version 13");
        assert_eq!(lines[1], "1..3");
        assert!(lines.iter().any(|l| l.starts_with("ok 1 - A-1 [MUST]")));
        let skip = lines.iter().find(|l| l.starts_with("ok 2 - A-2")).unwrap();
        assert!(skip.contains(" # SKIP "), "{skip}");
        // The description's own `#` is escaped so it does not start a directive.
        assert!(skip.contains("\\# with hash"), "{skip}");
        assert!(tap.contains("not ok 3 - A-3 [MUST]"));
        assert!(tap.contains("  reason: \"bad \\\"quote\\\"\\nline\""));
        assert!(tap.contains("  details: {\"argv\":[\"a b\",\"\"]}"));
        // Every YAML block is closed.
        assert_eq!(
            tap.matches("  ---\n").count(),
            tap.matches("  ...\n").count()
        );
        assert!(tap.contains("NOT conformant"));
    }

    #[test]
    fn json_round_trips() {
        let r = report(vec![result(
            "A-1",
            RequirementLevel::Should,
            Outcome::skipped("why"),
        )]);
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["checks"][0]["outcome"], "skipped");
        assert_eq!(v["checks"][0]["reason"], "why");
        assert_eq!(v["checks"][0]["level"], "SHOULD");
        assert_eq!(v["summary"]["skipped"], 1);
        let back: Report = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back.checks[0].outcome, Outcome::skipped("why"));
    }
}
