//! Keyed fingerprints of the command's environment: the transaction replaces the backends'
//! unkeyed fingerprints ([`agentdiff_host::redact::fingerprint`]) by MACs under the per-user key
//! before anything is written.

use agentdiff_backend_api::environment::KEYED_PREFIX;
use agentdiff_backend_api::EnvironmentEvidence;

use agentdiff_store::seal::{MacPurpose, SealKey};

/// Replaces every fingerprint by a keyed one: HMAC-SHA256 (per-user key, environment purpose) of
/// the name and the unkeyed fingerprint, 128 bits in hex. Equal values under one name still
/// compare equal across this user's runs, but a capsule alone no longer allows guessing a value
/// offline (a 4-digit PIN fell to 10,000 SHA-256 guesses). Backends fingerprint with
/// [`agentdiff_host::redact::fingerprint`] (they need no key); the transaction keys the result.
pub fn key_fingerprints(evidence: &mut EnvironmentEvidence, key: &SealKey) {
    for (name, fp) in evidence.variables.iter_mut() {
        if fp.starts_with(KEYED_PREFIX) {
            continue;
        }
        let mut data = Vec::with_capacity(name.len() + fp.len() + 1);
        data.extend_from_slice(name.as_bytes());
        data.push(0);
        data.extend_from_slice(fp.as_bytes());
        let mac = key.mac(MacPurpose::EnvFingerprint, &data);
        *fp = format!("{KEYED_PREFIX}{}", &mac[..32]);
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use agentdiff_backend_api::environment::{evidence_for_launch, EnvMode};
    use agentdiff_host::redact::fingerprint;

    use super::*;

    fn vars(list: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        list.iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    #[test]
    fn keyed_fingerprints_compare_under_one_key_and_hide_guessable_values() {
        let key = SealKey::from_bytes([1; 32]);
        let mut a = evidence_for_launch(&vars(&[("PIN", "4821")]), EnvMode::Inherit, &[]);
        let mut b = a.clone();
        key_fingerprints(&mut a, &key);
        key_fingerprints(&mut b, &key);
        assert_eq!(a, b);
        let fp = &a.variables["PIN"];
        assert!(fp.starts_with(KEYED_PREFIX), "{fp}");
        // The offline guess that worked on unkeyed fingerprints finds nothing.
        let guessed = (0..10_000).any(|pin| {
            let unkeyed = fingerprint("PIN", format!("{pin:04}").as_bytes());
            *fp == unkeyed || fp.ends_with(&unkeyed["sha256:".len()..])
        });
        assert!(!guessed);
        let mut c = evidence_for_launch(&vars(&[("PIN", "4821")]), EnvMode::Inherit, &[]);
        key_fingerprints(&mut c, &SealKey::from_bytes([2; 32]));
        assert_ne!(
            c.variables["PIN"], *fp,
            "another key gives another fingerprint"
        );
    }
}
