//! `agentdiff doctor`: the capability matrix of every registered backend — declared level per
//! boundary, availability with remedies — and, with `--probe`, what the conformance probes
//! verified on this host.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_conformance::probes::{self, HostId, ProbeOptions, ProbeRecord, Verdict};
use agentdiff_engine::backend::recommend::{recommend, Candidate, ProbeOutcome};
use agentdiff_engine::backend::{
    Availability, BackendDescriptor, BackendOptions, Boundary, Registry, WorkspaceMode,
};
use anyhow::Context;
use serde_json::{json, Value};

use crate::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Summary,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run the probes (outside write, outside read, host loopback connection, environment,
    /// daemon, pids limit, capabilities, host tree) inside each available backend and report what
    /// holds on this host.
    #[arg(long)]
    probe: bool,
    /// Only this backend.
    #[arg(long, value_name = "ID")]
    runtime: Option<String>,
    #[arg(long, value_enum, default_value = "summary")]
    format: Format,
    /// KEY=VALUE option handed to the backend for availability, diagnostics and probes
    /// (repeatable); each backend's options are listed in the report.
    #[arg(long = "backend-option", value_name = "KEY=VALUE")]
    backend_option: Vec<String>,
    /// With --probe: also write each backend's dated probe record (backend, settings digest,
    /// host, time, results) to this file as JSON, for runs to cite.
    #[arg(long, value_name = "FILE", requires = "probe")]
    record: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut registry =
        Registry::from_inventory().context("could not build the backend registry")?;
    // External backends: every `agentdiff-backend-<id>` on PATH is described (or refused).
    let (ids, plugins): (Vec<&'static str>, _) = match &args.runtime {
        Some(id) => (
            vec![
                registry
                    .resolve(id)
                    .map_err(|e| exit::with_code(exit::USAGE, e))?
                    .id,
            ],
            Vec::new(),
        ),
        None => {
            let plugins = registry.load_external();
            (registry.ids(), plugins)
        }
    };
    let options = parse_options(&args.backend_option)?;
    let rt = crate::cli::runtime()?;
    let mut doc = rt.block_on(assemble(&registry, &ids, &options, args.probe))?;
    doc["external_backends_refused"] = plugins
        .iter()
        .filter_map(|p| {
            let e = p.result.as_ref().err()?;
            Some(json!({"id": p.id, "paths": p.paths, "error": e.to_string()}))
        })
        .collect::<Vec<_>>()
        .into();
    if let Some(path) = &args.record {
        let records: Vec<&Value> = doc["backends"]
            .as_array()
            .map(|a| a.iter().filter_map(|b| b.get("probe_record")).collect())
            .unwrap_or_default();
        let text = serde_json::to_string_pretty(&records).context("serialising probe records")?;
        std::fs::write(path, text)
            .with_context(|| format!("could not write the probe record to {}", path.display()))?;
    }
    match args.format {
        Format::Json => {
            let text = serde_json::to_string_pretty(&doc).context("serialising the report")?;
            outln!("{text}");
        }
        Format::Summary => out!("{}", render_summary(&doc)),
    }
    Ok(ExitCode::SUCCESS)
}

/// `KEY=VALUE` words into backend options.
pub fn parse_options(words: &[String]) -> anyhow::Result<BackendOptions> {
    let mut o = BackendOptions::new();
    for kv in words {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(exit::with_code(
                exit::USAGE,
                anyhow::anyhow!("--backend-option `{kv}` must be KEY=VALUE"),
            ));
        };
        o.push(k.trim(), v);
    }
    Ok(o)
}

fn availability_json(a: &Availability) -> Value {
    match a {
        Availability::Ready { detail } => json!({"state": "ready", "detail": detail}),
        Availability::Unavailable { reason, remedy } => {
            json!({"state": "unavailable", "reason": reason, "remedy": remedy})
        }
    }
}

async fn assemble(
    registry: &Registry,
    ids: &[&'static str],
    options: &BackendOptions,
    probe: bool,
) -> anyhow::Result<Value> {
    let host = HostId::current().ok();
    let tracking: Vec<Value> = agentdiff_engine::process::tracking_mechanisms_available()
        .into_iter()
        .map(|m| json!({"name": m.name, "available": m.available, "detail": m.detail}))
        .collect();
    let mut backends = Vec::new();
    let mut candidates = Vec::new();
    for id in ids {
        let (Some(descriptor), Ok(backend)) = (registry.get(id), registry.create(id)) else {
            continue;
        };
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
        let mut entry = json!({
            "id": descriptor.id,
            "summary": descriptor.summary,
            "capabilities": caps.matrix(),
            "sandboxed": caps.sandboxed,
            "network_enforcement": caps.network_enforcement,
            "workspace": match caps.workspace {
                WorkspaceMode::InPlace => "in_place",
                WorkspaceMode::Private => "private",
            },
            "availability": availability_json(&availability),
            "options": descriptor.options,
        });
        if let Some(ext) = registry.external(id) {
            entry["external"] = json!({
                "path": ext.plugin.path,
                "protocol": agentdiff_engine::backend::external::protocol::PROTOCOL_VERSION,
            });
        }
        if let Some(hook) = descriptor.diagnostics {
            let diagnostics = hook(own.clone()).await;
            let facts: serde_json::Map<String, Value> = diagnostics
                .facts
                .into_iter()
                .map(|f| (f.name, f.value))
                .collect();
            // Facts stay top-level fields of the entry, as the report has always shown them.
            for (name, value) in &facts {
                entry[name.as_str()] = value.clone();
            }
            entry["diagnostics"] = json!(facts.keys().collect::<Vec<_>>());
            entry["details"] = diagnostics.details;
        }
        if probe {
            entry["probe"] = if availability.is_ready() {
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
                let verified: serde_json::Map<String, Value> = Boundary::ALL
                    .iter()
                    .map(|b| {
                        let r = results.iter().find(|r| r.boundary == Some(*b));
                        (
                            b.as_str().to_string(),
                            json!(r.map(|r| r.verdict.as_str()).unwrap_or("not_probed")),
                        )
                    })
                    .collect();
                match ProbeRecord::new(descriptor.id, &own, results.clone()) {
                    Ok(record) => {
                        entry["probe_record"] = serde_json::to_value(&record).unwrap_or(Value::Null)
                    }
                    Err(e) => entry["probe_record_error"] = json!(e.to_string()),
                }
                json!({"verified": verified, "results": results})
            } else {
                json!({"skipped": "backend unavailable; nothing was probed"})
            };
        }
        backends.push(entry);
        // A plugin's labels are its own word: it is listed, never recommended.
        if registry.external(id).is_none() {
            candidates.push(candidate);
        }
    }
    Ok(json!({
        "schema_version": 1,
        "host": host,
        "process_tracking": tracking,
        "backends": backends,
        "recommended": recommend(&candidates),
    }))
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

/// `  options:` and one line per declared option (name, type, default, flag, help).
fn render_options(out: &mut String, b: &Value) {
    let esc = agentdiff_engine::redact::escape_terminal;
    let Some(options) = b["options"].as_array().filter(|o| !o.is_empty()) else {
        return;
    };
    out.push_str("  options (--backend-option KEY=VALUE):\n");
    for o in options {
        let mut line = format!(
            "    {} ({})",
            esc(o["name"].as_str().unwrap_or("")),
            esc(o["type"].as_str().unwrap_or(""))
        );
        if let Some(d) = o["default"].as_str() {
            line.push_str(&format!(", default {}", esc(d)));
        }
        if o["repeatable"] == true {
            line.push_str(", repeatable");
        }
        if let Some(f) = o["flag"].as_str() {
            line.push_str(&format!(", flag --{}", esc(f)));
        }
        line.push_str(&format!(": {}\n", esc(o["help"].as_str().unwrap_or(""))));
        out.push_str(&line);
    }
}

fn render_summary(doc: &Value) -> String {
    let esc = agentdiff_engine::redact::escape_terminal;
    let s = |v: &Value| esc(v.as_str().unwrap_or(""));
    let mut out = String::new();
    out.push_str("agentdiff doctor: runtime backends on this host\n");
    out.push_str("process tracking:\n");
    for m in doc["process_tracking"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "  {:<22} {}  {}\n",
            s(&m["name"]),
            if m["available"].as_bool() == Some(true) {
                "available  "
            } else {
                "unavailable"
            },
            s(&m["detail"])
        ));
    }
    for b in doc["backends"].as_array().into_iter().flatten() {
        out.push('\n');
        out.push_str(&format!("{} — {}\n", s(&b["id"]), s(&b["summary"])));
        if let Some(ext) = b.get("external") {
            out.push_str(&format!(
                "  external backend: {} (protocol {})\n",
                s(&ext["path"]),
                ext["protocol"]
            ));
        }
        let a = &b["availability"];
        if a["state"] == "ready" {
            out.push_str(&format!("  availability: ready ({})\n", s(&a["detail"])));
        } else {
            out.push_str(&format!(
                "  availability: UNAVAILABLE: {}\n",
                s(&a["reason"])
            ));
            out.push_str(&format!("  remedy: {}\n", s(&a["remedy"])));
        }
        out.push_str(&format!(
            "  sandboxed: {}\n  network_enforcement: {}\n  workspace: {}\n",
            b["sandboxed"],
            b["network_enforcement"],
            s(&b["workspace"])
        ));
        for name in b["diagnostics"].as_array().into_iter().flatten() {
            let name = name.as_str().unwrap_or("");
            out.push_str(&format!("  {}: {}\n", esc(name), esc(&b[name].to_string())));
        }
        render_options(&mut out, b);
        let probed = b.get("probe").and_then(|p| p.get("results")).is_some();
        let header = format!(
            "  {:<18} {:<13}{}",
            "boundary",
            "declared",
            if probed { "verified here" } else { "" }
        );
        out.push_str(header.trim_end());
        out.push('\n');
        for boundary in Boundary::ALL {
            let name = boundary.as_str();
            let declared = s(&b["capabilities"][name]);
            let mut line = format!("  {name:<18} {declared:<13}");
            if probed {
                let result = b["probe"]["results"]
                    .as_array()
                    .and_then(|rs| rs.iter().find(|r| r["boundary"] == name));
                match result {
                    Some(r) => {
                        line.push_str(&format!("{}: {}", s(&r["verdict"]), s(&r["summary"])))
                    }
                    None => line.push_str("not probed"),
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        if let Some(results) = b.get("probe").and_then(|p| p["results"].as_array()) {
            for r in results.iter().filter(|r| r["boundary"].is_null()) {
                out.push_str(&format!(
                    "  {:<18} {:<13}{}: {}\n",
                    s(&r["probe"]),
                    "(info)",
                    s(&r["verdict"]),
                    s(&r["summary"])
                ));
            }
        }
        if let Some(skipped) = b.get("probe").and_then(|p| p.get("skipped")) {
            out.push_str(&format!("  probes: {}\n", s(skipped)));
        }
    }
    for r in doc["external_backends_refused"]
        .as_array()
        .into_iter()
        .flatten()
    {
        out.push_str(&format!(
            "\nexternal backend `{}` not loaded: {}\n",
            s(&r["id"]),
            s(&r["error"])
        ));
    }
    match doc.get("recommended").filter(|r| !r.is_null()) {
        Some(r) => out.push_str(&format!(
            "\nrecommended: {} — {}\n",
            s(&r["id"]),
            s(&r["reason"])
        )),
        None => out.push_str("\nrecommended: none (no backend is available here)\n"),
    }
    out.push_str(&format!(
        "\nlevels: uncontrolled < observed < requested (handed to an external tool, not verified) < enforced.\n\
         `{}` means a probe showed the control holding on this host; `{}` means the attempt succeeded.\n",
        Verdict::Verified.as_str(),
        Verdict::NotEnforced.as_str()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry::from_inventory().unwrap()
    }

    #[test]
    fn matrix_lists_every_builtin_backend_with_the_seed_wording_for_local() {
        let rt = crate::cli::runtime().unwrap();
        let reg = registry();
        let ids = reg.ids();
        let doc = rt
            .block_on(assemble(&reg, &ids, &BackendOptions::new(), false))
            .unwrap();
        let backends = doc["backends"].as_array().unwrap();
        let listed: Vec<&str> = backends.iter().map(|b| b["id"].as_str().unwrap()).collect();
        assert_eq!(listed, ids);
        let local = backends.iter().find(|b| b["id"] == "local").unwrap();
        assert_eq!(local["sandboxed"], false);
        assert_eq!(local["network_enforcement"], false);
        for b in Boundary::ALL {
            assert!(
                local["capabilities"][b.as_str()].is_string(),
                "{}",
                b.as_str()
            );
        }
        assert!(local.get("probe").is_none(), "no probe without --probe");
        assert!(!doc["process_tracking"].as_array().unwrap().is_empty());
        let text = render_summary(&doc);
        assert!(text.contains("sandboxed: false"));
        assert!(text.contains("network_enforcement: false"));
    }

    #[test]
    fn probing_local_verifies_nothing_it_does_not_control() {
        let rt = crate::cli::runtime().unwrap();
        let reg = registry();
        let doc = rt
            .block_on(assemble(&reg, &["local"], &BackendOptions::new(), true))
            .unwrap();
        let local = &doc["backends"][0];
        // The local backend is not a sandbox: the outside write lands and the loopback
        // connection succeeds.
        assert_eq!(
            local["probe"]["verified"]["filesystem_writes"],
            "not_enforced"
        );
        assert_eq!(local["probe"]["verified"]["network"], "not_enforced");
        assert_eq!(
            local["probe"]["verified"]["host_repository"],
            "not_applicable"
        );
        let record: ProbeRecord = serde_json::from_value(local["probe_record"].clone()).unwrap();
        assert_eq!(record.backend, "local");
        assert!(record.settings_digest.starts_with("sha256:"));
    }

    #[test]
    fn backend_options_must_be_key_value() {
        assert!(parse_options(&["a=b".into(), "c=".into()]).is_ok());
        let err = parse_options(&["nokey".into()]).unwrap_err();
        assert_eq!(exit::code_of(&err), exit::USAGE);
    }
}
