//! The earlier scan a before-scan may take its stat cache from (see `agentdiff_scan::ScanOptions::reuse`
//! and docs/capsule-format.md, "Stat cache").
//!
//! Invariant: a manifest is returned only from a run whose seal is of the current format, is
//! canonical, authenticates under this user's key (HMAC) and is recorded in this user's ledger,
//! and only when the manifest artifact's bytes — the very bytes parsed — hash to the value the
//! seal lists; the root tree it names, and every tree below it, are verified against their ids
//! when the scan reads them (a tree that does not verify just means no cache below it). A capsule planted or edited in
//! `.agentdiff/` without the key therefore never feeds the cache.
//!
//! Not defended: a process that can read the seal key (the wrapped command under a backend that
//! does not hide the state directory) can seal a capsule of its own making; the cache then trusts
//! it as `verify` would call it authenticated. `capture.trust_stat: false` turns the cache off.

use std::fs;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use super::capsule::MAX_ARTIFACT_BYTES;
use super::integrity::Findings;
use super::seal::VerifyContext;
use super::{atomic, Artifact, Capsule, ManifestObject, RunId, Store};
use agentdiff_scan::Manifest;

/// How many candidate runs are tried before giving up: an old capsule is as good as a new one
/// for safety, but rarely worth the reading.
const MAX_CANDIDATES: usize = 4;

/// A manifest from a verified earlier run: its header and its root tree, whose directories the
/// scan reads (each verified against its id) as it reaches them, so the earlier manifest is never
/// held whole. Schema-1 manifests (one entries object) offer no cache.
#[derive(Debug, Clone)]
pub struct PreviousScan {
    pub run_id: RunId,
    /// `after.json` when it was scanned at `root`, else `before.json`.
    pub artifact: Artifact,
    /// The header (`entries` is empty).
    pub manifest: Manifest,
    pub root_tree: String,
}

impl Store {
    /// The newest verified manifest of this store scanned at `root` (the canonical project root),
    /// or `None` when no recent run qualifies. Never fails: anything unreadable or unverifiable
    /// just means no cache.
    ///
    /// `recent` are this project's latest sealed runs as the ledger's tail names them, newest
    /// first ([`super::seal::SealAuthority::recent_sealed_runs`]): they are tried first, checked
    /// against `tail`, a context over the same tail of the ledger
    /// ([`super::seal::SealAuthority::recent_verify_context`]), so a run costs the same with ten
    /// earlier runs in the store and the ledger or ten thousand. Only when none of them
    /// qualifies (the tail holds other projects' runs, or those capsules are gone) is `full`
    /// called for the whole ledger's context, and the run directories listed, newest modified
    /// first. Either way a candidate must pass the same checks (see the module doc).
    pub fn previous_verified_manifest(
        &self,
        tail: &VerifyContext,
        full: impl FnOnce() -> Option<VerifyContext>,
        root: &str,
        recent: &[String],
    ) -> Option<PreviousScan> {
        let named = || {
            recent
                .iter()
                .filter_map(|id| RunId::parse(id).ok())
                .take(MAX_CANDIDATES)
        };
        if let Some(found) = named().find_map(|id| self.verified_scan(tail, &id, root)) {
            return Some(found);
        }
        let ctx = full()?;
        named()
            .find_map(|id| self.verified_scan(&ctx, &id, root))
            .or_else(|| {
                self.newest_run_dirs()?
                    .into_iter()
                    .filter(|id| !recent.iter().any(|r| r == id.as_str()))
                    .take(MAX_CANDIDATES)
                    .find_map(|id| self.verified_scan(&ctx, &id, root))
            })
    }

    /// The store's run directories, most recently modified first.
    fn newest_run_dirs(&self) -> Option<Vec<RunId>> {
        let mut runs: Vec<(SystemTime, RunId)> = fs::read_dir(self.runs_dir())
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| {
                let id = RunId::parse(e.file_name().to_str()?).ok()?;
                let meta = fs::symlink_metadata(e.path()).ok()?;
                (meta.is_dir()).then_some(())?;
                Some((meta.modified().ok()?, id))
            })
            .collect();
        runs.sort_by(|a, b| b.cmp(a));
        Some(runs.into_iter().map(|(_, id)| id).collect())
    }

    fn verified_scan(&self, ctx: &VerifyContext, id: &RunId, root: &str) -> Option<PreviousScan> {
        let capsule = self.open_run(id.as_str()).ok()?;
        let seal = capsule.authenticated_seal(ctx)?;
        [Artifact::After, Artifact::Before]
            .into_iter()
            .find_map(|artifact| {
                let (manifest, root_tree) = capsule.sealed_manifest(artifact, &seal.artifacts)?;
                (manifest.root == root).then(|| PreviousScan {
                    run_id: id.clone(),
                    artifact,
                    manifest,
                    root_tree,
                })
            })
    }
}

impl Capsule {
    /// The current-format seal of this run when it is canonical, authenticated and in the ledger.
    pub(crate) fn authenticated_seal(&self, ctx: &VerifyContext) -> Option<super::Integrity> {
        let (seal, bytes) = self.parse_current_seal()?;
        let mut f = Findings::default();
        self.check_seal_header(&seal, &bytes, &mut f);
        let auth = ctx.authenticate(&seal);
        if !auth.is_authenticated() {
            return None;
        }
        ctx.check_ledger(self.id(), Some(&seal.digest), &auth, &mut f);
        let in_ledger = ctx
            .ledger_entries(self.id().as_str())
            .any(|e| e.seal_digest == seal.digest);
        (f.problems.is_empty() && in_ledger).then_some(seal)
    }

    /// The header and root tree of a manifest artifact whose bytes hash to what the seal lists
    /// (read once: the bytes hashed are the bytes parsed).
    fn sealed_manifest(
        &self,
        artifact: Artifact,
        sealed: &std::collections::BTreeMap<String, String>,
    ) -> Option<(Manifest, String)> {
        let name = artifact.file_name();
        let expected = sealed.get(name)?;
        let bytes = atomic::read_bounded(&self.dir().join(name), MAX_ARTIFACT_BYTES).ok()?;
        if hex::encode(Sha256::digest(&bytes)) != *expected {
            return None;
        }
        let header = serde_json::from_slice(&bytes).ok()?;
        match self.header_only(artifact, header).ok()? {
            (manifest, ManifestObject::Tree(root)) => Some((manifest, root)),
            (_, ManifestObject::Entries(_)) => None,
        }
    }
}
