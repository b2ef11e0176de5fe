//! Promote's execution: the plan's writes through rollback's conflict-checked applier, and the
//! recorded result.

use std::collections::BTreeMap;

use serde_json::json;

use agentdiff_store::{now_rfc3339_millis, Capsule, RecoveryArtifact};

use super::{ItemReport, Plan, PromoteError, PromoteOutcome, PromoteStatus, Report};

/// Execute `plan` (or only check and preview it with `dry_run`) and record the result.
pub fn execute(capsule: &Capsule, plan: &Plan, dry_run: bool) -> Result<Report, PromoteError> {
    #[cfg(unix)]
    {
        execute_unix(capsule, plan, dry_run)
    }
    #[cfg(not(unix))]
    {
        let _ = (capsule, plan, dry_run);
        Err(PromoteError::UnsupportedPlatform)
    }
}

#[cfg(unix)]
fn execute_unix(capsule: &Capsule, plan: &Plan, dry_run: bool) -> Result<Report, PromoteError> {
    use crate::rollback::apply::Applier;
    use crate::rollback::execute;
    use agentdiff_host::dir::DirHandle;

    let started_at = now_rfc3339_millis();
    let root = DirHandle::open_root(&plan.root).map_err(|source| PromoteError::Io {
        action: "open the project root",
        path: plan.root.clone(),
        source,
    })?;
    let mut applier = Applier::new(root, &plan.objects, dry_run, None);
    applier.target_label = "after promote";
    applier.show_secrets = plan.show_secrets;

    // No fault is injected here, so `interrupted` stays `None`; were it set, the items not
    // reached would be reported as failed, which makes the report partial.
    let executed = execute::run(
        &mut applier,
        &plan.items,
        &plan.unselected_children,
        |operations| {
            capsule.recovery_event(
                "promote_started",
                json!({ "scope": plan.scope, "force": plan.force, "paths": plan.paths, "operations": operations }),
            )
        },
        |op, r| {
            capsule.recovery_event(
                "promote_path",
                json!({
                    "path": op.path,
                    "action": op.kind,
                    "outcome": PromoteOutcome::from(r.outcome),
                    "reason": r.reason,
                }),
            )
        },
    )?;

    let mut totals: BTreeMap<String, usize> = BTreeMap::new();
    let mut items = Vec::with_capacity(plan.items.len());
    for (item, done) in plan.items.iter().zip(executed.items) {
        let outcome = PromoteOutcome::from(done.result.outcome);
        *totals.entry(outcome.as_str().to_string()).or_default() += 1;
        items.push(ItemReport {
            path: item.path.clone(),
            change_type: item.change_type,
            entry_kind: item.entry_kind,
            decision: item.decision,
            implied: item.implied,
            action: done.action,
            outcome,
            reason: done.result.reason,
            diff: done.result.diff,
        });
    }
    let mut report = Report {
        schema_version: agentdiff_store::SCHEMA_VERSION,
        run_id: plan.run_id.clone(),
        root: plan.root.display().to_string(),
        scope: plan.scope,
        force: plan.force,
        paths: plan.paths.clone(),
        dry_run,
        status: PromoteStatus::DryRun,
        totals,
        not_selected: plan.not_selected,
        items,
        started_at,
        finished_at: now_rfc3339_millis(),
    };
    let wrote = report.items.iter().any(|i| {
        matches!(
            i.outcome,
            PromoteOutcome::Applied | PromoteOutcome::Created | PromoteOutcome::Removed
        )
    });
    report.status = if dry_run {
        PromoteStatus::DryRun
    } else if report.has_conflicts() {
        PromoteStatus::Partial
    } else if wrote {
        PromoteStatus::Promoted
    } else {
        PromoteStatus::NothingToDo
    };
    if !dry_run {
        capsule.write_recovery(RecoveryArtifact::PromoteResult, &report)?;
        let suffix: String = report
            .finished_at
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        if let Ok(h) = RecoveryArtifact::history("promote", &suffix) {
            capsule.write_recovery(h, &report)?;
        }
        capsule.recovery_event(
            "promote_finished",
            json!({ "status": report.status, "totals": report.totals }),
        )?;
    }
    Ok(report)
}
