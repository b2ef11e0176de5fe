//! Whether a capsule's process evidence may be acted on (`agentdiff cleanup` signals the processes
//! it names, so a forged capsule must not be able to name an unrelated process).

use serde_json::Value;

use super::super::{Capsule, Event, ObjectStore, StoreError, Verdict};
use super::{launch_event_authenticates, VerifyContext};

/// Which evidence authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustedEvidence {
    /// The sealed capsule authenticates: runtime.json may be used.
    Sealed,
    /// The run was never sealed (its monitor died) and its `launched` event carries this user's
    /// MAC: only that event may be used.
    LaunchEvent,
    /// The run was never sealed and never launched anything.
    NothingLaunched,
}

/// Why a capsule's process evidence does not authenticate.
#[derive(Debug, thiserror::Error)]
pub enum Untrusted {
    #[error("the capsule is intact but not authenticated ({detail})")]
    NotAuthenticated { detail: String },
    #[error("the capsule is forged ({})", .why.join("; "))]
    Forged { why: Vec<String> },
    #[error(
        "the run is not sealed and there is no seal key for this user here to check its \
         `launched` event"
    )]
    NoKey,
    #[error("its event log cannot be read ({0})")]
    Events(#[source] StoreError),
    #[error(
        "the run is not sealed and its `launched` event does not carry this user's MAC \
         (forged, or recorded with another key)"
    )]
    LaunchEventNotAuthenticated,
    #[error("the run is not sealed and its event log holds more than one `launched` event")]
    SeveralLaunchEvents,
}

/// `Ok` with the evidence that authenticated, or `Err` with why nothing did.
pub fn trusted_process_evidence(
    capsule: &Capsule,
    objects: &ObjectStore,
    ctx: &VerifyContext,
) -> Result<Result<TrustedEvidence, Untrusted>, StoreError> {
    // A capsule whose seal was deleted is judged by its verdict (forged), never by its launch
    // event as if it had been interrupted.
    if capsule.is_sealed() || ctx.ledger_records_seal(capsule.id().as_str()) {
        let report = capsule.verify_with(objects, ctx)?;
        return Ok(match report.verdict {
            Verdict::Authenticated => Ok(TrustedEvidence::Sealed),
            Verdict::IntactNotAuthenticated => Err(Untrusted::NotAuthenticated {
                detail: report.authentication.detail,
            }),
            _ => {
                let mut why: Vec<String> = report
                    .problems
                    .iter()
                    .map(|p| format!("{}: {}", p.subject, p.problem))
                    .collect();
                if report.authentication.is_forged() {
                    why.insert(0, report.authentication.detail.clone());
                }
                Err(Untrusted::Forged { why })
            }
        });
    }
    let Some(key) = &ctx.key else {
        return Ok(Err(Untrusted::NoKey));
    };
    let events = match capsule.events() {
        Ok(events) => events,
        Err(e) => return Ok(Err(Untrusted::Events(e))),
    };
    let launched: Vec<&Event> = events
        .iter()
        .filter(|e| e.event == super::super::doc::LAUNCHED_EVENT)
        .collect();
    Ok(match launched.as_slice() {
        [] => Ok(TrustedEvidence::NothingLaunched),
        [one]
            if launch_event_authenticates(
                key,
                capsule.id().as_str(),
                &Value::Object(one.fields.clone()),
            ) =>
        {
            Ok(TrustedEvidence::LaunchEvent)
        }
        [_] => Err(Untrusted::LaunchEventNotAuthenticated),
        _ => Err(Untrusted::SeveralLaunchEvents),
    })
}
