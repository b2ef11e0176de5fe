//! Keyed seals: the per-user key that MACs every seal, the ledger every seal is appended to, and
//! the verification context `verify` checks a capsule against.
//!
//! Who can forge what (docs/security-model.md has the full table): without the key nobody can
//! produce a seal that authenticates; a process running as the same user can read the key (under
//! the `local` backend this includes the wrapped command), so "authenticated" means "sealed by
//! agentdiff with this user's key", and only backends that hide the state directory from the
//! command make it mean "the command could not have forged it".

mod key;
mod ledger;
mod signing;
mod trust;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

pub use key::{MacPurpose, SealKey, StateDir, KEY_FILE_NAME, STATE_DIR_ENV};
pub use ledger::{Ledger, LedgerContents, LedgerEntry, LEDGER_FILE_NAME};
pub use signing::{
    PublicKey, SealSignature, SignatureCheck, SigningError, SigningKey, SIGNATURE_ALGORITHM,
    SIGNING_KEY_FILE_ENV, SIGNING_KEY_FILE_NAME,
};
pub use trust::{trusted_process_evidence, TrustedEvidence, Untrusted};

use super::integrity::{Findings, Integrity, SealMac, MAC_ALGORITHM};
use super::run_id::RunId;
use super::StoreError;

/// What seals a run: the key, the ledger and the resolved project root the ledger records.
#[derive(Debug, Clone)]
pub struct SealAuthority {
    key: SealKey,
    /// Signs every seal, so it authenticates wherever its public key is trusted.
    signer: Arc<SigningKey>,
    ledger: Ledger,
    root: PathBuf,
    /// The ledger's tail as last read ([`Ledger::read_tail`]): a run asks for it twice before
    /// it seals (its stat-cache candidates, their verification), and reads and parses it once.
    /// Dropped whenever this authority appends, so it never lacks a line written through it;
    /// a line another process appends meanwhile is missed, as it would be by a read a moment
    /// earlier.
    tail: Arc<Mutex<Option<Arc<LedgerContents>>>>,
}

impl SealAuthority {
    /// Loads (or creates on first use) the key of `state` for sealing runs of `project_root`.
    /// Refuses a state directory inside the project.
    pub fn open(state: &StateDir, project_root: &Path) -> Result<SealAuthority, StoreError> {
        state.check_outside(project_root)?;
        let key = SealKey::load_or_create(state)?;
        let signer = SigningKey::load_or_create(state, project_root).map_err(|e| match e {
            SigningError::Store(e) => e,
            other => StoreError::StateDir {
                path: state.path().join(SIGNING_KEY_FILE_NAME),
                reason: other.to_string(),
            },
        })?;
        Ok(SealAuthority {
            key,
            signer: Arc::new(signer),
            ledger: Ledger::new(state.clone()),
            root: project_root
                .canonicalize()
                .unwrap_or_else(|_| project_root.to_path_buf()),
            tail: Arc::default(),
        })
    }

    pub fn key(&self) -> &SealKey {
        &self.key
    }

    /// The key that signs this authority's seals.
    pub fn signer(&self) -> &SigningKey {
        &self.signer
    }

    /// What `verify` would check this authority's own seals against: its key and ledger.
    pub fn verify_context(&self) -> Result<VerifyContext, StoreError> {
        Ok(VerifyContext {
            key: Some(self.key.clone()),
            trusted: Vec::new(),
            key_path: None,
            ledger: Some(self.ledger.read()?),
            root: Some(self.root.display().to_string()),
        })
    }

    /// [`SealAuthority::verify_context`] over the ledger's tail only ([`Ledger::read_tail`]):
    /// the same key and root, a cost that does not grow with the ledger. A capsule's seal checks
    /// under it only if it checks under the full context too (a lookup that misses a line
    /// refuses); a recent run's seal, whose line is in the tail, checks under both.
    pub fn recent_verify_context(&self) -> VerifyContext {
        VerifyContext {
            key: Some(self.key.clone()),
            trusted: Vec::new(),
            key_path: None,
            ledger: Some(LedgerContents::clone(&self.tail())),
            root: Some(self.root.display().to_string()),
        }
    }

    /// The last `limit` runs of this project whose seals the ledger records (authenticated,
    /// not pruned), newest first; see [`LedgerContents::recent_runs`].
    pub fn recent_sealed_runs(&self, limit: usize) -> Vec<String> {
        self.tail()
            .recent_runs(&self.key, &self.root.display().to_string(), limit)
    }

    fn tail(&self) -> Arc<LedgerContents> {
        let mut cached = self.tail.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(cached.get_or_insert_with(|| Arc::new(self.ledger.read_tail())))
    }

    fn forget_tail(&self) {
        *self.tail.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }

    pub(crate) fn mac_seal(&self, integrity: &Integrity) -> SealMac {
        SealMac {
            algorithm: MAC_ALGORITHM.to_string(),
            key_id: self.key.id().to_string(),
            value: self.key.mac(MacPurpose::Seal, &integrity.body()),
        }
    }

    pub(crate) fn sign_seal(&self, integrity: &Integrity) -> SealSignature {
        self.signer.sign_seal(&integrity.digest)
    }

    pub(crate) fn record(&self, integrity: &Integrity) -> Result<(), StoreError> {
        let appended = self.ledger.append(&self.entry(integrity));
        self.forget_tail();
        appended
    }

    /// Records that the run sealed as `integrity` was removed on purpose (`runs prune`).
    pub(crate) fn record_pruned(&self, integrity: &Integrity) -> Result<(), StoreError> {
        let pruned = LedgerEntry::pruned(
            &self.key,
            &self.entry(integrity),
            &super::now_rfc3339_millis(),
        );
        let appended = self.ledger.append(&pruned);
        self.forget_tail();
        appended
    }

    fn entry(&self, integrity: &Integrity) -> LedgerEntry {
        LedgerEntry::new(
            &self.key,
            &integrity.run_id,
            &self.root,
            &integrity.digest,
            &integrity.sealed_at,
        )
    }
}

/// Whether a seal's MAC checks here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthState {
    Authenticated,
    NotAuthenticated,
    Forged,
}

/// The authentication part of a verify report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Authentication {
    pub state: AuthState,
    /// Why, in words.
    pub detail: String,
    /// The key id the seal names, when it names one.
    pub seal_key_id: Option<String>,
    /// The id of the Ed25519 key whose signature the seal carries, when it carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_by: Option<String>,
    /// The seal authenticated by a trusted public key's signature (not by this user's MAC): the
    /// ledger, which records this machine's seals only, is not consulted.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub by_signature: bool,
    /// The digest of the seal checked (`integrity.json` → `digest`): what an attestation of
    /// this capsule names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal_digest: Option<String>,
}

impl Authentication {
    fn not(detail: &str, seal_key_id: Option<String>) -> Authentication {
        Authentication {
            state: AuthState::NotAuthenticated,
            detail: detail.to_string(),
            seal_key_id,
            signed_by: None,
            by_signature: false,
            seal_digest: None,
        }
    }

    pub(crate) fn unsealed() -> Authentication {
        Authentication::not("the run has no seal", None)
    }

    pub(crate) fn unreadable() -> Authentication {
        Authentication::not("the seal cannot be read", None)
    }

    pub(crate) fn legacy() -> Authentication {
        Authentication::not(
            "older seal format: it carries no MAC, so it cannot be authenticated",
            None,
        )
    }

    pub fn is_authenticated(&self) -> bool {
        self.state == AuthState::Authenticated
    }

    pub fn is_forged(&self) -> bool {
        self.state == AuthState::Forged
    }
}

/// What `verify` checks a capsule against: this user's key and ledger, if any.
#[derive(Debug, Clone, Default)]
pub struct VerifyContext {
    pub key: Option<SealKey>,
    /// Public keys whose signatures authenticate a seal this user's key cannot (`verify
    /// --trusted-keys`): capsules from other machines and users.
    pub trusted: Vec<PublicKey>,
    /// Where the key was looked for (named in "no key" messages).
    pub key_path: Option<PathBuf>,
    pub ledger: Option<LedgerContents>,
    /// The resolved project root, to match ledger entries.
    pub root: Option<String>,
}

impl VerifyContext {
    /// This user's key and ledger from `state` (nothing is created), for capsules under
    /// `project_root`.
    pub fn for_user(state: &StateDir, project_root: &Path) -> Result<VerifyContext, StoreError> {
        let key = SealKey::load(state)?;
        let ledger = match &key {
            Some(_) => Some(Ledger::new(state.clone()).read()?),
            None => None,
        };
        let root = project_root
            .canonicalize()
            .unwrap_or_else(|_| project_root.to_path_buf());
        Ok(VerifyContext {
            key,
            trusted: Vec::new(),
            key_path: Some(state.key_path()),
            ledger,
            root: Some(root.display().to_string()),
        })
    }

    fn authenticate_mac(&self, seal: &Integrity) -> Authentication {
        let Some(mac) = &seal.mac else {
            return Authentication::not("the seal carries no MAC (sealed without a key)", None);
        };
        let seal_key = Some(mac.key_id.clone());
        let Some(key) = &self.key else {
            let place = self
                .key_path
                .as_ref()
                .map(|p| format!(" ({})", p.display()))
                .unwrap_or_default();
            return Authentication::not(
                &format!(
                    "no seal key for this user on this machine{place}; the seal names key {} — \
                     verify where it was sealed to authenticate it",
                    mac.key_id
                ),
                seal_key,
            );
        };
        if mac.key_id != key.id() {
            return Authentication::not(
                &format!(
                    "sealed with key {}, not this user's key {} (another machine or user)",
                    mac.key_id,
                    key.id()
                ),
                seal_key,
            );
        }
        if mac.algorithm == MAC_ALGORITHM
            && key.verify_mac(MacPurpose::Seal, &seal.body(), &mac.value)
        {
            Authentication {
                state: AuthState::Authenticated,
                detail: format!(
                    "the seal's HMAC-SHA256 checks under this user's key {}",
                    key.id()
                ),
                seal_key_id: seal_key,
                signed_by: None,
                by_signature: false,
                seal_digest: None,
            }
        } else {
            Authentication {
                state: AuthState::Forged,
                detail: format!(
                    "the seal names this user's key {} but its MAC does not match: the seal was \
                     made or changed by someone else",
                    key.id()
                ),
                seal_key_id: seal_key,
                signed_by: None,
                by_signature: false,
                seal_digest: None,
            }
        }
    }

    /// The seal's authentication: its MAC under this user's key; where that cannot authenticate
    /// it (no key, another user's or machine's key, no MAC) and trusted public keys are given,
    /// its signature under them. A signature that names a trusted key and does not verify is a
    /// forgery, like a MAC that names this user's key and does not match.
    pub(crate) fn authenticate(&self, seal: &Integrity) -> Authentication {
        let mut auth = self.authenticate_mac(seal);
        auth.signed_by = seal.signature.as_ref().map(|s| s.key_id.clone());
        auth.seal_digest = Some(seal.digest.clone());
        // A signature is checked against the key it names whatever is trusted: a seal whose
        // signature was changed is not intact.
        if let Some(Err(why)) = seal
            .signature
            .as_ref()
            .map(|s| s.self_check(&seal.compute_digest()))
        {
            return Authentication {
                state: AuthState::Forged,
                detail: format!("the seal's signature is damaged: {why}"),
                ..auth
            };
        }
        if auth.state != AuthState::NotAuthenticated || self.trusted.is_empty() {
            return auth;
        }
        let Some(sig) = &seal.signature else {
            auth.detail
                .push_str("; the seal carries no signature for the trusted keys to check");
            return auth;
        };
        match sig.check(&seal.compute_digest(), &self.trusted) {
            SignatureCheck::Verified { key_id } => Authentication {
                state: AuthState::Authenticated,
                detail: format!("the seal's Ed25519 signature checks under trusted key {key_id}"),
                by_signature: true,
                ..auth
            },
            SignatureCheck::UntrustedKey { key_id } => {
                auth.detail.push_str(&format!(
                    "; the seal is signed by key {key_id}, which is not among the trusted keys"
                ));
                auth
            }
            SignatureCheck::Bad { key_id, reason } => Authentication {
                state: AuthState::Forged,
                detail: format!(
                    "the seal names trusted key {key_id} but {reason}: it was made or changed by \
                     someone else"
                ),
                ..auth
            },
        }
    }

    /// Ledger entries of `run` under this context's root.
    pub fn ledger_entries<'a>(&'a self, run: &'a str) -> impl Iterator<Item = &'a LedgerEntry> {
        let root = self.root.as_deref();
        self.authenticated_ledger(move |e| e.run_id == run && Some(e.root.as_str()) == root)
    }

    /// The ledger lines `select` keeps that authenticate under this context's key (none without
    /// a key): only those lines' MACs are checked.
    fn authenticated_ledger<'a>(
        &'a self,
        select: impl Fn(&LedgerEntry) -> bool + 'a,
    ) -> impl Iterator<Item = &'a LedgerEntry> + 'a {
        self.key
            .as_ref()
            .zip(self.ledger.as_ref())
            .map(|(key, ledger)| ledger.authenticated(key, select))
            .into_iter()
            .flatten()
    }

    /// Whether this user's ledger records `run` as sealed under this context's root (its last
    /// authenticated line is a seal, not a prune). Without a key or ledger, nothing is recorded.
    pub fn ledger_records_seal(&self, run: &str) -> bool {
        self.ledger_entries(run)
            .last()
            .is_some_and(|e| !e.is_pruned())
    }

    /// Run ids the ledger records under this context's root, except those whose last line says
    /// they were pruned.
    pub fn ledgered_runs(&self) -> std::collections::BTreeSet<String> {
        let root = self.root.as_deref();
        let mut last = std::collections::BTreeMap::new();
        for e in self.authenticated_ledger(|e| Some(e.root.as_str()) == root) {
            last.insert(e.run_id.clone(), e.is_pruned());
        }
        last.into_iter()
            .filter(|(_, pruned)| !pruned)
            .map(|(run, _)| run)
            .collect()
    }

    pub(crate) fn check_ledger(
        &self,
        run: &RunId,
        digest: Option<&str>,
        auth: &Authentication,
        f: &mut Findings,
    ) {
        if self.ledger.is_none() {
            f.notes
                .push("no ledger for this user here: ledger consistency was not checked".into());
            return;
        }
        if auth.by_signature {
            f.notes.push(
                "authenticated by a trusted signature: this user's ledger records only the seals \
                 made here, so it was not consulted"
                    .into(),
            );
            return;
        }
        let entries: Vec<&LedgerEntry> = self.ledger_entries(run.as_str()).collect();
        let Some(last) = entries.last() else {
            if auth.is_authenticated() {
                f.notes.push(
                    "this user's ledger has no entry for the run (the ledger was truncated or \
                     replaced)"
                        .into(),
                );
            }
            return;
        };
        match digest {
            Some(d) if entries.iter().any(|e| e.seal_digest == d) => {
                if !auth.is_authenticated() {
                    f.problem(
                        "ledger",
                        format!(
                            "the ledger records this seal as made here with key {}, but the \
                             capsule does not authenticate: {}",
                            last.key_id, auth.detail
                        ),
                    );
                }
            }
            Some(d) => f.problem(
                "ledger",
                format!(
                    "ledger mismatch: this user's ledger records run {} sealed at {} with digest \
                     {}, but the capsule's seal has digest {d} (replaced after the seal)",
                    run, last.sealed_at, last.seal_digest
                ),
            ),
            None => f.problem(
                "ledger",
                format!(
                    "ledger mismatch: this user's ledger records run {} sealed at {} with digest \
                     {}, but the capsule has no readable seal of the current format",
                    run, last.sealed_at, last.seal_digest
                ),
            ),
        }
    }
}

/// Bytes the `launched` event's MAC covers: the run id and the event's own fields (without the
/// log's `seq`, `at`, `event` and the `mac` itself). serde_json maps are sorted, so this is
/// canonical.
pub fn launch_event_body(run_id: &str, fields: &serde_json::Value) -> Vec<u8> {
    let mut fields = fields.clone();
    if let Some(map) = fields.as_object_mut() {
        for k in ["seq", "at", "event", "mac"] {
            map.remove(k);
        }
    }
    serde_json::to_vec(&serde_json::json!({ "run_id": run_id, "fields": fields }))
        .unwrap_or_default()
}

/// Whether a `launched` event read back from events.jsonl carries a MAC made with `key` for
/// this run.
pub fn launch_event_authenticates(key: &SealKey, run_id: &str, event: &serde_json::Value) -> bool {
    event
        .get("mac")
        .and_then(serde_json::Value::as_str)
        .is_some_and(|mac| {
            key.verify_mac(
                MacPurpose::LaunchEvent,
                &launch_event_body(run_id, event),
                mac,
            )
        })
}
