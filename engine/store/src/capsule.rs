//! One run capsule: `.agentdiff/runs/<run-id>/` with fixed artifact names (seed 003), an
//! append-only event log, and after the seal only recovery artifacts.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};

use super::atomic;
use super::run_id::RunId;
use super::StoreError;

/// Largest artifact `read_artifact` loads (a before/after manifest of a very large tree).
pub const MAX_ARTIFACT_BYTES: u64 = 512 * 1024 * 1024;

/// The sealed transaction artifacts of a run (seed 003 names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Artifact {
    Metadata,
    Policy,
    Before,
    After,
    Runtime,
    Result,
    Events,
    Integrity,
}

impl Artifact {
    pub const ALL: [Artifact; 8] = [
        Artifact::Metadata,
        Artifact::Policy,
        Artifact::Before,
        Artifact::After,
        Artifact::Runtime,
        Artifact::Result,
        Artifact::Events,
        Artifact::Integrity,
    ];

    pub fn file_name(self) -> &'static str {
        match self {
            Artifact::Metadata => "metadata.json",
            Artifact::Policy => "policy.json",
            Artifact::Before => "before.json",
            Artifact::After => "after.json",
            Artifact::Runtime => "runtime.json",
            Artifact::Result => "result.json",
            Artifact::Events => "events.jsonl",
            Artifact::Integrity => "integrity.json",
        }
    }

    pub fn from_file_name(name: &str) -> Option<Artifact> {
        Artifact::ALL.into_iter().find(|a| a.file_name() == name)
    }
}

/// Artifacts that may be written after the seal. They never replace sealed evidence and are not
/// covered by the integrity manifest (they are rewritten by later recoveries).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RecoveryArtifact {
    RollbackResult,
    CleanupResult,
    PromoteResult,
    /// `recovery-events.jsonl`, appended through [`Capsule::recovery_event`].
    RecoveryEvents,
    /// A history entry `rollback-<x>.json`, `cleanup-<x>.json` or `promote-<x>.json`.
    History(HistoryName),
}

/// A validated history file name (see [`RecoveryArtifact::parse`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HistoryName(String);

const HISTORY_KINDS: [&str; 3] = ["rollback-", "cleanup-", "promote-"];
const MAX_HISTORY_SUFFIX: usize = 64;

impl RecoveryArtifact {
    pub fn file_name(&self) -> &str {
        match self {
            RecoveryArtifact::RollbackResult => "rollback-result.json",
            RecoveryArtifact::CleanupResult => "cleanup-result.json",
            RecoveryArtifact::PromoteResult => "promote-result.json",
            RecoveryArtifact::RecoveryEvents => "recovery-events.jsonl",
            RecoveryArtifact::History(name) => &name.0,
        }
    }

    /// Accepts the fixed recovery names and `rollback-*.json` / `cleanup-*.json` /
    /// `promote-*.json` where `*` is 1..=64 characters of `[A-Za-z0-9._-]` without `..`.
    pub fn parse(name: &str) -> Result<RecoveryArtifact, StoreError> {
        let fixed = [
            RecoveryArtifact::RollbackResult,
            RecoveryArtifact::CleanupResult,
            RecoveryArtifact::PromoteResult,
            RecoveryArtifact::RecoveryEvents,
        ];
        if let Some(found) = fixed.into_iter().find(|a| a.file_name() == name) {
            return Ok(found);
        }
        let invalid = |reason| StoreError::InvalidArtifactName {
            name: name.chars().take(160).collect(),
            reason,
        };
        let Some(kind) = HISTORY_KINDS.iter().find(|k| name.starts_with(*k)) else {
            return Err(invalid(
                "recovery artifacts are rollback-/cleanup-/promote-*.json or recovery-events.jsonl",
            ));
        };
        let Some(suffix) = name[kind.len()..].strip_suffix(".json") else {
            return Err(invalid("recovery history names end in .json"));
        };
        if suffix.is_empty() || suffix.len() > MAX_HISTORY_SUFFIX {
            return Err(invalid(
                "the part between the kind and .json must be 1 to 64 characters",
            ));
        }
        if !suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            || suffix.contains("..")
        {
            return Err(invalid("only A-Z a-z 0-9 . _ - are allowed, and no '..'"));
        }
        Ok(RecoveryArtifact::History(HistoryName(name.to_string())))
    }

    /// A history entry such as `rollback-<suffix>.json`; `kind` is "rollback", "cleanup" or
    /// "promote".
    pub fn history(kind: &str, suffix: &str) -> Result<RecoveryArtifact, StoreError> {
        let name = format!("{kind}-{suffix}.json");
        match RecoveryArtifact::parse(&name)? {
            artifact @ RecoveryArtifact::History(_) => Ok(artifact),
            _ => Err(StoreError::InvalidArtifactName {
                name,
                reason: "the suffix makes this a fixed recovery artifact name, not a history entry",
            }),
        }
    }
}

/// Current UTC time as RFC 3339 with milliseconds, e.g. `2026-11-30T01:22:33.123Z`.
pub fn now_rfc3339_millis() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

/// A run capsule. Obtain one from [`super::Store::create_run`] or [`super::Store::open_run`].
#[derive(Debug)]
pub struct Capsule {
    id: RunId,
    dir: PathBuf,
    /// Next sequence numbers of events.jsonl and recovery-events.jsonl (None until first needed).
    seqs: Mutex<Seqs>,
    /// The bytes of every transaction artifact this process wrote (runs it created only): the seal
    /// vouches for these, not for whatever is on disk (see `super::tamper`).
    pub(crate) written: Option<Mutex<super::tamper::WrittenArtifacts>>,
    /// Writes made without their own fsync, shared with the store's objects; the seal flushes
    /// them before integrity.json is written.
    pub pending: Arc<atomic::PendingSync>,
}

#[derive(Debug, Default)]
struct Seqs {
    events: Option<u64>,
    recovery: Option<u64>,
}

impl Capsule {
    pub(crate) fn new(id: RunId, dir: PathBuf, pending: Arc<atomic::PendingSync>) -> Capsule {
        Capsule {
            id,
            dir,
            seqs: Mutex::new(Seqs::default()),
            written: None,
            pending,
        }
    }

    /// A capsule for a run directory this process just created: every artifact it writes is
    /// remembered, so the seal can tell what it wrote from what changed behind its back.
    pub(crate) fn new_tracked(
        id: RunId,
        dir: PathBuf,
        pending: Arc<atomic::PendingSync>,
    ) -> Capsule {
        Capsule {
            written: Some(Mutex::default()),
            ..Capsule::new(id, dir, pending)
        }
    }

    pub fn id(&self) -> &RunId {
        &self.id
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Sealed once integrity.json exists (written last and atomically by [`Capsule::seal`]).
    pub fn is_sealed(&self) -> bool {
        fs::symlink_metadata(self.dir.join(Artifact::Integrity.file_name())).is_ok()
    }

    fn refuse_if_sealed(&self, name: &str) -> Result<(), StoreError> {
        if self.is_sealed() {
            Err(StoreError::Sealed {
                run_id: self.id.to_string(),
                name: name.to_string(),
            })
        } else {
            Ok(())
        }
    }

    /// Writes a transaction artifact (pretty JSON + newline, atomic, 0600). Refused after the
    /// seal; `events.jsonl` is written through [`Capsule::event`] and `integrity.json` only by
    /// [`Capsule::seal`].
    pub fn write_artifact<T: Serialize>(
        &self,
        artifact: Artifact,
        value: &T,
    ) -> Result<(), StoreError> {
        let name = artifact.file_name();
        match artifact {
            Artifact::Integrity => {
                return Err(StoreError::ReservedArtifact {
                    name: name.into(),
                    method: "write_artifact",
                    reason: "it is written only by seal",
                })
            }
            Artifact::Events => {
                return Err(StoreError::ReservedArtifact {
                    name: name.into(),
                    method: "write_artifact",
                    reason: "events are appended one at a time with event()",
                })
            }
            _ => {}
        }
        self.refuse_if_sealed(name)?;
        let bytes = to_pretty_json(name, value)?;
        let durability = atomic::Durability::AtSeal(&self.pending);
        atomic::write_atomic(&self.dir, name, &bytes, durability)?;
        self.remember_write(artifact, &bytes);
        Ok(())
    }

    /// Reads and deserializes an artifact (size-bounded, symlinks refused). Malformed JSON is an
    /// error naming the artifact. For `events.jsonl` use [`Capsule::read_events`].
    pub fn read_artifact<T: DeserializeOwned>(&self, artifact: Artifact) -> Result<T, StoreError> {
        let name = artifact.file_name();
        let bytes = self.read_named(name)?;
        serde_json::from_slice(&bytes).map_err(|source| StoreError::MalformedArtifact {
            run_id: self.id.to_string(),
            name: name.into(),
            source,
        })
    }

    pub fn read_artifact_value(&self, artifact: Artifact) -> Result<Value, StoreError> {
        self.read_artifact(artifact)
    }

    /// Reads a recovery artifact written earlier (e.g. the last rollback result).
    pub fn read_recovery<T: DeserializeOwned>(
        &self,
        artifact: RecoveryArtifact,
    ) -> Result<T, StoreError> {
        let name = artifact.file_name();
        let bytes = self.read_named(name)?;
        serde_json::from_slice(&bytes).map_err(|source| StoreError::MalformedArtifact {
            run_id: self.id.to_string(),
            name: name.into(),
            source,
        })
    }

    fn read_named(&self, name: &str) -> Result<Vec<u8>, StoreError> {
        atomic::read_bounded(&self.dir.join(name), MAX_ARTIFACT_BYTES)
    }

    /// Parses events.jsonl into one JSON value per line.
    pub fn read_events(&self) -> Result<Vec<Value>, StoreError> {
        self.read_jsonl(Artifact::Events.file_name())
    }

    /// The complete lines of events.jsonl from byte `offset` on, parsed, and the offset just after
    /// the last complete line: a line still being written is left for the next call. A missing
    /// file has no events yet.
    pub fn read_events_from(&self, offset: u64) -> Result<(Vec<Value>, u64), StoreError> {
        let name = Artifact::Events.file_name();
        let bytes = match self.read_named(name) {
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                return Ok((Vec::new(), offset))
            }
            other => other?,
        };
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        let tail = &bytes[start..];
        let complete = tail.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let values = tail[..complete]
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| {
                serde_json::from_slice(line).map_err(|source| StoreError::MalformedArtifact {
                    run_id: self.id.to_string(),
                    name: name.into(),
                    source,
                })
            })
            .collect::<Result<Vec<Value>, StoreError>>()?;
        Ok((values, (start + complete) as u64))
    }

    /// Parses recovery-events.jsonl (empty when no recovery happened yet).
    pub fn read_recovery_events(&self) -> Result<Vec<Value>, StoreError> {
        let name = RecoveryArtifact::RecoveryEvents.file_name();
        match self.read_jsonl(name) {
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                Ok(Vec::new())
            }
            other => other,
        }
    }

    fn read_jsonl(&self, name: &str) -> Result<Vec<Value>, StoreError> {
        let bytes = self.read_named(name)?;
        bytes
            .split(|b| *b == b'\n')
            .filter(|line| !line.is_empty())
            .map(|line| {
                serde_json::from_slice(line).map_err(|source| StoreError::MalformedArtifact {
                    run_id: self.id.to_string(),
                    name: name.into(),
                    source,
                })
            })
            .collect()
    }

    /// Appends `{ "seq", "at", "event", ...fields }` to events.jsonl and fsyncs it. `fields` must
    /// be a JSON object (or null) and may not use the keys `seq`, `at` or `event`. Refused after
    /// the seal.
    pub fn event(&self, name: &str, fields: Value) -> Result<(), StoreError> {
        self.refuse_if_sealed(Artifact::Events.file_name())?;
        let durability = atomic::Durability::AtSeal(&self.pending);
        self.append_event(Artifact::Events.file_name(), durability, name, fields)
    }

    /// Appends an event to recovery-events.jsonl (allowed before and after the seal) and fsyncs
    /// it.
    pub fn recovery_event(&self, name: &str, fields: Value) -> Result<(), StoreError> {
        let file = RecoveryArtifact::RecoveryEvents.file_name();
        self.append_event(file, atomic::Durability::Now, name, fields)
    }

    /// Notes in recovery-events.jsonl that the seal is in place, without an fsync: the seal
    /// and its ledger line are durable already, and a crash that loses this line loses only the
    /// note (the next recovery event's fsync keeps it).
    pub(crate) fn sealed_note(&self, fields: Value) -> Result<(), StoreError> {
        let file = RecoveryArtifact::RecoveryEvents.file_name();
        self.append_event(file, atomic::Durability::Unflushed, "sealed", fields)
    }

    /// `durability`: [`atomic::Durability::AtSeal`] for events.jsonl (made durable by the seal),
    /// `Now` or `Unflushed` for recovery events, which are written after the seal and stand
    /// alone.
    fn append_event(
        &self,
        file: &str,
        durability: atomic::Durability<'_>,
        name: &str,
        fields: Value,
    ) -> Result<(), StoreError> {
        let recovery = !matches!(durability, atomic::Durability::AtSeal(_));
        validate_event_name(name)?;
        let fields = match fields {
            Value::Null => Map::new(),
            Value::Object(map) => map,
            other => {
                return Err(StoreError::InvalidEvent(format!(
                    "fields of event '{name}' must be a JSON object, not {}",
                    json_kind(&other)
                )))
            }
        };
        for reserved in ["seq", "at", "event"] {
            if fields.contains_key(reserved) {
                return Err(StoreError::InvalidEvent(format!(
                    "event '{name}' uses the reserved field '{reserved}'"
                )));
            }
        }
        let mut seqs = self.seqs.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = if recovery {
            &mut seqs.recovery
        } else {
            &mut seqs.events
        };
        let seq = match *slot {
            Some(seq) => seq,
            None => self.count_lines(file)?,
        };
        let mut line = Map::new();
        line.insert("seq".into(), Value::from(seq));
        line.insert("at".into(), Value::from(now_rfc3339_millis()));
        line.insert("event".into(), Value::from(name));
        line.extend(fields);
        let text = serde_json::to_string(&Value::Object(line)).map_err(|source| {
            StoreError::Serialize {
                name: file.into(),
                source,
            }
        })?;
        atomic::append_line(&self.dir, file, &text, durability)?;
        if !recovery {
            self.remember_append(Artifact::Events, &text);
        }
        *slot = Some(seq + 1);
        Ok(())
    }

    /// Number of complete lines already in an event log (the next sequence number).
    fn count_lines(&self, file: &str) -> Result<u64, StoreError> {
        match atomic::read_bounded(&self.dir.join(file), MAX_ARTIFACT_BYTES) {
            Ok(bytes) => Ok(bytes.iter().filter(|b| **b == b'\n').count() as u64),
            Err(StoreError::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Writes a recovery artifact (pretty JSON, atomic). Allowed before and after the seal; it
    /// never touches sealed evidence. `recovery-events.jsonl` is appended with
    /// [`Capsule::recovery_event`] instead.
    pub fn write_recovery<T: Serialize>(
        &self,
        artifact: RecoveryArtifact,
        value: &T,
    ) -> Result<(), StoreError> {
        let name = artifact.file_name();
        if artifact == RecoveryArtifact::RecoveryEvents {
            return Err(StoreError::ReservedArtifact {
                name: name.into(),
                method: "write_recovery",
                reason: "recovery events are appended one at a time with recovery_event()",
            });
        }
        let bytes = to_pretty_json(name, value)?;
        atomic::write_atomic(&self.dir, name, &bytes, atomic::Durability::Now)
    }
}

fn validate_event_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(StoreError::InvalidEvent(format!(
            "event name {:?} must be 1 to 64 characters of a-z 0-9 _ .",
            name.chars().take(80).collect::<String>()
        )))
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(crate) fn to_pretty_json<T: Serialize>(name: &str, value: &T) -> Result<Vec<u8>, StoreError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|source| StoreError::Serialize {
        name: name.into(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_names_round_trip() {
        for a in Artifact::ALL {
            assert_eq!(Artifact::from_file_name(a.file_name()), Some(a));
        }
        assert_eq!(Artifact::from_file_name("backup"), None);
    }

    #[test]
    fn recovery_names() {
        for ok in [
            "rollback-result.json",
            "cleanup-result.json",
            "promote-result.json",
            "recovery-events.jsonl",
            "rollback-20261130T012233Z.json",
            "cleanup-2.json",
            "promote-a_b.c.json",
        ] {
            assert_eq!(RecoveryArtifact::parse(ok).unwrap().file_name(), ok);
        }
        for bad in [
            "result.json",
            "integrity.json",
            "rollback-.json",
            "rollback-x.txt",
            "rollback-../x.json",
            "rollback-a/b.json",
            "rollback-a..b.json",
            "rollback-\0.json",
            "other.json",
            "",
        ] {
            assert!(
                matches!(
                    RecoveryArtifact::parse(bad),
                    Err(StoreError::InvalidArtifactName { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            RecoveryArtifact::history("rollback", "2")
                .unwrap()
                .file_name(),
            "rollback-2.json"
        );
        assert!(RecoveryArtifact::history("rollback", "result").is_err());
        assert!(RecoveryArtifact::history("delete", "x").is_err());
    }

    #[test]
    fn event_names_and_fields_are_validated() {
        assert!(validate_event_name("before_captured").is_ok());
        assert!(validate_event_name("").is_err());
        assert!(validate_event_name("Bad Name").is_err());
        assert!(validate_event_name("a\nb").is_err());
    }

    #[test]
    fn millis_timestamp_shape() {
        let at = now_rfc3339_millis();
        assert_eq!(at.len(), "2026-11-30T01:22:33.123Z".len(), "{at}");
        assert!(at.ends_with('Z'));
        assert_eq!(&at[19..20], ".");
    }
}
