//! The seal (integrity.json) and its verification.
//!
//! A seal of the current format (`seal_format` 2) binds, in one canonical body: the run id, the
//! seal time, the SHA-256 of every transaction artifact present, and every object the run
//! references (backups and manifest entries). `digest` is the SHA-256 of that body; `mac` is an
//! HMAC-SHA256 of it under the per-user key (see [`super::seal`]). The file must be exactly the
//! canonical pretty serialisation, so any edit of integrity.json itself — a flipped bit in
//! `sealed_at`, a renamed `run_id`, a dropped object — is detected even without the key.
//!
//! `verify` also knows what a capsule must contain independently of the seal's own list: the
//! always-present artifacts, the ones the sealed event log says were written, and every object the
//! sealed manifests reference. Missing, extra or altered entries are each named.
//!
//! What this does not defend, by itself: a writer who can recompute everything (the whole capsule
//! and its digest) produces an intact capsule; only the MAC (which needs the key) and the ledger
//! (outside the project) tell it apart from a genuine one. Seals of the previous format
//! (`seal_format` absent) carry no digest and no MAC; `verify` names them as older and checks what
//! they record.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;

use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::atomic;
use super::capsule::{
    now_rfc3339_millis, to_pretty_json, Artifact, Capsule, RecoveryArtifact, MAX_ARTIFACT_BYTES,
};
use super::manifest::ManifestObject;
use super::objects::{validate_object_id, ObjectStore};
use super::run_id::RunId;
use super::seal::{Authentication, SealAuthority, VerifyContext};
use super::StoreError;
use crate::SCHEMA_VERSION;

pub const ALGORITHM: &str = "sha256";
/// Format of integrity.json written by this version.
pub const SEAL_FORMAT: u32 = 2;
pub const MAC_ALGORITHM: &str = "hmac-sha256";

/// Artifacts every sealed capsule holds, whatever happened in the run.
const ALWAYS_REQUIRED: [Artifact; 4] = [
    Artifact::Metadata,
    Artifact::Policy,
    Artifact::Result,
    Artifact::Events,
];

/// Contents of integrity.json (current format).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Integrity {
    pub schema_version: u32,
    pub seal_format: u32,
    pub algorithm: String,
    pub run_id: String,
    pub sealed_at: String,
    /// Artifact file name → lowercase hex SHA-256 of its bytes.
    pub artifacts: BTreeMap<String, String>,
    /// Objects the run references (sorted, deduplicated).
    pub objects: Vec<String>,
    /// SHA-256 of the canonical body (every field above, compact JSON, in this order).
    pub digest: String,
    /// HMAC of the same body under the per-user key; `None` for a seal made without a key.
    pub mac: Option<SealMac>,
    /// Ed25519 signature of the same body (behind a context string) by the sealer's signing key;
    /// absent in seals made without a key and in capsules sealed before signing existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<super::seal::SealSignature>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealMac {
    pub algorithm: String,
    /// [`super::seal::SealKey::id`] of the key that made it.
    pub key_id: String,
    pub value: String,
}

/// integrity.json of the previous format (no `seal_format`, digest or MAC).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyIntegrity {
    pub schema_version: u32,
    pub algorithm: String,
    pub run_id: String,
    pub sealed_at: String,
    pub artifacts: BTreeMap<String, String>,
    pub objects: Vec<String>,
}

#[derive(Serialize)]
struct SealBody<'a> {
    schema_version: u32,
    seal_format: u32,
    algorithm: &'a str,
    run_id: &'a str,
    sealed_at: &'a str,
    artifacts: &'a BTreeMap<String, String>,
    objects: &'a [String],
}

impl Integrity {
    /// The bytes the digest and the MAC cover.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&SealBody {
            schema_version: self.schema_version,
            seal_format: self.seal_format,
            algorithm: &self.algorithm,
            run_id: &self.run_id,
            sealed_at: &self.sealed_at,
            artifacts: &self.artifacts,
            objects: &self.objects,
        })
        .unwrap_or_default()
    }

    pub fn compute_digest(&self) -> String {
        hex::encode(Sha256::digest(self.body()))
    }
}

/// Which seal a capsule carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SealFormatKind {
    /// No integrity.json.
    None,
    /// The previous format: artifact hashes and objects only.
    Legacy,
    Current,
    /// integrity.json exists but is not a seal of any known format.
    Unreadable,
}

/// The one-word answer of `verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Intact, and the seal's MAC checks under this user's key.
    Authenticated,
    /// Everything matches the seal, but the seal could not be authenticated here (no key, another
    /// key, no MAC, or an older format). Anyone able to rewrite the whole capsule could have made it.
    IntactNotAuthenticated,
    /// Something does not match: an artifact, an object, the seal itself, its MAC or the ledger.
    Forged,
    /// No seal, and this user's ledger records none: the run never finished (interrupted, or
    /// still running). A capsule without its seal that the ledger records as sealed is `Forged`.
    Unsealed,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub run_id: RunId,
    /// integrity.json exists.
    pub sealed: bool,
    /// Sealed and no problem found (intact; see `verdict` for authenticity).
    pub ok: bool,
    pub verdict: Verdict,
    pub format: SealFormatKind,
    pub authentication: Authentication,
    pub problems: Vec<VerifyProblem>,
    /// What could not be checked, and why (never a problem by itself).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyProblem {
    /// An artifact file name, a directory entry name, `object <hex>`, or `ledger`.
    pub subject: String,
    pub problem: String,
}

/// Collects problems and notes while verifying.
#[derive(Default)]
pub(crate) struct Findings {
    pub(crate) problems: Vec<VerifyProblem>,
    pub(crate) notes: Vec<String>,
    /// integrity.json is missing although this user's ledger records the run's seal.
    pub(crate) seal_deleted: bool,
}

impl Findings {
    pub(crate) fn problem(&mut self, subject: &str, text: impl Into<String>) {
        self.problems.push(VerifyProblem {
            subject: subject.to_string(),
            problem: text.into(),
        });
    }
}

/// What was found in integrity.json.
enum ParsedSeal {
    Current(Box<Integrity>, Vec<u8>),
    Legacy(LegacyIntegrity),
}

impl Capsule {
    /// Seals without a key: the seal is complete and self-checking but verifies only as intact,
    /// never as authenticated. The transaction seals with [`Capsule::seal_with`].
    pub fn seal(&self, referenced_objects: &[String]) -> Result<Integrity, StoreError> {
        self.seal_with(referenced_objects, None)
    }

    /// Seals the run: records a final `sealing` event in events.jsonl, writes integrity.json over
    /// every transaction artifact present and the referenced objects, MACs it with the
    /// authority's key and appends it to the authority's ledger; once that is durable, `sealed` is
    /// appended to recovery-events.jsonl (outside the seal, without an fsync of its own). After
    /// this only recovery artifacts may be written. Refuses a directory holding anything other
    /// than transaction or recovery artifacts.
    pub fn seal_with(
        &self,
        referenced_objects: &[String],
        authority: Option<&SealAuthority>,
    ) -> Result<Integrity, StoreError> {
        if self.is_sealed() {
            return Err(StoreError::AlreadySealed {
                run_id: self.id().to_string(),
            });
        }
        for hex in referenced_objects {
            validate_object_id(hex)?;
        }
        let objects: Vec<String> = referenced_objects
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();

        // Check the directory before recording the seal event, so a refused seal leaves the
        // event log untouched.
        self.sealable_artifacts()?;
        // `sealing` is covered by the seal; `sealed` is logged only once integrity.json is
        // durable (below), so a log never claims a seal that a crash prevented.
        self.event("sealing", json!({ "objects": objects.len() }))?;
        // What this process wrote is what gets sealed: anything changed on disk behind its back
        // is put back from memory first (in-run tamper detection reports it separately).
        self.restore_written_artifacts()?;

        let mut artifacts = BTreeMap::new();
        for artifact in self.sealable_artifacts()? {
            let name = artifact.file_name();
            let hex = match self.written_digest(artifact) {
                Some(hex) => hex,
                None => atomic::hash_file(&self.dir().join(name))?.0,
            };
            artifacts.insert(name.to_string(), hex);
        }
        let mut integrity = Integrity {
            schema_version: SCHEMA_VERSION,
            seal_format: SEAL_FORMAT,
            algorithm: ALGORITHM.to_string(),
            run_id: self.id().to_string(),
            sealed_at: now_rfc3339_millis(),
            artifacts,
            objects,
            digest: String::new(),
            mac: None,
            signature: None,
        };
        integrity.digest = integrity.compute_digest();
        if let Some(authority) = authority {
            integrity.mac = Some(authority.mac_seal(&integrity));
            integrity.signature = Some(authority.sign_seal(&integrity));
        }
        let name = Artifact::Integrity.file_name();
        let bytes = to_pretty_json(name, &integrity)?;
        // Artifacts, events, backup and tree objects (and the directories they were created in)
        // were written without their own fsync; exactly those are made durable, with the seal's
        // own bytes, before the seal is renamed into place (see `atomic::PendingSync`).
        atomic::write_atomic_after(self.dir(), name, &bytes, &self.pending)?;
        if let Some(authority) = authority {
            authority.record(&integrity)?;
        }
        self.sealed_note(json!({ "objects": integrity.objects.len() }))?;
        Ok(integrity)
    }

    /// The transaction artifacts present in the run directory; errors on anything unexpected.
    fn sealable_artifacts(&self) -> Result<Vec<Artifact>, StoreError> {
        let mut found = Vec::new();
        let entries =
            fs::read_dir(self.dir()).map_err(|e| StoreError::io("list", self.dir(), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", self.dir(), e))?;
            let name = entry.file_name();
            let unexpected = || StoreError::UnexpectedEntry {
                run_id: self.id().to_string(),
                name: name.to_string_lossy().into_owned(),
            };
            let Some(name_str) = name.to_str() else {
                return Err(unexpected());
            };
            if let Some(artifact) = Artifact::from_file_name(name_str) {
                let file_type = entry
                    .file_type()
                    .map_err(|e| StoreError::io("inspect", entry.path(), e))?;
                if !file_type.is_file() {
                    return Err(StoreError::NotRegularFile {
                        path: entry.path(),
                        reason: "a transaction artifact must be a regular file",
                    });
                }
                found.push(artifact);
            } else if RecoveryArtifact::parse(name_str).is_err() {
                return Err(unexpected());
            }
        }
        found.sort();
        Ok(found)
    }

    /// Verifies without a key or ledger (intact at best). See [`Capsule::verify_with`].
    pub fn verify(&self, objects: &ObjectStore) -> Result<VerifyReport, StoreError> {
        self.verify_with(objects, &VerifyContext::default())
    }

    /// Checks the seal: integrity.json is a canonical seal of this run whose digest matches;
    /// every required artifact is present; every listed artifact exists as a regular file with its
    /// sealed hash; no unexpected entry was added; every object the manifests reference is listed,
    /// present and intact; the MAC checks under the context's key; and the context's ledger agrees.
    /// Recovery artifacts do not affect the result. Returns `Err` only when the run directory
    /// cannot be read at all; everything else is a problem in the report.
    pub fn verify_with(
        &self,
        objects: &ObjectStore,
        ctx: &VerifyContext,
    ) -> Result<VerifyReport, StoreError> {
        self.verify_in_pass(objects, ctx, &ObjectsChecked::not_kept())
    }

    /// [`Capsule::verify_with`] as one run of a pass over several (`agentdiff runs`, `verify
    /// --all`): an object `checked` already holds is not hashed again, and every object found
    /// intact here is added to it.
    pub fn verify_in_pass(
        &self,
        objects: &ObjectStore,
        ctx: &VerifyContext,
        checked: &ObjectsChecked,
    ) -> Result<VerifyReport, StoreError> {
        let mut f = Findings::default();
        let integrity_name = Artifact::Integrity.file_name();
        let integrity_path = self.dir().join(integrity_name);
        match fs::symlink_metadata(&integrity_path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // The ledger outlives the capsule: a seal it records and the capsule lacks was
                // removed, which is tampering, not an interruption.
                f.seal_deleted = ctx.ledger_records_seal(self.id().as_str());
                f.problem(
                    integrity_name,
                    if f.seal_deleted {
                        "missing: deleted after the seal (this user's ledger records the run as \
                         sealed), so the capsule is forged"
                    } else {
                        "missing: the run was never sealed (interrupted or still running), so its \
                         artifacts cannot be verified"
                    },
                );
                let auth = Authentication::unsealed();
                ctx.check_ledger(self.id(), None, &auth, &mut f);
                return Ok(self.report(SealFormatKind::None, auth, f));
            }
            Err(e) => return Err(StoreError::io("inspect", integrity_path, e)),
        }
        let parsed = match self.parse_seal() {
            Ok(parsed) => parsed,
            Err(why) => {
                f.problem(integrity_name, why.to_string());
                let auth = Authentication::unreadable();
                ctx.check_ledger(self.id(), None, &auth, &mut f);
                return Ok(self.report(SealFormatKind::Unreadable, auth, f));
            }
        };
        let (format, auth) = match parsed {
            ParsedSeal::Current(seal, bytes) => {
                self.check_seal_header(&seal, &bytes, &mut f);
                self.check_artifacts(&seal.artifacts, &mut f)?;
                let below =
                    self.check_completeness(&seal.artifacts, &seal.objects, objects, &mut f);
                check_objects(&seal.objects, objects, checked, &mut f);
                check_objects(&below, objects, checked, &mut f);
                let auth = ctx.authenticate(&seal);
                ctx.check_ledger(self.id(), Some(&seal.digest), &auth, &mut f);
                (SealFormatKind::Current, auth)
            }
            ParsedSeal::Legacy(seal) => {
                self.check_legacy_header(&seal, &mut f);
                self.check_artifacts(&seal.artifacts, &mut f)?;
                check_objects(&seal.objects, objects, checked, &mut f);
                f.notes.push(
                    "older seal format (before seal_format 2): artifact hashes and the listed \
                     objects were checked; the seal itself, the completeness of the capsule and \
                     its authenticity cannot be checked"
                        .into(),
                );
                let auth = Authentication::legacy();
                ctx.check_ledger(self.id(), None, &auth, &mut f);
                (SealFormatKind::Legacy, auth)
            }
        };
        Ok(self.report(format, auth, f))
    }

    fn report(&self, format: SealFormatKind, auth: Authentication, f: Findings) -> VerifyReport {
        let sealed = !matches!(format, SealFormatKind::None);
        let intact = sealed && f.problems.is_empty();
        let verdict = if f.seal_deleted {
            Verdict::Forged
        } else if !sealed {
            Verdict::Unsealed
        } else if !intact || auth.is_forged() {
            Verdict::Forged
        } else if auth.is_authenticated() {
            Verdict::Authenticated
        } else {
            Verdict::IntactNotAuthenticated
        };
        VerifyReport {
            run_id: self.id().clone(),
            sealed,
            ok: intact && !auth.is_forged(),
            verdict,
            format,
            authentication: auth,
            problems: f.problems,
            notes: f.notes,
        }
    }

    /// integrity.json when it parses as a seal of the current format, with its bytes.
    pub(crate) fn parse_current_seal(&self) -> Option<(Integrity, Vec<u8>)> {
        match self.parse_seal() {
            Ok(ParsedSeal::Current(seal, bytes)) => Some((*seal, bytes)),
            _ => None,
        }
    }

    fn parse_seal(&self) -> Result<ParsedSeal, SealUnreadable> {
        let path = self.dir().join(Artifact::Integrity.file_name());
        let bytes =
            atomic::read_bounded(&path, MAX_ARTIFACT_BYTES).map_err(SealUnreadable::Read)?;
        match serde_json::from_slice::<Integrity>(&bytes) {
            Ok(seal) => Ok(ParsedSeal::Current(Box::new(seal), bytes)),
            Err(current_err) => match serde_json::from_slice::<LegacyIntegrity>(&bytes) {
                Ok(legacy) => Ok(ParsedSeal::Legacy(legacy)),
                Err(_) => Err(SealUnreadable::Format(current_err)),
            },
        }
    }

    pub(crate) fn check_seal_header(&self, seal: &Integrity, bytes: &[u8], f: &mut Findings) {
        let name = Artifact::Integrity.file_name();
        if seal.seal_format != SEAL_FORMAT {
            f.problem(
                name,
                format!(
                    "seal_format {} is not the supported format {SEAL_FORMAT}",
                    seal.seal_format
                ),
            );
        }
        if seal.algorithm != ALGORITHM {
            f.problem(
                name,
                format!(
                    "unsupported algorithm {:?} (expected {ALGORITHM})",
                    seal.algorithm
                ),
            );
        }
        if seal.schema_version != SCHEMA_VERSION {
            f.problem(
                name,
                format!(
                    "schema_version {} is not the supported version {SCHEMA_VERSION}",
                    seal.schema_version
                ),
            );
        }
        if seal.run_id != self.id().as_str() {
            f.problem(
                name,
                format!(
                    "the seal belongs to run {:?}, not to this run directory",
                    seal.run_id
                ),
            );
        }
        let digest = seal.compute_digest();
        if seal.digest != digest {
            f.problem(
                name,
                format!(
                    "the seal's digest {} does not match its content ({digest}): integrity.json \
                     was edited after the seal",
                    seal.digest
                ),
            );
        }
        if to_pretty_json(name, seal).ok().as_deref() != Some(bytes) {
            f.problem(
                name,
                "integrity.json is not byte-for-byte the seal agentdiff writes (edited after the \
                 seal)",
            );
        }
        let mut sorted = seal.objects.clone();
        sorted.sort();
        sorted.dedup();
        if sorted != seal.objects {
            f.problem(
                name,
                "the object list is not sorted and unique (edited after the seal)",
            );
        }
    }

    fn check_legacy_header(&self, seal: &LegacyIntegrity, f: &mut Findings) {
        let name = Artifact::Integrity.file_name();
        if seal.algorithm != ALGORITHM {
            f.problem(
                name,
                format!(
                    "unsupported algorithm {:?} (expected {ALGORITHM})",
                    seal.algorithm
                ),
            );
        }
        if seal.run_id != self.id().as_str() {
            f.problem(
                name,
                format!(
                    "the seal belongs to run {:?}, not to this run directory",
                    seal.run_id
                ),
            );
        }
    }

    /// Every listed artifact has its sealed hash; nothing unlisted is present.
    fn check_artifacts(
        &self,
        listed: &BTreeMap<String, String>,
        f: &mut Findings,
    ) -> Result<(), StoreError> {
        for (name, expected) in listed {
            match Artifact::from_file_name(name) {
                Some(a) if a != Artifact::Integrity => {}
                _ => {
                    f.problem(
                        name,
                        "listed in integrity.json but not a transaction artifact name",
                    );
                    continue;
                }
            }
            if validate_object_id(expected).is_err() {
                f.problem(
                    name,
                    format!("recorded digest {expected:?} is not a SHA-256"),
                );
                continue;
            }
            self.check_one_artifact(name, expected, f);
        }
        let integrity_name = Artifact::Integrity.file_name();
        let entries =
            fs::read_dir(self.dir()).map_err(|e| StoreError::io("list", self.dir(), e))?;
        let mut extra = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| StoreError::io("list", self.dir(), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == integrity_name || listed.contains_key(&name) {
                continue;
            }
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            let text = if Artifact::from_file_name(&name).is_some() {
                "present but not listed in integrity.json (added after the seal)"
            } else if RecoveryArtifact::parse(&name).is_ok() {
                if is_file {
                    continue;
                }
                "recovery artifact is not a regular file"
            } else {
                "unexpected entry in a sealed run directory"
            };
            extra.push((name, text));
        }
        extra.sort();
        for (name, text) in extra {
            f.problem(&name, text);
        }
        Ok(())
    }

    fn check_one_artifact(&self, name: &str, expected: &str, f: &mut Findings) {
        let path = self.dir().join(name);
        let meta = match fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                f.problem(name, "missing: deleted after the seal");
                return;
            }
            Err(e) => {
                f.problem(name, format!("cannot inspect: {e}"));
                return;
            }
        };
        if meta.file_type().is_symlink() {
            f.problem(
                name,
                "is a symbolic link, not the sealed file (replaced after the seal)",
            );
        } else if !meta.is_file() {
            f.problem(name, "is not a regular file");
        } else {
            match atomic::hash_file(&path) {
                Ok((actual, _)) if actual == expected => {}
                Ok((actual, _)) => f.problem(
                    name,
                    format!(
                        "content changed since the seal: sealed SHA-256 {expected}, now {actual}"
                    ),
                ),
                Err(e) => f.problem(name, format!("cannot hash: {e}")),
            }
        }
    }

    /// What the capsule must hold, independently of the seal's own lists: the always-present
    /// artifacts, those the event log says were written, and every object the manifests name.
    /// Returns the objects below the manifests' root trees that the seal does not list: they are
    /// sealed through their hashes, and the caller checks that they are present and intact.
    fn check_completeness(
        &self,
        listed: &BTreeMap<String, String>,
        sealed_objects: &[String],
        objects: &ObjectStore,
        f: &mut Findings,
    ) -> Vec<String> {
        let mut required: BTreeSet<Artifact> = ALWAYS_REQUIRED.into_iter().collect();
        match self.events() {
            Ok(events) => {
                for e in &events {
                    let needs = match e.event.as_str() {
                        "before_captured" => Some(Artifact::Before),
                        "after_captured" => Some(Artifact::After),
                        "exited" | "launch_refused" => Some(Artifact::Runtime),
                        _ => None,
                    };
                    required.extend(needs);
                }
                if events.last().map(|e| e.event.as_str()) != Some("sealing") {
                    f.problem(
                        Artifact::Events.file_name(),
                        "the event log does not end with the `sealing` event",
                    );
                }
            }
            Err(e) => f.notes.push(format!(
                "the event log could not be read ({e}); required artifacts were not derived from it"
            )),
        }
        for artifact in required {
            if !listed.contains_key(artifact.file_name()) {
                f.problem(
                    artifact.file_name(),
                    "required for this capsule but not listed in the seal (removed from the seal \
                     and the run directory)",
                );
            }
        }
        let sealed: BTreeSet<&str> = sealed_objects.iter().map(String::as_str).collect();
        let mut below = BTreeSet::new();
        for artifact in [Artifact::Before, Artifact::After] {
            if listed.contains_key(artifact.file_name()) {
                self.check_manifest_objects(artifact, &sealed, objects, &mut below, f);
            }
        }
        below.into_iter().collect()
    }

    /// A manifest's own object (root tree, or schema-1 entries object) must be listed in the seal.
    /// Below a root tree, objects are sealed through their hashes and returned in `below` to be
    /// checked for presence and integrity; a schema-1 manifest's backups must be listed as well.
    fn check_manifest_objects(
        &self,
        artifact: Artifact,
        sealed: &BTreeSet<&str>,
        objects: &ObjectStore,
        below: &mut BTreeSet<String>,
        f: &mut Findings,
    ) {
        let name = artifact.file_name();
        let Ok(Some(named)) = self.manifest_object(artifact) else {
            f.notes.push(format!(
                "{name} names no root tree or entries object; the objects it references were not \
                 checked against the seal"
            ));
            return;
        };
        let not_listed = |f: &mut Findings, hex: &str| {
            f.problem(
                &format!("object {hex}"),
                format!("referenced by {name} but not listed in the seal (dropped from it)"),
            )
        };
        if !sealed.contains(named.hex()) {
            not_listed(f, named.hex());
        }
        let tree = matches!(named, ManifestObject::Tree(_));
        match self.manifest_references(artifact, objects) {
            Ok(refs) => {
                for hex in refs {
                    if sealed.contains(hex.as_str()) {
                        continue;
                    }
                    if tree {
                        below.insert(hex);
                    } else {
                        not_listed(f, &hex);
                    }
                }
            }
            Err(e) => match e.object() {
                // A sealed object that is missing or corrupt is reported under its own name.
                Some(hex) if sealed.contains(hex) => {}
                Some(hex) => f.problem(
                    &format!("object {hex}"),
                    format!("below the tree of {name}: {e}"),
                ),
                None => f.problem(
                    name,
                    format!("its manifest cannot be read ({e}), so its backups cannot be checked"),
                ),
            },
        }
    }

    /// The sealed manifest, if the run is sealed with the current format.
    pub fn integrity(&self) -> Result<Integrity, StoreError> {
        self.read_artifact(Artifact::Integrity)
    }

    /// The objects the seal lists, for either format (pruning keeps them).
    pub fn sealed_objects(&self) -> Result<Vec<String>, StoreError> {
        match self.parse_seal() {
            Ok(ParsedSeal::Current(seal, _)) => Ok(seal.objects),
            Ok(ParsedSeal::Legacy(seal)) => Ok(seal.objects),
            Err(_) => self.integrity().map(|i| i.objects),
        }
    }
}

/// Why a seal file cannot be read as a seal.
#[derive(Debug, thiserror::Error)]
enum SealUnreadable {
    #[error("unreadable seal: {0}")]
    Read(#[source] StoreError),
    #[error("not a seal agentdiff can read ({0}); it was damaged or edited")]
    Format(#[source] serde_json::Error),
}

/// Objects found intact earlier in one pass over several runs. Runs of one tree share most of
/// their objects, so a pass hashes each once instead of once per run. Scope one to a single
/// command: an object changed after the pass checked it is not checked again by that pass.
#[derive(Debug)]
pub struct ObjectsChecked {
    /// Binary ids (32 bytes each, not 64 hex characters: a pass can hold every object).
    ids: std::sync::Mutex<std::collections::HashSet<[u8; 32]>>,
    keep: bool,
}

impl Default for ObjectsChecked {
    fn default() -> Self {
        ObjectsChecked {
            ids: Default::default(),
            keep: true,
        }
    }
}

impl ObjectsChecked {
    /// For a single run's verification: nothing is kept.
    fn not_kept() -> Self {
        ObjectsChecked {
            keep: false,
            ..Self::default()
        }
    }

    fn key(hex: &str) -> Option<[u8; 32]> {
        let mut id = [0u8; 32];
        hex::decode_to_slice(hex, &mut id).ok().map(|()| id)
    }

    fn with<R>(&self, f: impl FnOnce(&mut std::collections::HashSet<[u8; 32]>) -> R) -> R {
        // The set only ever gains ids of intact objects: a poisoned one is still right.
        f(&mut self.ids.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn contains(&self, hex: &str) -> bool {
        self.keep && Self::key(hex).is_some_and(|k| self.with(|c| c.contains(&k)))
    }

    fn extend(&self, intact: Vec<[u8; 32]>) {
        if self.keep {
            self.with(|c| c.extend(intact));
        }
    }
}

/// One thread's share of [`check_objects`]: (subject, problem) pairs and the ids found intact.
type Checked = (Vec<(String, String)>, Vec<[u8; 32]>);

/// Objects per thread below which hashing stays on one thread (spawning costs more).
const OBJECTS_PER_THREAD: usize = 256;

/// Every listed object is a valid name, present and intact (hashed on up to four threads; the
/// problems keep the listed order).
fn check_objects(
    listed: &[String],
    objects: &ObjectStore,
    checked: &ObjectsChecked,
    f: &mut Findings,
) {
    let todo: Vec<&String> = listed.iter().filter(|h| !checked.contains(h)).collect();
    let check = |part: &[&String]| -> Checked {
        let mut problems = Vec::new();
        let mut intact = Vec::new();
        for hex in part {
            match validate_object_id(hex).and_then(|()| objects.verify_object(hex)) {
                Ok(()) => intact.extend(ObjectsChecked::key(hex)),
                Err(e) => problems.push((format!("object {hex}"), e.to_string())),
            }
        }
        (problems, intact)
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(4)
        .min(todo.len() / OBJECTS_PER_THREAD)
        .max(1);
    let parts: Vec<Checked> = if threads == 1 {
        vec![check(&todo)]
    } else {
        let size = todo.len().div_ceil(threads);
        std::thread::scope(|s| {
            let handles: Vec<_> = todo
                .chunks(size)
                .map(|part| {
                    (
                        part,
                        std::thread::Builder::new().spawn_scoped(s, || check(part)),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(part, h)| match h {
                    // A thread that could not start (or died) leaves its part to this one.
                    Ok(h) => h.join().unwrap_or_else(|_| check(part)),
                    Err(_) => check(part),
                })
                .collect()
        })
    };
    for (problems, intact) in parts {
        for (subject, problem) in problems {
            f.problem(&subject, problem);
        }
        checked.extend(intact);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::atomic::{Syncer, FSYNC_BATCH_LIMIT};
    use crate::Store;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    /// Records every flush at the filesystem boundary (and performs none), noting whether the
    /// seal file already existed when it was asked for.
    #[derive(Debug, Default)]
    struct RecordingSyncer {
        files: Mutex<Vec<PathBuf>>,
        dirs: Mutex<Vec<PathBuf>>,
        filesystems: Mutex<Vec<PathBuf>>,
        /// The run directory whose integrity.json must not exist yet at any flush.
        run_dir: Mutex<Option<PathBuf>>,
        flushed_after_seal: Mutex<bool>,
    }

    impl RecordingSyncer {
        fn note(&self) {
            if let Some(dir) = self.run_dir.lock().unwrap().as_ref() {
                if dir.join("integrity.json").exists() {
                    *self.flushed_after_seal.lock().unwrap() = true;
                }
            }
        }
    }

    impl Syncer for RecordingSyncer {
        fn sync_file(&self, path: &Path) -> io::Result<()> {
            self.note();
            self.files.lock().unwrap().push(path.to_path_buf());
            Ok(())
        }
        fn sync_dir(&self, path: &Path) -> io::Result<()> {
            self.note();
            self.dirs.lock().unwrap().push(path.to_path_buf());
            Ok(())
        }
        fn sync_filesystem(&self, path: &Path) -> io::Result<()> {
            self.note();
            self.filesystems.lock().unwrap().push(path.to_path_buf());
            Ok(())
        }
    }

    /// A store whose flushes go to a recording fake, and a run with artifacts, events and objects
    /// written the way a transaction writes them.
    fn recorded_run(objects: usize) -> (tempfile::TempDir, Store, Capsule, Arc<RecordingSyncer>) {
        let root = tempfile::tempdir().unwrap();
        let store = Store::open(root.path()).unwrap();
        let recorder = Arc::new(RecordingSyncer::default());
        store.objects().pending().set_syncer(recorder.clone());
        let capsule = store.create_run(Some("r1")).unwrap();
        *recorder.run_dir.lock().unwrap() = Some(capsule.dir().to_path_buf());
        capsule
            .write_artifact(Artifact::Metadata, &json!({ "run_id": "r1" }))
            .unwrap();
        capsule
            .write_artifact(Artifact::Policy, &json!({}))
            .unwrap();
        capsule.event("capsule_created", json!({})).unwrap();
        capsule
            .write_artifact(Artifact::Result, &json!({ "status": "ok" }))
            .unwrap();
        for i in 0..objects {
            store
                .objects()
                .put_bytes_batched(format!("tree object {i}").as_bytes())
                .unwrap();
        }
        (root, store, capsule, recorder)
    }

    #[test]
    fn seal_fsyncs_every_file_it_covers_and_their_directories_before_the_seal() {
        let (_root, store, capsule, recorder) = recorded_run(3);
        let objects = store.objects().list().unwrap();
        assert_eq!(objects.len(), 3);
        let seal = capsule.seal(&objects).unwrap();

        let files = recorder.files.lock().unwrap().clone();
        let dirs = recorder.dirs.lock().unwrap().clone();
        assert!(
            recorder.filesystems.lock().unwrap().is_empty(),
            "a few files are fsynced one by one, never by flushing the whole filesystem"
        );
        assert!(
            !*recorder.flushed_after_seal.lock().unwrap(),
            "everything the seal covers is durable before integrity.json is written"
        );
        for name in seal.artifacts.keys() {
            let path = capsule.dir().join(name);
            assert!(files.contains(&path), "{name} not fsynced: {files:?}");
        }
        for hex in &seal.objects {
            let path = store.objects().object_path(hex).unwrap();
            assert!(files.contains(&path), "object {hex} not fsynced");
            let shard = path.parent().unwrap().to_path_buf();
            assert!(dirs.contains(&shard), "shard of {hex} not fsynced");
        }
        assert!(dirs.contains(&capsule.dir().to_path_buf()), "run directory");
        // The seal's own bytes are flushed in the same batch, under a temp name.
        assert!(files.iter().any(|f| f.parent() == Some(capsule.dir())
            && f.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-integrity.json"))));
        assert!(dirs.contains(&store.runs_dir().to_path_buf()), "runs/");
        // Each entry once: the flush empties the record.
        let unique: BTreeSet<_> = files.iter().collect();
        assert_eq!(unique.len(), files.len(), "{files:?}");
    }

    #[test]
    fn seal_fsyncs_objects_it_found_by_hashing_but_not_cached_ones() {
        // An object an earlier process stored and never sealed (it may not be durable), found
        // intact by hashing in this one: the seal that references it flushes it too.
        let root = tempfile::tempdir().unwrap();
        let earlier = Store::open(root.path()).unwrap();
        let hex = earlier
            .objects()
            .put_bytes_batched(b"left by a crash")
            .unwrap();
        let store = Store::open(root.path()).unwrap();
        let recorder = Arc::new(RecordingSyncer::default());
        store.objects().pending().set_syncer(recorder.clone());
        let capsule = store.create_run(Some("r2")).unwrap();
        for a in [Artifact::Metadata, Artifact::Policy, Artifact::Result] {
            capsule.write_artifact(a, &json!({})).unwrap();
        }
        assert!(store.objects().contains_verified(&hex, 15));
        capsule.seal(std::slice::from_ref(&hex)).unwrap();
        let path = store.objects().object_path(&hex).unwrap();
        assert!(recorder.files.lock().unwrap().contains(&path));
    }

    #[test]
    fn seal_of_many_new_files_flushes_their_filesystem_once() {
        let (_root, store, capsule, recorder) = recorded_run(FSYNC_BATCH_LIMIT + 1);
        let objects = store.objects().list().unwrap();
        capsule.seal(&objects).unwrap();
        assert!(recorder.files.lock().unwrap().is_empty());
        assert_eq!(recorder.filesystems.lock().unwrap().len(), 1);
        assert!(!*recorder.flushed_after_seal.lock().unwrap());
    }

    #[test]
    fn integrity_rejects_unknown_fields() {
        let text = r#"{"schema_version":1,"algorithm":"sha256","run_id":"a","sealed_at":"x",
            "artifacts":{},"objects":[],"extra":1}"#;
        assert!(serde_json::from_str::<Integrity>(text).is_err());
        assert!(serde_json::from_str::<LegacyIntegrity>(text).is_err());
    }
}
