//! Signed evidence: an Ed25519 key per user and machine signs every seal (and every attestation),
//! so a capsule authenticates anywhere its public key is trusted, not only where the per-user HMAC
//! key lives.
//!
//! The key is 32 random bytes (the Ed25519 seed) in `<state dir>/signing.key`, created on first
//! use the way the seal key is (private temp file hard-linked into place; owner-only, never a
//! symlink). `$AGENTDIFF_SIGNING_KEY_FILE` names another key instead (CI keeps its key in a
//! secret): the raw 32-byte seed or a PKCS#8 PEM Ed25519 private key, a private regular file
//! outside the project root. The key id is the SHA-256 of the raw public key, in hex.
//!
//! A seal signature covers the seal's digest (the SHA-256 of its canonical body, which names every
//! artifact's and object's hash) behind a context string, so it cannot be replayed as an
//! attestation signature or the reverse. Signing the digest rather than the body keeps the cost
//! constant: a body listing 20,000 objects is 1.3 MB, and Ed25519 hashes its message twice with
//! SHA-512 in software (measured: 9.8 ms for that body, 81 us for a small one; the digest is
//! computed once with the CPU's SHA-256 instructions anyway).
//!
//! Not defended: whoever can read the signing key can sign as this user (under the `local`
//! backend that includes the wrapped command, as for the seal key); a trusted key that leaked
//! must be removed from every trusted-keys file. Key rotation is the operator's: a new key file
//! signs new seals, old capsules stay signed by the old key.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey as Seed, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::key::{load_or_create_secret, StateDir};
use crate::atomic;
use crate::StoreError;

/// The signing key's file name in the state directory.
pub const SIGNING_KEY_FILE_NAME: &str = "signing.key";
/// Environment variable naming a signing key file to use instead (CI).
pub const SIGNING_KEY_FILE_ENV: &str = "AGENTDIFF_SIGNING_KEY_FILE";
/// The one signature algorithm agentdiff writes and accepts.
pub const SIGNATURE_ALGORITHM: &str = "ed25519";

/// What a seal signature signs: this context, then the seal's canonical body.
const SEAL_CONTEXT: &[u8] = b"agentdiff/v1/seal-signature\0";
/// DER prefix of an Ed25519 SubjectPublicKeyInfo (RFC 8410); the 32 key bytes follow.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
/// DER prefix of an Ed25519 PKCS#8 v1 private key (RFC 8410); the 32 seed bytes follow.
const PKCS8_PREFIX: [u8; 16] = [
    0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
/// Largest key file read (a PEM private key is about 120 bytes).
const MAX_KEY_FILE: u64 = 16 * 1024;

/// Why a key or a signature cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SigningError {
    #[error("{what} is not an Ed25519 key agentdiff can read: {reason}")]
    BadKey { what: String, reason: String },
    #[error("{path}: {reason}")]
    KeyFile { path: PathBuf, reason: String },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// This user's (or CI's) private signing key. Its bytes are never printed.
pub struct SigningKey {
    seed: Seed,
    public: PublicKey,
    source: PathBuf,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.public.id)
            .field("source", &self.source)
            .finish()
    }
}

impl SigningKey {
    /// A key from its 32-byte seed (tests and embedders that manage keys themselves).
    pub fn from_seed(seed: [u8; 32], source: PathBuf) -> SigningKey {
        let seed = Seed::from_bytes(&seed);
        let public = PublicKey::of(seed.verifying_key());
        SigningKey {
            seed,
            public,
            source,
        }
    }

    /// The key `$AGENTDIFF_SIGNING_KEY_FILE` names, else the state directory's (created on
    /// first use). A key file inside `project_root` is refused: the command could replace it.
    pub fn load_or_create(
        state: &StateDir,
        project_root: &Path,
    ) -> Result<SigningKey, SigningError> {
        if let Some(path) = std::env::var_os(SIGNING_KEY_FILE_ENV).filter(|v| !v.is_empty()) {
            return SigningKey::from_file(Path::new(&path), project_root);
        }
        let path = state.path().join(SIGNING_KEY_FILE_NAME);
        let seed = load_or_create_secret(state, &path, "signing key")?;
        Ok(SigningKey::from_seed(seed, path))
    }

    /// The key in the file at `path`: the raw 32-byte seed or a PKCS#8 PEM private key; a private
    /// regular file of this user, outside `project_root`.
    pub fn from_file(path: &Path, project_root: &Path) -> Result<SigningKey, SigningError> {
        let bad = |reason: String| SigningError::KeyFile {
            path: path.to_path_buf(),
            reason,
        };
        if !path.is_absolute() {
            return Err(bad(format!(
                "{SIGNING_KEY_FILE_ENV} must name an absolute path"
            )));
        }
        let real = path
            .canonicalize()
            .map_err(|e| bad(format!("cannot be resolved: {e}")))?;
        let root = project_root
            .canonicalize()
            .unwrap_or_else(|_| project_root.to_path_buf());
        if real.starts_with(&root) {
            return Err(bad(format!(
                "lies inside the project root {}; keep signing keys outside every project",
                root.display()
            )));
        }
        check_private_file(&real).map_err(bad)?;
        let bytes = atomic::read_bounded(&real, MAX_KEY_FILE)?;
        let seed = parse_private_key(&bytes).map_err(bad)?;
        Ok(SigningKey::from_seed(seed, real))
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    pub fn id(&self) -> &str {
        &self.public.id
    }

    /// Where the key was read from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// The raw signature of `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.seed.sign(message).to_bytes()
    }

    /// The signature a seal carries over its `digest` (hex SHA-256 of its canonical body).
    pub fn sign_seal(&self, digest: &str) -> SealSignature {
        let message = seal_message(digest);
        SealSignature {
            algorithm: SIGNATURE_ALGORITHM.to_string(),
            key_id: self.id().to_string(),
            public_key: self.public.to_base64(),
            value: B64.encode(self.sign(&message)),
        }
    }
}

/// An Ed25519 public key and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    id: String,
}

impl PublicKey {
    fn of(key: VerifyingKey) -> PublicKey {
        let id = hex::encode(Sha256::digest(key.as_bytes()));
        PublicKey { key, id }
    }

    /// A key from its 32 raw bytes.
    pub fn from_bytes(bytes: &[u8], what: &str) -> Result<PublicKey, SigningError> {
        let raw: [u8; 32] = bytes.try_into().map_err(|_| SigningError::BadKey {
            what: what.to_string(),
            reason: format!("{} bytes, not 32", bytes.len()),
        })?;
        VerifyingKey::from_bytes(&raw)
            .map(PublicKey::of)
            .map_err(|e| SigningError::BadKey {
                what: what.to_string(),
                reason: e.to_string(),
            })
    }

    /// Hex SHA-256 of the raw public key.
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn raw(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// The raw key in base64.
    pub fn to_base64(&self) -> String {
        B64.encode(self.key.as_bytes())
    }

    /// The key as a PEM `PUBLIC KEY` (SubjectPublicKeyInfo), as OpenSSL and cosign read it.
    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.key.as_bytes());
        let body = B64.encode(der);
        format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n")
    }

    /// The key as an OpenSSH `ssh-ed25519` line.
    pub fn to_ssh(&self, comment: &str) -> String {
        let mut blob = Vec::with_capacity(51);
        for part in [b"ssh-ed25519".as_slice(), self.key.as_bytes()] {
            blob.extend_from_slice(&(part.len() as u32).to_be_bytes());
            blob.extend_from_slice(part);
        }
        format!("ssh-ed25519 {} {comment}", B64.encode(blob))
    }

    /// The key as securesystemslib (in-toto, TUF) describes it.
    pub fn to_sslib(&self) -> serde_json::Value {
        serde_json::json!({
            "keyid": self.id,
            "keytype": "ed25519",
            "scheme": "ed25519",
            "keyval": { "public": hex::encode(self.key.as_bytes()) },
        })
    }

    /// Whether `signature` is this key's signature of `message` (strict verification: no
    /// malleable or small-order forms).
    pub fn verifies(&self, message: &[u8], signature: &[u8]) -> bool {
        let Ok(sig) = <[u8; 64]>::try_from(signature) else {
            return false;
        };
        self.key
            .verify_strict(message, &Signature::from_bytes(&sig))
            .is_ok()
    }

    /// Every key in a trusted-keys text: PEM `PUBLIC KEY` blocks, `ssh-ed25519` lines, lines of
    /// a base64 raw key; blank lines and `#` comments are skipped. Anything else is an error
    /// naming its line, never skipped (a key silently not trusted would read as "not signed").
    pub fn parse_all(text: &str) -> Result<Vec<PublicKey>, SigningError> {
        let mut keys = Vec::new();
        let mut pem: Option<(usize, String)> = None;
        for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            let what = || format!("line {n}");
            if let Some((start, body)) = pem.as_mut() {
                if line == "-----END PUBLIC KEY-----" {
                    let der = B64
                        .decode(body.as_bytes())
                        .map_err(|e| SigningError::BadKey {
                            what: format!("the PEM block at line {start}"),
                            reason: e.to_string(),
                        })?;
                    let raw =
                        der.strip_prefix(&SPKI_PREFIX[..])
                            .ok_or_else(|| SigningError::BadKey {
                                what: format!("the PEM block at line {start}"),
                                reason: "not an Ed25519 SubjectPublicKeyInfo".into(),
                            })?;
                    keys.push(PublicKey::from_bytes(raw, &format!("line {start}"))?);
                    pem = None;
                } else {
                    body.push_str(line);
                }
                continue;
            }
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if line == "-----BEGIN PUBLIC KEY-----" {
                pem = Some((n, String::new()));
            } else if let Some(rest) = line.strip_prefix("ssh-ed25519 ") {
                keys.push(parse_ssh_blob(
                    rest.split_whitespace().next().unwrap_or(""),
                    &what(),
                )?);
            } else {
                let raw = B64.decode(line).map_err(|e| SigningError::BadKey {
                    what: what(),
                    reason: format!("neither PEM, ssh-ed25519 nor base64: {e}"),
                })?;
                keys.push(PublicKey::from_bytes(&raw, &what())?);
            }
        }
        if let Some((start, _)) = pem {
            return Err(SigningError::BadKey {
                what: format!("the PEM block at line {start}"),
                reason: "no END line".into(),
            });
        }
        Ok(keys)
    }
}

fn parse_ssh_blob(b64: &str, what: &str) -> Result<PublicKey, SigningError> {
    let bad = |reason: &str| SigningError::BadKey {
        what: what.to_string(),
        reason: reason.to_string(),
    };
    let blob = B64
        .decode(b64)
        .map_err(|_| bad("the ssh key is not base64"))?;
    let mut rest = blob.as_slice();
    let mut field = || -> Option<Vec<u8>> {
        let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let value = rest.get(4..4 + len)?.to_vec();
        rest = rest.get(4 + len..)?;
        Some(value)
    };
    match (field(), field()) {
        (Some(kind), Some(raw)) if kind == b"ssh-ed25519" => PublicKey::from_bytes(&raw, what),
        _ => Err(bad("not an ssh-ed25519 key blob")),
    }
}

/// The seed in a private key file's bytes: 32 raw bytes, or a PKCS#8 PEM `PRIVATE KEY`.
fn parse_private_key(bytes: &[u8]) -> Result<[u8; 32], String> {
    if let Ok(seed) = <[u8; 32]>::try_from(bytes) {
        return Ok(seed);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| {
        format!(
            "{} bytes that are neither a raw 32-byte Ed25519 seed nor PEM",
            bytes.len()
        )
    })?;
    let body: String = text
        .lines()
        .map(str::trim)
        .skip_while(|l| *l != "-----BEGIN PRIVATE KEY-----")
        .skip(1)
        .take_while(|l| *l != "-----END PRIVATE KEY-----")
        .collect();
    let der = B64
        .decode(body.as_bytes())
        .map_err(|e| format!("the PEM PRIVATE KEY block is not base64: {e}"))?;
    der.strip_prefix(&PKCS8_PREFIX[..])
        .and_then(|seed| <[u8; 32]>::try_from(seed).ok())
        .ok_or_else(|| {
            "not an Ed25519 PKCS#8 private key (openssl genpkey -algorithm ed25519)".into()
        })
}

/// A key file must be a regular file of this user, unreadable to others.
fn check_private_file(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!("is owned by uid {}, not by this user", meta.uid()));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "has mode {:o}; a signing key must be readable by its owner only (chmod 600)",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// What a seal signature signs: the context, then the seal's hex digest.
fn seal_message(digest: &str) -> Vec<u8> {
    let mut message = Vec::with_capacity(SEAL_CONTEXT.len() + digest.len());
    message.extend_from_slice(SEAL_CONTEXT);
    message.extend_from_slice(digest.as_bytes());
    message
}

/// A seal's signature (`integrity.json` → `signature`): covers the seal's digest. It names the
/// public key that made it, so every verification checks it (a changed byte anywhere in it is
/// found without any trusted key); whether that key is trusted is a separate question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SealSignature {
    pub algorithm: String,
    /// [`PublicKey::id`] of the key that signed.
    pub key_id: String,
    /// Base64 of the raw 32-byte public key.
    pub public_key: String,
    /// Base64 of the 64-byte signature.
    pub value: String,
}

/// What a seal signature says under a set of trusted keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureCheck {
    /// Made by this trusted key over this body.
    Verified { key_id: String },
    /// Made by a key that is not among the trusted ones (nothing can be said of it).
    UntrustedKey { key_id: String },
    /// Names a trusted key but does not verify: the seal was made or changed by someone else.
    Bad { key_id: String, reason: String },
}

impl SealSignature {
    /// Whether the signature is well formed and verifies over `digest` under the public key it
    /// names (whose id it must carry): `Err` says what is wrong. Says nothing about trust.
    pub fn self_check(&self, digest: &str) -> Result<(), String> {
        if self.algorithm != SIGNATURE_ALGORITHM {
            return Err(format!(
                "algorithm {:?}, not {SIGNATURE_ALGORITHM}",
                self.algorithm
            ));
        }
        let raw = B64
            .decode(self.public_key.as_bytes())
            .map_err(|_| "its public key is not base64".to_string())?;
        let key =
            PublicKey::from_bytes(&raw, "the seal's public key").map_err(|e| e.to_string())?;
        if key.id != self.key_id {
            return Err("its key id is not the id of the public key it names".into());
        }
        let sig = B64
            .decode(self.value.as_bytes())
            .map_err(|_| "the signature is not base64".to_string())?;
        if key.verifies(&seal_message(digest), &sig) {
            Ok(())
        } else {
            Err("the signature does not match the seal".into())
        }
    }

    /// Checks the signature of the seal whose digest (recomputed from its body) is `digest`
    /// against `trusted`.
    pub fn check(&self, digest: &str, trusted: &[PublicKey]) -> SignatureCheck {
        let key_id = self.key_id.clone();
        let Some(key) = trusted.iter().find(|k| k.id == self.key_id) else {
            return SignatureCheck::UntrustedKey { key_id };
        };
        if self.algorithm != SIGNATURE_ALGORITHM {
            return SignatureCheck::Bad {
                key_id,
                reason: format!("algorithm {:?}, not {SIGNATURE_ALGORITHM}", self.algorithm),
            };
        }
        let Ok(sig) = B64.decode(self.value.as_bytes()) else {
            return SignatureCheck::Bad {
                key_id,
                reason: "the signature is not base64".into(),
            };
        };
        if key.verifies(&seal_message(digest), &sig) {
            SignatureCheck::Verified { key_id }
        } else {
            SignatureCheck::Bad {
                key_id,
                reason: "the signature does not match the seal".into(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> SigningKey {
        SigningKey::from_seed([n; 32], PathBuf::from("/test"))
    }

    #[test]
    fn a_seal_signature_verifies_only_under_its_key_and_body() {
        let k = key(1);
        let sig = k.sign_seal("ab12");
        let trusted = vec![k.public().clone()];
        assert_eq!(
            sig.check("ab12", &trusted),
            SignatureCheck::Verified {
                key_id: k.id().to_string()
            }
        );
        assert!(matches!(
            sig.check("ab13", &trusted),
            SignatureCheck::Bad { .. }
        ));
        assert!(matches!(
            sig.check("ab12", &[key(2).public().clone()]),
            SignatureCheck::UntrustedKey { .. }
        ));
        // The bare digest signed without the seal context is not a seal signature.
        let bare = SealSignature {
            value: B64.encode(k.sign(b"ab12")),
            ..sig.clone()
        };
        assert!(matches!(
            bare.check("ab12", &trusted),
            SignatureCheck::Bad { .. }
        ));
    }

    #[test]
    fn a_changed_byte_anywhere_in_a_signature_fails_its_self_check() {
        let sig = key(6).sign_seal("ab12");
        assert_eq!(sig.self_check("ab12"), Ok(()));
        assert!(sig.self_check("ab13").is_err());
        let flip = |s: &str| {
            let mut b = s.as_bytes().to_vec();
            b[2] ^= 0x01;
            String::from_utf8(b).unwrap()
        };
        for changed in [
            SealSignature {
                value: flip(&sig.value),
                ..sig.clone()
            },
            SealSignature {
                public_key: flip(&sig.public_key),
                ..sig.clone()
            },
            SealSignature {
                key_id: flip(&sig.key_id),
                ..sig.clone()
            },
            SealSignature {
                algorithm: "ed25518".into(),
                ..sig.clone()
            },
        ] {
            assert!(changed.self_check("ab12").is_err(), "{changed:?}");
        }
    }

    #[test]
    fn every_printed_form_parses_back_to_the_same_key() {
        let k = key(3);
        let p = k.public();
        let text = format!(
            "# trusted\n{}\n{}\n\n{}\n",
            p.to_pem(),
            p.to_ssh("ci@example"),
            p.to_base64()
        );
        let parsed = PublicKey::parse_all(&text).unwrap();
        assert_eq!(parsed, vec![p.clone(), p.clone(), p.clone()]);
        assert_eq!(p.id(), hex::encode(Sha256::digest(p.raw())));
    }

    #[test]
    fn a_line_that_is_no_key_is_an_error_not_a_skip() {
        let e = PublicKey::parse_all("ssh-rsa AAAAB3NzaC1yc2E= x\n").unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        assert!(PublicKey::parse_all("-----BEGIN PUBLIC KEY-----\nAAAA\n").is_err());
    }

    #[test]
    fn private_keys_are_read_raw_or_as_pkcs8_pem() {
        let seed = [7u8; 32];
        assert_eq!(parse_private_key(&seed).unwrap(), seed);
        let mut der = PKCS8_PREFIX.to_vec();
        der.extend_from_slice(&seed);
        let pem = format!(
            "-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n",
            B64.encode(der)
        );
        assert_eq!(parse_private_key(pem.as_bytes()).unwrap(), seed);
        assert!(parse_private_key(b"short").is_err());
    }

    #[test]
    fn a_key_file_inside_the_project_or_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        std::fs::create_dir(&root).unwrap();
        let inside = root.join("k");
        std::fs::write(&inside, [1u8; 32]).unwrap();
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = SigningKey::from_file(&inside, &root).unwrap_err();
        assert!(e.to_string().contains("inside the project root"), "{e}");
        let outside = dir.path().join("k");
        std::fs::write(&outside, [1u8; 32]).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(SigningKey::from_file(&outside, &root).is_err());
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        let k = SigningKey::from_file(&outside, &root).unwrap();
        assert_eq!(k.id(), key(1).id());
    }
}
