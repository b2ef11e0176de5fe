//! Process identities, including a daemonised grandchild.

use std::sync::Arc;
use std::time::Duration;

use agentdiff_backend_api::{Enforcement, ProcessIdentity, ProcessRelation, Tracking};
use serde_json::json;

use super::{scratch_failure, stage_failure};
use crate::harness::{self, Ran, Scratch};
use crate::host;
use crate::probes::programs::{daemon_invocation, heartbeat_alive, reap_daemon};
use crate::{Ctx, Finding};

pub async fn root_identity(ctx: Arc<Ctx>) -> Finding {
    let backend = ctx.backend();
    let scratch = match ctx.scratch() {
        Ok(s) => s,
        Err(e) => return scratch_failure(e),
    };
    let ran = match harness::run(backend.as_ref(), &scratch, &ctx.sh("sleep 0.3")).await {
        Ok(r) => r,
        Err(stage) => return stage_failure(stage),
    };
    let boot = host::boot_id().ok();
    let roots: Vec<_> = ran
        .evidence
        .processes
        .iter()
        .filter(|p| p.relation == ProcessRelation::Root)
        .collect();
    let details = json!({"pid": ran.pid, "roots": roots, "host_boot_id": boot, "tracking": ran.evidence.tracking});
    let Some(root) = roots.first() else {
        return Finding::fail("no process is recorded as the root", details);
    };
    if roots.len() != 1 {
        return Finding::fail("more than one process is recorded as the root", details);
    }
    if ran.pid.is_some_and(|p| p != root.identity.pid) {
        return Finding::fail(
            "the recorded root pid differs from the launched pid",
            details,
        );
    }
    if root.identity.start_time_ticks == 0 || root.identity.pid == 0 {
        return Finding::fail("the root identity has no start time or pid", details);
    }
    if boot.as_deref() != Some(root.identity.boot_id.as_str()) {
        return Finding::fail("the root identity does not carry this boot's id", details);
    }
    if ran.evidence.tracking == Tracking::Untracked {
        return Finding::fail("evidence does not say how processes were tracked", details);
    }
    Finding::pass(details)
}

struct DaemonRun {
    ran: Ran,
    daemon: Option<ProcessIdentity>,
    token: String,
    scratch: Scratch,
}

async fn run_daemon(ctx: &Ctx) -> Result<DaemonRun, Finding> {
    let backend = ctx.backend();
    let scratch = ctx.scratch().map_err(scratch_failure)?;
    let token = host::random_token();
    let inv = daemon_invocation(&token).options(&ctx.options.backend_options);
    let started = harness::start(backend.as_ref(), &scratch, &inv)
        .await
        .map_err(stage_failure)?;
    // Look for the daemon's host identity for as long as the command runs (the root waits for
    // the daemon's first heartbeat, then 1 s), while the backend's `wait` is driven alongside:
    // a fixed window before `wait` misses a daemon that starts late on a loaded machine.
    let name = format!("agentdiff-probe-daemon-{token}");
    let mut daemon = None;
    let finish = started.finish();
    tokio::pin!(finish);
    let ran = loop {
        tokio::select! {
            ran = &mut finish => break ran,
            _ = tokio::time::sleep(Duration::from_millis(50)), if daemon.is_none() => {
                // The daemon is the `sh` whose $0 is the name; a short-lived subshell may match
                // first.
                daemon = host::find_by_cmdline(&name).into_iter().next();
            }
        }
    }
    .map_err(stage_failure)?;
    Ok(DaemonRun {
        ran,
        daemon,
        token,
        scratch,
    })
}

pub async fn daemon_recorded(ctx: Arc<Ctx>) -> Finding {
    let mut run = match run_daemon(&ctx).await {
        Ok(r) => r,
        Err(f) => return f,
    };
    reap_daemon(&run.token);
    // A daemon never seen on the host says nothing about the backend (the probe's own start
    // failed, or a loaded machine's search missed it): one more try before the check gives up on it.
    let mut attempts = 1;
    if run.daemon.is_none() && run.ran.evidence.enforcement != Enforcement::ContainerRequested {
        run = match run_daemon(&ctx).await {
            Ok(r) => r,
            Err(f) => return f,
        };
        reap_daemon(&run.token);
        attempts = 2;
    }
    let recorded: Vec<_> = run
        .ran
        .evidence
        .processes
        .iter()
        .map(
            |p| json!({"identity": p.identity, "relation": p.relation, "executable": p.executable}),
        )
        .collect();
    let details = json!({"daemon_host_identity": run.daemon, "recorded": recorded, "tracking": run.ran.evidence.tracking, "attempts": attempts});
    if run.ran.evidence.enforcement == Enforcement::ContainerRequested {
        return Finding::skip("the command ran in a container; its processes are the engine's to track, not host identities");
    }
    let Some(daemon) = run.daemon else {
        return Finding::fail(
            "the daemon was never seen on the host, so its recording could not be checked",
            details,
        );
    };
    let found = run.ran.evidence.processes.iter().any(|p| {
        p.identity.pid == daemon.pid
            && p.identity.start_time_ticks == daemon.start_time_ticks
            && p.relation != ProcessRelation::Root
    });
    Finding::require(
        found,
        format!(
            "the daemonised grandchild (pid {}) is not among the recorded processes",
            daemon.pid
        ),
        details,
    )
}

pub async fn daemon_ended(ctx: Arc<Ctx>) -> Finding {
    let run = match run_daemon(&ctx).await {
        Ok(r) => r,
        Err(f) => return f,
    };
    let hb = run.scratch.work_file("probe-heartbeat");
    let started = hb.exists();
    let alive = started && heartbeat_alive(&hb, Duration::from_millis(1200)).await;
    let still = run.daemon.as_ref().is_some_and(host::is_alive);
    let reaped = reap_daemon(&run.token);
    let details = json!({"heartbeat_seen": started, "alive_after_wait": alive || still, "reaped_by_suite": reaped, "cleanup": run.ran.evidence.cleanup});
    if !started {
        return Finding::fail(
            "the daemon never started, so its ending could not be checked",
            details,
        );
    }
    Finding::require(
        !alive && !still,
        "a daemonised grandchild outlived wait()",
        details,
    )
}
