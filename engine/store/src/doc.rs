//! The typed capsule: the documents a run writes and the one reader every consumer (verify,
//! inspect, rollback, promote, cleanup) goes through. The transaction writes the same types, so
//! a field is named once; `docs/schemas/*.schema.json` stay the contract and are checked against
//! real capsules in tests.
//!
//! Reading is strict: a document that does not deserialize into its type is
//! [`StoreError::MalformedArtifact`], never a partly-read value.

use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use super::{Artifact, Capsule, ObjectStore, StoreError};
pub use crate::schema::{ChangeRecord, Metadata, RunResult, VerifiedControl};
pub use agentdiff_backend_api::LaunchFacts;
use agentdiff_backend_api::RunEvidence;
use agentdiff_host::redact;
use agentdiff_policy::{Policy, PolicySource, RollbackSettings};
use agentdiff_scan::Manifest;

/// `policy.json`: where the policy came from and the effective policy with every default filled
/// in (itself a valid policy document of `policy_version`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyDoc {
    pub schema_version: u32,
    pub source: PolicySource,
    pub policy_version: u32,
    pub effective: EffectivePolicy,
}

impl PolicyDoc {
    /// The recorded form of the policy a run is given.
    pub fn of(loaded: &agentdiff_policy::LoadedPolicy) -> Result<PolicyDoc, serde_json::Error> {
        Ok(PolicyDoc {
            schema_version: crate::SCHEMA_VERSION,
            source: loaded.source.clone(),
            policy_version: loaded.policy.version(),
            effective: serde_json::from_value(loaded.policy.to_json())?,
        })
    }
}

/// The policy a run recorded in `capsule_dir/policy.json`, read while the run is still open (by
/// backends that hand its deny patterns to a sandbox); `None` when the directory has no
/// `policy.json` (a launch outside a transaction). A `policy.json` that is there but not a
/// policy is an error, never "no policy".
pub fn recorded_policy(capsule_dir: &Path) -> Result<Option<Policy>, StoreError> {
    recorded_effective(capsule_dir, Policy::from_yaml_or_json)
}

/// Reads `policy.json`'s `effective` document and hands its text to `parse`.
fn recorded_effective<T>(
    capsule_dir: &Path,
    parse: impl FnOnce(&str, &str) -> Result<T, agentdiff_policy::PolicyError>,
) -> Result<Option<T>, StoreError> {
    /// Only `effective` is needed here; the rest of the document is not checked.
    #[derive(Deserialize)]
    struct Effective {
        effective: Value,
    }
    let path = capsule_dir.join(Artifact::Policy.file_name());
    let bytes = match super::atomic::read_bounded(&path, super::MAX_ARTIFACT_BYTES) {
        Ok(b) => b,
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let doc: Effective =
        serde_json::from_slice(&bytes).map_err(|source| StoreError::MalformedArtifact {
            run_id: capsule_dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            name: Artifact::Policy.file_name().into(),
            source,
        })?;
    parse(&doc.effective.to_string(), &path.to_string_lossy())
        .map(Some)
        .map_err(|source| StoreError::RecordedPolicy { path, source })
}

/// The effective policy as recorded. Only the sections recovery acts on are typed; the whole
/// document is kept so `inspect` shows it unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EffectivePolicy {
    pub rollback: RollbackSettings,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `runtime.json`: the backend's evidence for a launched command, or why nothing was launched.
/// The `launched` field says which.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum RuntimeDoc {
    Launched(Box<LaunchedRuntime>),
    NotLaunched(NotLaunched),
}

/// The evidence of a launched command, as stored (wrapper argv and sensitive configuration
/// redacted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchedRuntime {
    pub schema_version: u32,
    /// Always `true`.
    pub launched: bool,
    #[serde(flatten)]
    pub evidence: RunEvidence,
    /// Controls a recorded probe verified here (empty unless the run was given probe records).
    #[serde(default)]
    pub verified_controls: Vec<VerifiedControl>,
    /// What agentdiff's egress proxy saw, when the run had one (`network.egress` allowed
    /// anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkEvidence>,
}

/// `runtime.json`'s `network`: the connections the run's egress proxy decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NetworkEvidence {
    /// Every connection attempt through the proxy, bounded (see [`agentdiff_egress::EgressLog`]).
    pub egress: agentdiff_egress::EgressLog,
}

/// A run whose command was never launched.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotLaunched {
    pub schema_version: u32,
    /// Always `false`.
    pub launched: bool,
    pub backend: String,
    /// Set when the backend said it cannot run here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability: Option<Unavailable>,
    /// Set when the backend refused or failed the launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Why a backend cannot run here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// Always `unavailable`.
    pub state: AvailabilityState,
    pub reason: String,
    pub remedy: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AvailabilityState {
    Unavailable,
}

impl RuntimeDoc {
    /// The stored form of a backend's evidence: the wrapper argv redacted, sensitive keys in
    /// `runtime_config` and `wrapper` redacted.
    pub fn launched(
        evidence: &RunEvidence,
        verified_controls: &[VerifiedControl],
        network: Option<NetworkEvidence>,
    ) -> RuntimeDoc {
        let mut evidence = evidence.clone();
        if let Some(argv) = &evidence.wrapper_argv {
            evidence.wrapper_argv = Some(redact::redact_argv(argv));
        }
        redact::redact_value(&mut evidence.runtime_config);
        if let Some(w) = evidence.wrapper.as_mut() {
            redact::redact_value(w);
        }
        RuntimeDoc::Launched(Box::new(LaunchedRuntime {
            schema_version: crate::RUNTIME_SCHEMA_VERSION,
            launched: true,
            evidence,
            verified_controls: verified_controls.to_vec(),
            network,
        }))
    }

    /// A backend that said it cannot run here.
    pub fn unavailable(backend: &str, reason: String, remedy: String) -> RuntimeDoc {
        RuntimeDoc::NotLaunched(NotLaunched {
            schema_version: crate::RUNTIME_SCHEMA_VERSION,
            launched: false,
            backend: backend.to_string(),
            availability: Some(Unavailable {
                state: AvailabilityState::Unavailable,
                reason,
                remedy,
            }),
            error: None,
        })
    }

    /// A launch the backend refused or could not start.
    pub fn refused(backend: &str, error: String) -> RuntimeDoc {
        RuntimeDoc::NotLaunched(NotLaunched {
            schema_version: crate::RUNTIME_SCHEMA_VERSION,
            launched: false,
            backend: backend.to_string(),
            availability: None,
            error: Some(error),
        })
    }

    /// The backend that recorded the run.
    pub fn backend(&self) -> &str {
        match self {
            RuntimeDoc::Launched(l) => &l.evidence.backend,
            RuntimeDoc::NotLaunched(n) => &n.backend,
        }
    }

    /// The launched command's evidence, if it was launched.
    pub fn evidence(&self) -> Option<&RunEvidence> {
        match self {
            RuntimeDoc::Launched(l) => Some(&l.evidence),
            RuntimeDoc::NotLaunched(_) => None,
        }
    }

    /// What the run's egress proxy saw, when it had one.
    pub fn network(&self) -> Option<&NetworkEvidence> {
        match self {
            RuntimeDoc::Launched(l) => l.network.as_ref(),
            RuntimeDoc::NotLaunched(_) => None,
        }
    }
}

impl<'de> Deserialize<'de> for RuntimeDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        // `launched` is the tag; serde's internal tagging only takes strings.
        let value = Value::deserialize(deserializer)?;
        match value.get("launched") {
            Some(Value::Bool(true)) => serde_json::from_value(value)
                .map(|l| RuntimeDoc::Launched(Box::new(l)))
                .map_err(D::Error::custom),
            Some(Value::Bool(false)) => serde_json::from_value(value)
                .map(RuntimeDoc::NotLaunched)
                .map_err(D::Error::custom),
            _ => Err(D::Error::custom("`launched` must be true or false")),
        }
    }
}

/// One line of `events.jsonl` or `recovery-events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    pub seq: u64,
    pub at: String,
    pub event: String,
    /// The event's own fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// Name of the event that records a launch.
pub const LAUNCHED_EVENT: &str = "launched";

impl Event {
    /// The facts of a `launched` event (`None` for any other event).
    pub fn launched(&self) -> Option<Result<LaunchFacts, serde_json::Error>> {
        (self.event == LAUNCHED_EVENT)
            .then(|| serde_json::from_value(Value::Object(self.fields.clone())))
    }
}

impl Capsule {
    fn malformed(&self, artifact: Artifact, source: serde_json::Error) -> StoreError {
        StoreError::MalformedArtifact {
            run_id: self.id().to_string(),
            name: artifact.file_name().into(),
            source,
        }
    }

    /// `metadata.json`.
    pub fn metadata(&self) -> Result<Metadata, StoreError> {
        self.read_artifact(Artifact::Metadata)
    }

    /// `policy.json`.
    pub fn policy_doc(&self) -> Result<PolicyDoc, StoreError> {
        self.read_artifact(Artifact::Policy)
    }

    /// `runtime.json`.
    pub fn runtime(&self) -> Result<RuntimeDoc, StoreError> {
        self.read_artifact(Artifact::Runtime)
    }

    /// `result.json`.
    pub fn result(&self) -> Result<RunResult, StoreError> {
        self.read_artifact(Artifact::Result)
    }

    /// `events.jsonl`, one typed event per line.
    pub fn events(&self) -> Result<Vec<Event>, StoreError> {
        self.read_events()?
            .into_iter()
            .map(|v| serde_json::from_value(v).map_err(|e| self.malformed(Artifact::Events, e)))
            .collect()
    }

    /// The events of events.jsonl from byte `offset` on (complete lines only), and the offset to
    /// continue from: for following a run in progress.
    pub fn events_from(&self, offset: u64) -> Result<(Vec<Event>, u64), StoreError> {
        let (values, next) = self.read_events_from(offset)?;
        let events = values
            .into_iter()
            .map(|v| serde_json::from_value(v).map_err(|e| self.malformed(Artifact::Events, e)))
            .collect::<Result<Vec<Event>, StoreError>>()?;
        Ok((events, next))
    }

    /// The last `launched` event's facts, if the command was launched.
    pub fn launched_event(&self) -> Result<Option<LaunchFacts>, StoreError> {
        let events = self.events()?;
        match events.iter().rev().find_map(Event::launched) {
            Some(facts) => facts
                .map(Some)
                .map_err(|e| self.malformed(Artifact::Events, e)),
            None => Ok(None),
        }
    }

    /// The before- or after-manifest whole: entries from their (verified) object, or, from older
    /// capsules, inline in the artifact.
    pub fn manifest(
        &self,
        artifact: Artifact,
        objects: &ObjectStore,
    ) -> Result<Manifest, StoreError> {
        match self.manifest_entries_object(artifact)? {
            Some(_) => self.read_manifest(artifact, objects),
            None => self.read_artifact(artifact),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_docs_round_trip_by_their_launched_tag() {
        let launched = RuntimeDoc::launched(
            &RunEvidence {
                backend: "b".into(),
                wrapper_argv: Some(vec!["srt".into(), "--token".into(), "s3cret".into()]),
                ..RunEvidence::default()
            },
            &[],
            None,
        );
        let value = serde_json::to_value(&launched).unwrap();
        assert_eq!(value["launched"], Value::Bool(true));
        assert!(!value.to_string().contains("s3cret"), "{value}");
        let back: RuntimeDoc = serde_json::from_value(value).unwrap();
        assert_eq!(back, launched);
        assert_eq!(back.backend(), "b");

        for doc in [
            RuntimeDoc::unavailable("b", "no srt".into(), "install it".into()),
            RuntimeDoc::refused("b", "bad option".into()),
        ] {
            let value = serde_json::to_value(&doc).unwrap();
            assert_eq!(value["launched"], Value::Bool(false));
            let back: RuntimeDoc = serde_json::from_value(value).unwrap();
            assert_eq!(back, doc);
            assert!(back.evidence().is_none());
        }
    }

    #[test]
    fn a_malformed_launched_doc_is_never_read_as_not_launched() {
        // `launched: true` with a broken process list must fail, not fall back to the smaller
        // not-launched shape (which would hide the processes cleanup needs).
        let doc = serde_json::json!({
            "schema_version": 1, "launched": true, "backend": "b", "processes": [{}]
        });
        assert!(serde_json::from_value::<RuntimeDoc>(doc).is_err());
        let untagged = serde_json::json!({ "schema_version": 1, "backend": "b" });
        assert!(serde_json::from_value::<RuntimeDoc>(untagged).is_err());
    }

    #[test]
    fn launched_events_are_typed() {
        let event: Event = serde_json::from_value(serde_json::json!({
            "seq": 3, "at": "t", "event": "launched", "pid": 7, "cgroup": "/sys/fs/cgroup/agentdiff-x"
        }))
        .unwrap();
        let facts = event.launched().unwrap().unwrap();
        assert_eq!(facts.pid, Some(7));
        assert_eq!(facts.cgroup.as_deref(), Some("/sys/fs/cgroup/agentdiff-x"));
        let other: Event =
            serde_json::from_value(serde_json::json!({"seq": 0, "at": "t", "event": "exited"}))
                .unwrap();
        assert!(other.launched().is_none());
    }
}
