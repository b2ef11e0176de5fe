//! Identity-checked cleanup.

use std::sync::Arc;
use std::time::Duration;

use agentdiff_backend_api::{CleanupOutcome, ProcessIdentity};
use serde_json::json;

use crate::host;
use crate::{Ctx, Finding};

/// A host `sleep` the suite owns, killed and reaped on drop.
struct Victim {
    child: std::process::Child,
    identity: ProcessIdentity,
}

impl Victim {
    fn spawn() -> Result<Self, Finding> {
        let child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .map_err(|e| {
                Finding::fail(
                    format!("suite setup: could not start sleep: {e}"),
                    json!(null),
                )
            })?;
        let identity = host::identity_of(child.id()).ok_or_else(|| {
            Finding::skip("process identities are not available on this platform")
        })?;
        Ok(Self { child, identity })
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn refuses(ctx: Arc<Ctx>, mutate: fn(&mut ProcessIdentity)) -> Finding {
    let victim = match Victim::spawn() {
        Ok(v) => v,
        Err(f) => return f,
    };
    let mut wrong = victim.identity.clone();
    mutate(&mut wrong);
    let backend = ctx.backend();
    let report = backend
        .cleanup_run(
            "conformance-cleanup",
            std::slice::from_ref(&wrong),
            Duration::from_millis(300),
        )
        .await;
    // Give a signal that was sent time to land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let alive = host::is_alive(&victim.identity);
    let outcome = report
        .records
        .iter()
        .find(|r| r.identity == wrong)
        .map(|r| r.outcome);
    let details =
        json!({"real": victim.identity, "asked": wrong, "report": report, "still_alive": alive});
    if !alive {
        return Finding::fail(
            "cleanup signalled a process whose identity did not match",
            details,
        );
    }
    if matches!(
        outcome,
        Some(CleanupOutcome::Terminated) | Some(CleanupOutcome::Killed)
    ) {
        return Finding::fail(
            "cleanup reports a process ended that it did not (and must not) end",
            details,
        );
    }
    Finding::pass(details)
}

pub async fn start_time_mismatch(ctx: Arc<Ctx>) -> Finding {
    refuses(ctx, |id| id.start_time_ticks += 1).await
}

pub async fn boot_mismatch(ctx: Arc<Ctx>) -> Finding {
    refuses(ctx, |id| {
        id.boot_id = "00000000-0000-4000-8000-000000000000".into()
    })
    .await
}

pub async fn matching_identity(ctx: Arc<Ctx>) -> Finding {
    let mut victim = match Victim::spawn() {
        Ok(v) => v,
        Err(f) => return f,
    };
    let backend = ctx.backend();
    let report = backend
        .cleanup_run(
            "conformance-cleanup",
            std::slice::from_ref(&victim.identity),
            Duration::from_millis(500),
        )
        .await;
    // The suite is the parent: reap so a zombie is not mistaken for a live process.
    let mut gone = false;
    for _ in 0..40 {
        if let Ok(Some(_)) = victim.child.try_wait() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let outcome = report
        .records
        .iter()
        .find(|r| r.identity == victim.identity)
        .map(|r| r.outcome);
    let details = json!({"identity": victim.identity, "report": report, "ended": gone});
    if !gone {
        return Finding::fail(
            "cleanup did not end a process whose identity matched",
            details,
        );
    }
    Finding::require(
        matches!(
            outcome,
            Some(CleanupOutcome::Terminated) | Some(CleanupOutcome::Killed)
        ),
        "the process ended but the cleanup report does not say terminated or killed",
        details,
    )
}
