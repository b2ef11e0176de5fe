//! Run attestations in the supply-chain format other tools verify: an in-toto Statement v1 in a
//! DSSE envelope (`payloadType` `application/vnd.in-toto+json`), signed with the sealer's Ed25519
//! key (see [`crate::seal::SigningKey`]).
//!
//! The statement's subjects are the files the run left changed (path and SHA-256 of the content
//! the after-state recorded) and the capsule itself (`agentdiff-capsule:<run id>`, digest = the
//! seal's digest), so an attestation names exactly one run: an envelope of another run carries
//! another capsule subject. The predicate (type [`PREDICATE_TYPE`], schema in
//! docs/schemas/attestation-predicate.schema.json) summarises the run from the sealed artifacts.
//!
//! Invariant: an attestation is made only from a capsule that verifies as authenticated here, so
//! it never signs more than the seal proves. Not defended: whoever holds the signing key can sign
//! any statement; trust in an attestation is trust in that key.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use agentdiff_policy::score::BlastRadius;
use agentdiff_scan::{ChangeType, EntryKind};

use crate::schema::{ChangeRecord, EvidenceFinding, LimitViolation, Status};
use crate::seal::{PublicKey, SigningKey, VerifyContext};
use crate::{Artifact, Capsule, ObjectStore, StoreError, Verdict};

/// DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The in-toto Statement v1 type.
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate type of an agentdiff run attestation.
pub const PREDICATE_TYPE: &str = "https://agentdiff.dev/attestation/run/v1";
/// Subject name prefix of the capsule subject.
pub const CAPSULE_SUBJECT_PREFIX: &str = "agentdiff-capsule:";

/// Why an attestation cannot be made or read.
#[derive(Debug, thiserror::Error)]
pub enum AttestError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("run '{run_id}' does not verify as authenticated here ({verdict:?}): {detail}")]
    NotAuthenticated {
        run_id: String,
        verdict: Verdict,
        detail: String,
    },
    #[error("not a DSSE envelope of an in-toto statement: {0}")]
    Malformed(String),
}

/// A DSSE envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// Base64 of the statement's JSON bytes.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    pub keyid: String,
    /// Base64 of the Ed25519 signature of the envelope's pre-authentication encoding.
    pub sig: String,
}

/// An in-toto Statement v1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub statement_type: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: serde_json::Value,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// The predicate of a run attestation (docs/schemas/attestation-predicate.schema.json).
#[derive(Debug, Serialize)]
struct RunPredicate<'a> {
    run_id: &'a str,
    agentdiff_version: &'a str,
    attested_by: &'a str,
    capsule: CapsuleFacts<'a>,
    command: &'a [String],
    task: Option<&'a str>,
    started_at: &'a str,
    finished_at: &'a str,
    status: Status,
    exit_code: Option<i32>,
    backend: &'a str,
    sandboxed: Option<bool>,
    labels: BTreeMap<String, String>,
    policy: PolicyFacts,
    safety_outcome: agentdiff_policy::Action,
    changes: &'a [ChangeRecord],
    evidence_findings: &'a [EvidenceFinding],
    limit_violations: &'a [LimitViolation],
    blast_radius: &'a BlastRadius,
}

#[derive(Debug, Serialize)]
struct CapsuleFacts<'a> {
    seal_digest: &'a str,
    sealed_at: &'a str,
}

#[derive(Debug, Serialize)]
struct PolicyFacts {
    /// SHA-256 of the sealed `policy.json`.
    digest: String,
}

/// DSSE's pre-authentication encoding of a payload.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

/// The statement of `capsule`, which must verify as authenticated under `ctx`. `version` is the
/// attesting agentdiff's version.
pub fn statement(
    capsule: &Capsule,
    objects: &ObjectStore,
    ctx: &VerifyContext,
    version: &str,
    attested_by: &str,
) -> Result<Statement, AttestError> {
    let report = capsule.verify_with(objects, ctx)?;
    if report.verdict != Verdict::Authenticated {
        return Err(AttestError::NotAuthenticated {
            run_id: capsule.id().to_string(),
            verdict: report.verdict,
            detail: report.authentication.detail,
        });
    }
    let integrity = capsule.integrity()?;
    let metadata = capsule.metadata()?;
    let result = capsule.result()?;
    let after = capsule.manifest(Artifact::After, objects)?;
    let mut subject = vec![Subject {
        name: format!("{CAPSULE_SUBJECT_PREFIX}{}", capsule.id()),
        digest: BTreeMap::from([("sha256".to_string(), integrity.digest.clone())]),
    }];
    for change in &result.changes {
        if change.change_type == ChangeType::Deleted || change.entry_kind != EntryKind::File {
            continue;
        }
        if let Some(sha) = after
            .entries
            .get(&change.path)
            .and_then(|e| e.sha256.clone())
        {
            subject.push(Subject {
                name: change.path.clone(),
                digest: BTreeMap::from([("sha256".to_string(), sha)]),
            });
        }
    }
    let runtime = result.runtime.as_ref();
    let labels = runtime
        .map(|r| {
            r.capabilities
                .matrix()
                .into_iter()
                .map(|(boundary, level)| (boundary.to_string(), level.as_str().to_string()))
                .collect()
        })
        .unwrap_or_default();
    let policy_digest = integrity
        .artifacts
        .get(Artifact::Policy.file_name())
        .cloned()
        .unwrap_or_default();
    let predicate = RunPredicate {
        run_id: capsule.id().as_str(),
        agentdiff_version: version,
        attested_by,
        capsule: CapsuleFacts {
            seal_digest: &integrity.digest,
            sealed_at: &integrity.sealed_at,
        },
        command: &metadata.argv,
        task: metadata.task.as_deref(),
        started_at: &result.started_at,
        finished_at: &result.finished_at,
        status: result.status,
        exit_code: result.exit_code,
        backend: &metadata.backend,
        sandboxed: runtime.map(|r| r.sandboxed),
        labels,
        policy: PolicyFacts {
            digest: policy_digest,
        },
        safety_outcome: result.safety_outcome,
        changes: &result.changes,
        evidence_findings: &result.evidence_findings,
        limit_violations: &result.limit_violations,
        blast_radius: &result.blast_radius,
    };
    Ok(Statement {
        statement_type: STATEMENT_TYPE.to_string(),
        subject,
        predicate_type: PREDICATE_TYPE.to_string(),
        predicate: serde_json::to_value(&predicate)
            .map_err(|e| AttestError::Malformed(e.to_string()))?,
    })
}

/// The statement signed into a DSSE envelope.
pub fn sign(statement: &Statement, key: &SigningKey) -> Result<Envelope, AttestError> {
    let payload =
        serde_json::to_vec(statement).map_err(|e| AttestError::Malformed(e.to_string()))?;
    let sig = key.sign(&pae(PAYLOAD_TYPE, &payload));
    Ok(Envelope {
        payload: B64.encode(&payload),
        payload_type: PAYLOAD_TYPE.to_string(),
        signatures: vec![EnvelopeSignature {
            keyid: key.id().to_string(),
            sig: B64.encode(sig),
        }],
    })
}

/// What an envelope says under a set of trusted keys.
#[derive(Debug, Clone, PartialEq)]
pub enum EnvelopeCheck {
    /// A signature by this trusted key verifies; the statement it covers.
    Verified {
        key_id: String,
        statement: Box<Statement>,
    },
    /// The payload is an agentdiff statement and every signature by a key known here verifies,
    /// but no signature is by a trusted key (the ids it names). `known_signer` is the known,
    /// untrusted key whose signature verified, if any.
    Untrusted {
        key_ids: Vec<String>,
        statement: Box<Statement>,
        known_signer: Option<String>,
    },
    /// Not a signed agentdiff statement: the payload is not one, no signature at all, or a
    /// signature by a trusted or known key does not verify over it.
    Bad { reason: String },
}

impl Envelope {
    /// [`Envelope::check_with`] with no known keys besides the trusted ones.
    pub fn check(&self, trusted: &[PublicKey]) -> EnvelopeCheck {
        self.check_with(trusted, &[])
    }

    /// Checks the envelope: its payload must be an in-toto statement of an agentdiff run and
    /// every signature by a key in `trusted` or `known` must verify over it (a payload changed
    /// after signing is caught whenever its signer's key is at hand, trusted or not); it is
    /// `Verified` when one of them is by a trusted key.
    pub fn check_with(&self, trusted: &[PublicKey], known: &[PublicKey]) -> EnvelopeCheck {
        let statement = match self.statement() {
            Ok(statement) => statement,
            Err(reason) => return EnvelopeCheck::Bad { reason },
        };
        if self.signatures.is_empty() {
            return EnvelopeCheck::Bad {
                reason: "the envelope carries no signature".into(),
            };
        }
        let message = pae(&self.payload_type, &statement.1);
        let (mut verified, mut known_signer) = (None, None);
        for s in &self.signatures {
            let is_trusted = trusted.iter().any(|k| k.id() == s.keyid);
            let Some(key) = trusted.iter().chain(known).find(|k| k.id() == s.keyid) else {
                continue;
            };
            let ok = B64
                .decode(s.sig.as_bytes())
                .is_ok_and(|sig| key.verifies(&message, &sig));
            if !ok {
                let which = if is_trusted { "trusted key" } else { "key" };
                return EnvelopeCheck::Bad {
                    reason: format!(
                        "the signature by {which} {} does not match the payload (changed after \
                         signing)",
                        s.keyid
                    ),
                };
            }
            if is_trusted {
                verified = Some(s.keyid.clone());
            } else {
                known_signer = Some(s.keyid.clone());
            }
        }
        let statement = Box::new(statement.0);
        match verified {
            Some(key_id) => EnvelopeCheck::Verified { key_id, statement },
            None => EnvelopeCheck::Untrusted {
                key_ids: self.signatures.iter().map(|s| s.keyid.clone()).collect(),
                statement,
                known_signer,
            },
        }
    }

    /// The payload as an agentdiff run statement, with its bytes; why not, otherwise.
    fn statement(&self) -> Result<(Statement, Vec<u8>), String> {
        if self.payload_type != PAYLOAD_TYPE {
            return Err(format!(
                "payloadType {:?}, not {PAYLOAD_TYPE}",
                self.payload_type
            ));
        }
        let Ok(payload) = B64.decode(self.payload.as_bytes()) else {
            return Err("the payload is not base64".into());
        };
        match serde_json::from_slice::<Statement>(&payload) {
            Ok(st)
                if st.statement_type == STATEMENT_TYPE && st.predicate_type == PREDICATE_TYPE =>
            {
                Ok((st, payload))
            }
            Ok(st) => Err(format!(
                "a statement of type {:?} with predicate {:?}, not an agentdiff run",
                st.statement_type, st.predicate_type
            )),
            Err(e) => Err(format!("the payload is not an in-toto statement: {e}")),
        }
    }
}

impl Statement {
    /// The run id and seal digest of the capsule subject.
    pub fn capsule(&self) -> Option<(&str, &str)> {
        self.subject.iter().find_map(|s| {
            let run = s.name.strip_prefix(CAPSULE_SUBJECT_PREFIX)?;
            Some((run, s.digest.get("sha256")?.as_str()))
        })
    }
}

/// SHA-256 of `bytes` in hex (an attestation file's own digest, for reports).
pub fn digest_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn statement_for(run: &str, digest: &str) -> Statement {
        Statement {
            statement_type: STATEMENT_TYPE.into(),
            subject: vec![Subject {
                name: format!("{CAPSULE_SUBJECT_PREFIX}{run}"),
                digest: BTreeMap::from([("sha256".into(), digest.into())]),
            }],
            predicate_type: PREDICATE_TYPE.into(),
            predicate: serde_json::json!({ "run_id": run }),
        }
    }

    #[test]
    fn pae_is_the_dsse_encoding() {
        assert_eq!(pae("t", b"ab"), b"DSSEv1 1 t 2 ab".to_vec());
    }

    #[test]
    fn an_envelope_verifies_under_its_key_and_fails_when_changed() {
        let key = SigningKey::from_seed([4; 32], PathBuf::from("/k"));
        let other = SigningKey::from_seed([5; 32], PathBuf::from("/k"));
        let env = sign(&statement_for("r1", "ab"), &key).unwrap();
        let trusted = vec![key.public().clone()];
        match env.check(&trusted) {
            EnvelopeCheck::Verified { statement, .. } => {
                assert_eq!(statement.capsule(), Some(("r1", "ab")))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            env.check(&[other.public().clone()]),
            EnvelopeCheck::Untrusted { .. }
        ));
        // A swapped subject digest is another payload: the signature no longer matches.
        let forged = sign(&statement_for("r1", "cd"), &other).unwrap();
        let tampered = Envelope {
            payload: forged.payload,
            ..env.clone()
        };
        assert!(matches!(
            tampered.check(&trusted),
            EnvelopeCheck::Bad { .. }
        ));
        let retyped = Envelope {
            payload_type: "application/json".into(),
            ..env
        };
        assert!(matches!(retyped.check(&trusted), EnvelopeCheck::Bad { .. }));
    }

    #[test]
    fn a_changed_or_garbage_payload_is_bad_even_when_no_key_is_trusted() {
        let key = SigningKey::from_seed([4; 32], PathBuf::from("/k"));
        let env = sign(&statement_for("r1", "ab"), &key).unwrap();
        let known = vec![key.public().clone()];
        match env.check_with(&[], &known) {
            EnvelopeCheck::Untrusted {
                statement,
                known_signer,
                ..
            } => {
                assert_eq!(statement.capsule(), Some(("r1", "ab")));
                assert_eq!(known_signer.as_deref(), Some(key.id()));
            }
            other => panic!("{other:?}"),
        }
        let changed = Envelope {
            payload: sign(&statement_for("r2", "ab"), &key).unwrap().payload,
            ..env.clone()
        };
        assert!(matches!(
            changed.check_with(&[], &known),
            EnvelopeCheck::Bad { .. }
        ));
        let garbage = Envelope {
            payload: B64.encode("not a statement at all"),
            ..env.clone()
        };
        assert!(matches!(garbage.check(&[]), EnvelopeCheck::Bad { .. }));
        let unsigned = Envelope {
            signatures: Vec::new(),
            ..env
        };
        assert!(matches!(unsigned.check(&[]), EnvelopeCheck::Bad { .. }));
    }
}
