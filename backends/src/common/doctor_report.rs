//! The `agentdiff doctor` report: every registered backend's declared levels, availability,
//! diagnostics and (with probes) what the conformance probes verified here. `cli/doctor.rs`
//! parses the arguments and renders it; `--format json` prints it as it is.

use std::collections::BTreeMap;

use agentdiff_backend_api::recommend::{recommend, Candidate, ProbeOutcome, Recommendation};
use agentdiff_backend_api::{
    Availability, BackendDescriptor, BackendOptions, Boundary, DynRuntimeBackend, Level,
    OptionSpec, WorkspaceMode,
};
use agentdiff_conformance::probes::{
    self, HostId, ProbeOptions, ProbeRecord, ProbeResult, Verdict,
};
use agentdiff_plugins::Registry;
use agentdiff_process::TrackingMechanism;
use serde::Serialize;
use serde_json::Value;

/// The report `doctor` prints: `--format json` is this document, the summary renders it.
#[derive(Debug, Serialize)]
pub struct DoctorReport {
    pub schema_version: u32,
    pub host: Option<HostId>,
    pub process_tracking: Vec<TrackingMechanism>,
    pub backends: Vec<BackendEntry>,
    pub recommended: Option<Recommendation>,
    /// `agentdiff-backend-<id>` programs on PATH that could not be loaded.
    pub external_backends_refused: Vec<RefusedExternal>,
}

/// An external backend program that was found but not loaded.
#[derive(Debug, Serialize)]
pub struct RefusedExternal {
    pub id: String,
    pub paths: Vec<std::path::PathBuf>,
    pub error: String,
}

/// Where an external backend's program is and which protocol it speaks.
#[derive(Debug, Serialize)]
pub struct ExternalEntry {
    pub path: std::path::PathBuf,
    pub protocol: u32,
}

/// One backend's row.
#[derive(Debug, Serialize)]
pub struct BackendEntry {
    pub id: &'static str,
    pub summary: &'static str,
    pub capabilities: BTreeMap<&'static str, Level>,
    pub sandboxed: bool,
    pub network_enforcement: bool,
    pub workspace: WorkspaceMode,
    pub availability: AvailabilityEntry,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalEntry>,
    pub options: &'static [OptionSpec],
    /// The diagnostics hook's facts, top-level fields of the entry as the report has always
    /// shown them; `diagnostics` names them in order.
    #[serde(flatten)]
    pub facts: serde_json::Map<String, Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostics: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeSection>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_record: Option<ProbeRecord>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_record_error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum AvailabilityEntry {
    Ready { detail: String },
    Unavailable { reason: String, remedy: String },
}

impl From<&Availability> for AvailabilityEntry {
    fn from(a: &Availability) -> Self {
        match a {
            Availability::Ready { detail } => AvailabilityEntry::Ready {
                detail: detail.clone(),
            },
            Availability::Unavailable { reason, remedy } => AvailabilityEntry::Unavailable {
                reason: reason.clone(),
                remedy: remedy.clone(),
            },
        }
    }
}

/// `--probe`: what each probe found, or why none ran.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ProbeSection {
    Ran {
        /// Boundary → verdict (`not_probed` when no probe covers it).
        verified: BTreeMap<&'static str, &'static str>,
        results: Vec<ProbeResult>,
    },
    Skipped {
        skipped: &'static str,
    },
}

pub async fn assemble(
    registry: &Registry,
    ids: &[&'static str],
    options: &BackendOptions,
    probe: bool,
) -> anyhow::Result<DoctorReport> {
    let mut backends = Vec::new();
    let mut candidates = Vec::new();
    for id in ids {
        let (Some(descriptor), Ok(backend)) = (registry.get(id), registry.create(id)) else {
            continue;
        };
        let (mut entry, candidate) = backend_entry(descriptor, backend, options, probe).await;
        entry.external = registry.external(id).map(|ext| ExternalEntry {
            path: ext.plugin.path.clone(),
            protocol: ext.protocol,
        });
        backends.push(entry);
        // A plugin's labels are its own word: it is listed, never recommended.
        if registry.external(id).is_none() {
            candidates.push(candidate);
        }
    }
    Ok(DoctorReport {
        schema_version: 1,
        host: probes::current_host().ok(),
        process_tracking: agentdiff_process::tracking_mechanisms_available(),
        backends,
        recommended: recommend(&candidates),
        external_backends_refused: Vec::new(),
    })
}

/// One backend's availability, labels, diagnostics and (with `probe`) probe results.
async fn backend_entry(
    descriptor: &BackendDescriptor,
    backend: Box<dyn DynRuntimeBackend>,
    options: &BackendOptions,
    probe: bool,
) -> (BackendEntry, Candidate) {
    // Options another backend declares are not this backend's: each gets only its own.
    let own = own_options(descriptor, options);
    let caps = backend.capabilities(&own);
    let availability = backend.availability(&own).await;
    let mut candidate = Candidate {
        id: descriptor.id.to_string(),
        capabilities: caps.clone(),
        available: availability.is_ready(),
        probes: None,
    };
    let mut entry = BackendEntry {
        id: descriptor.id,
        summary: descriptor.summary,
        capabilities: caps.matrix(),
        sandboxed: caps.sandboxed,
        network_enforcement: caps.network_enforcement,
        workspace: caps.workspace,
        availability: (&availability).into(),
        external: None,
        options: descriptor.options,
        facts: serde_json::Map::new(),
        diagnostics: None,
        details: None,
        probe: None,
        probe_record: None,
        probe_record_error: None,
    };
    if let Some(hook) = descriptor.diagnostics {
        let diagnostics = hook(own.clone()).await;
        entry.diagnostics = Some(diagnostics.facts.iter().map(|f| f.name.clone()).collect());
        entry.facts = diagnostics
            .facts
            .into_iter()
            .map(|f| (f.name, f.value))
            .collect();
        entry.details = Some(diagnostics.details);
    }
    if probe && !availability.is_ready() {
        entry.probe = Some(ProbeSection::Skipped {
            skipped: "backend unavailable; nothing was probed",
        });
    } else if probe {
        let probe_options = ProbeOptions {
            backend_options: own.clone(),
            ..ProbeOptions::default()
        };
        let results = probes::run_all(backend.as_ref(), &probe_options).await;
        candidate.probes = Some(
            results
                .iter()
                .filter_map(|r| Some((r.boundary?, probe_outcome(r.verdict))))
                .collect(),
        );
        let verified = Boundary::ALL
            .iter()
            .map(|b| {
                let r = results.iter().find(|r| r.boundary == Some(*b));
                (b.as_str(), r.map_or("not_probed", |r| r.verdict.as_str()))
            })
            .collect();
        match ProbeRecord::new(descriptor.id, &own, results.clone()) {
            Ok(record) => entry.probe_record = Some(record),
            Err(e) => entry.probe_record_error = Some(e.to_string()),
        }
        entry.probe = Some(ProbeSection::Ran { verified, results });
    }
    (entry, candidate)
}

fn probe_outcome(v: Verdict) -> ProbeOutcome {
    match v {
        Verdict::Verified => ProbeOutcome::Verified,
        Verdict::NotEnforced => ProbeOutcome::NotEnforced,
        Verdict::NotApplicable | Verdict::Inconclusive => ProbeOutcome::Unknown,
    }
}

/// The options in `options` that `descriptor` declares.
fn own_options(descriptor: &BackendDescriptor, options: &BackendOptions) -> BackendOptions {
    let mut own = BackendOptions::new();
    for key in options.keys().filter(|k| descriptor.option(k).is_some()) {
        for v in options.get_all(key) {
            own.push(key, v.clone());
        }
    }
    own
}
