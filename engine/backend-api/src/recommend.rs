//! Which backend `agentdiff doctor` recommends: the strongest one that is available here,
//! counting an `enforced` label at full strength only when a probe verified it on this host.
//!
//! Invariants: an unavailable backend is never recommended; a backend whose `enforced` label a
//! probe showed not to hold is never recommended (it claims more than it does); without probe
//! results the ranking uses the declared labels and says so (`verified: false`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Boundary, Capabilities, Level};

/// What a probe said about one boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeOutcome {
    /// The control held.
    Verified,
    /// The attempt succeeded: the control does not hold.
    NotEnforced,
    /// Not applicable, inconclusive or not probed.
    Unknown,
}

/// One backend as doctor saw it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: String,
    pub capabilities: Capabilities,
    pub available: bool,
    /// Per-boundary probe outcomes; `None` when no probe ran.
    pub probes: Option<BTreeMap<Boundary, ProbeOutcome>>,
}

/// The recommendation with the reason for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    pub id: String,
    /// Boundaries counted as enforced (verified by a probe when probes ran).
    pub enforced: Vec<&'static str>,
    /// Whether the ranking rests on probe results from this host.
    pub verified: bool,
    pub reason: String,
}

/// Points per level; an unverified `enforced` counts as `requested` when probes ran.
fn points(level: Level) -> u32 {
    match level {
        Level::Uncontrolled => 0,
        Level::Observed => 1,
        Level::Requested => 2,
        Level::Filtered => 3,
        Level::Enforced => 4,
    }
}

/// The level a boundary counts at, or `None` when a probe refuted an `enforced` claim.
fn counted(c: &Candidate, b: Boundary) -> Option<Level> {
    let declared = c.capabilities.level(b);
    match (&c.probes, declared) {
        (Some(p), Level::Enforced) => match p.get(&b).copied().unwrap_or(ProbeOutcome::Unknown) {
            ProbeOutcome::Verified => Some(Level::Enforced),
            ProbeOutcome::NotEnforced => None,
            ProbeOutcome::Unknown => Some(Level::Requested),
        },
        _ => Some(declared),
    }
}

/// The strongest available backend, or `None` when none is available (or every available one
/// was refuted by its probes).
pub fn recommend(candidates: &[Candidate]) -> Option<Recommendation> {
    let mut best: Option<(u32, &Candidate, Vec<&'static str>)> = None;
    for c in candidates.iter().filter(|c| c.available) {
        let levels: Option<Vec<(Boundary, Level)>> = Boundary::ALL
            .iter()
            .map(|b| counted(c, *b).map(|l| (*b, l)))
            .collect();
        let Some(levels) = levels else { continue };
        let mut score: u32 = levels.iter().map(|(_, l)| points(*l)).sum();
        if c.capabilities.sandboxed {
            score += 1;
        }
        let enforced: Vec<&'static str> = levels
            .iter()
            .filter(|(_, l)| *l == Level::Enforced)
            .map(|(b, _)| b.as_str())
            .collect();
        // Ties keep the earlier candidate (doctor lists backends in id order).
        if best.as_ref().map_or(true, |(s, _, _)| score > *s) {
            best = Some((score, c, enforced));
        }
    }
    let (_, c, enforced) = best?;
    let verified = c.probes.is_some();
    let basis = if verified {
        "verified by the probes on this host"
    } else {
        "as declared; run `agentdiff doctor --probe` to verify on this host"
    };
    let reason = if enforced.is_empty() {
        format!("the strongest available backend; nothing is enforced ({basis})")
    } else {
        format!(
            "the strongest available backend: enforces {} ({basis})",
            enforced.join(", ")
        )
    };
    Some(Recommendation {
        id: c.id.clone(),
        enforced,
        verified,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(fs: Level, net: Level, sandboxed: bool) -> Capabilities {
        Capabilities {
            filesystem_writes: fs,
            network: net,
            processes: Level::Observed,
            sandboxed,
            ..Capabilities::default()
        }
    }

    fn cand(id: &str, c: Capabilities, available: bool) -> Candidate {
        Candidate {
            id: id.into(),
            capabilities: c,
            available,
            probes: None,
        }
    }

    fn all(outcome: ProbeOutcome) -> Option<BTreeMap<Boundary, ProbeOutcome>> {
        Some(Boundary::ALL.iter().map(|b| (*b, outcome)).collect())
    }

    #[test]
    fn the_strongest_available_backend_wins() {
        let list = vec![
            cand(
                "local",
                caps(Level::Uncontrolled, Level::Observed, false),
                true,
            ),
            cand("srt", caps(Level::Requested, Level::Requested, false), true),
            cand(
                "sealed",
                caps(Level::Enforced, Level::Enforced, true),
                false,
            ),
        ];
        let r = recommend(&list).unwrap();
        assert_eq!(r.id, "srt");
        assert!(!r.verified);
        assert!(r.reason.contains("doctor --probe"), "{}", r.reason);
        assert!(recommend(&list[2..]).is_none());
    }

    #[test]
    fn verified_enforcement_beats_a_handed_over_request() {
        let mut bwrap = cand("bwrap", caps(Level::Enforced, Level::Enforced, true), true);
        let mut srt = cand("srt", caps(Level::Requested, Level::Requested, false), true);
        bwrap.probes = all(ProbeOutcome::Verified);
        srt.probes = all(ProbeOutcome::Verified);
        let r = recommend(&[srt.clone(), bwrap.clone()]).unwrap();
        assert_eq!(r.id, "bwrap");
        assert!(r.verified);
        assert_eq!(r.enforced, ["filesystem_writes", "network"]);
        // A refuted enforced claim is never recommended, however strong the labels.
        bwrap.probes = all(ProbeOutcome::NotEnforced);
        assert_eq!(recommend(&[srt, bwrap]).unwrap().id, "srt");
    }

    #[test]
    fn an_unverified_enforced_label_counts_as_requested_once_probes_ran() {
        let mut claims = cand(
            "claims",
            caps(Level::Enforced, Level::Enforced, false),
            true,
        );
        claims.probes = all(ProbeOutcome::Unknown);
        let mut proven = cand(
            "proven",
            caps(Level::Enforced, Level::Requested, false),
            true,
        );
        proven.probes = all(ProbeOutcome::Verified);
        let r = recommend(&[claims, proven]).unwrap();
        assert_eq!(r.id, "proven");
        assert_eq!(r.enforced, ["filesystem_writes"]);
    }
}
