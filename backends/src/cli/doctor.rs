//! `agentdiff doctor`: the capability matrix of every registered backend — declared level per
//! boundary, availability with remedies — and, with `--probe`, what the conformance probes
//! verified on this host.

use std::path::PathBuf;
use std::process::ExitCode;

use agentdiff_backend_api::{BackendOptions, Boundary, OptionSpec, WorkspaceMode};
use agentdiff_conformance::probes::{ProbeRecord, Verdict};
use anyhow::Context;

use crate::common::doctor_report::{
    assemble, AvailabilityEntry, BackendEntry, DoctorReport, ProbeSection, RefusedExternal,
};
use crate::common::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Summary,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run the probes (outside write, outside read, host loopback connection, environment,
    /// daemon, pids limit, capabilities, host tree, the egress proxy as the only route out)
    /// inside each available backend and report what holds on this host.
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
    let mut registry = crate::common::context::registry(None)?;
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
    let rt = crate::common::context::runtime()?;
    let mut doc = rt.block_on(assemble(&registry, &ids, &options, args.probe))?;
    doc.external_backends_refused = plugins
        .iter()
        .filter_map(|p| {
            let e = p.result.as_ref().err()?;
            Some(RefusedExternal {
                id: p.id.clone(),
                paths: p.paths.clone(),
                error: e.to_string(),
            })
        })
        .collect();
    if let Some(path) = &args.record {
        let records: Vec<&ProbeRecord> = doc
            .backends
            .iter()
            .filter_map(|b| b.probe_record.as_ref())
            .collect();
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

/// `  options:` and one line per declared option (name, type, default, flag, help).
fn render_options(out: &mut String, options: &[OptionSpec]) {
    let esc = agentdiff_host::redact::escape_terminal;
    if options.is_empty() {
        return;
    }
    out.push_str("  options (--backend-option KEY=VALUE):\n");
    for o in options {
        let mut line = format!("    {} ({})", esc(o.name), esc(o.kind.type_name()));
        if let Some(d) = o.default {
            line.push_str(&format!(", default {}", esc(d)));
        }
        if o.repeatable {
            line.push_str(", repeatable");
        }
        if let Some(f) = o.flag {
            line.push_str(&format!(", flag --{}", esc(f)));
        }
        line.push_str(&format!(": {}\n", esc(o.help)));
        out.push_str(&line);
    }
}

/// The boundary table: declared level, and with probes what was verified here.
fn render_boundaries(out: &mut String, b: &BackendEntry) {
    let esc = agentdiff_host::redact::escape_terminal;
    let results = match &b.probe {
        Some(ProbeSection::Ran { results, .. }) => Some(results),
        _ => None,
    };
    let header = format!(
        "  {:<18} {:<13}{}",
        "boundary",
        "declared",
        if results.is_some() {
            "verified here"
        } else {
            ""
        }
    );
    out.push_str(header.trim_end());
    out.push('\n');
    for boundary in Boundary::ALL {
        let name = boundary.as_str();
        let declared = b.capabilities.get(name).map_or("", |l| l.as_str());
        let mut line = format!("  {name:<18} {declared:<13}");
        if let Some(results) = results {
            match results.iter().find(|r| r.boundary == Some(boundary)) {
                Some(r) => line.push_str(&format!("{}: {}", r.verdict.as_str(), esc(&r.summary))),
                None => line.push_str("not probed"),
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    for r in results
        .into_iter()
        .flatten()
        .filter(|r| r.boundary.is_none())
    {
        out.push_str(&format!(
            "  {:<18} {:<13}{}: {}\n",
            r.probe.as_str(),
            "(info)",
            r.verdict.as_str(),
            esc(&r.summary)
        ));
    }
    if let Some(ProbeSection::Skipped { skipped }) = &b.probe {
        out.push_str(&format!("  probes: {skipped}\n"));
    }
}

fn render_summary(doc: &DoctorReport) -> String {
    let esc = agentdiff_host::redact::escape_terminal;
    let mut out = String::new();
    out.push_str("agentdiff doctor: runtime backends on this host\n");
    out.push_str("process tracking:\n");
    for m in &doc.process_tracking {
        out.push_str(&format!(
            "  {:<22} {}  {}\n",
            esc(&m.name),
            if m.available {
                "available  "
            } else {
                "unavailable"
            },
            esc(&m.detail)
        ));
    }
    for b in &doc.backends {
        out.push('\n');
        out.push_str(&format!("{} — {}\n", esc(b.id), esc(b.summary)));
        if let Some(ext) = &b.external {
            out.push_str(&format!(
                "  external backend: {} (protocol {})\n",
                esc(&ext.path.display().to_string()),
                ext.protocol
            ));
        }
        match &b.availability {
            AvailabilityEntry::Ready { detail } => {
                out.push_str(&format!("  availability: ready ({})\n", esc(detail)));
            }
            AvailabilityEntry::Unavailable { reason, remedy } => {
                out.push_str(&format!("  availability: UNAVAILABLE: {}\n", esc(reason)));
                out.push_str(&format!("  remedy: {}\n", esc(remedy)));
            }
        }
        out.push_str(&format!(
            "  sandboxed: {}\n  network_enforcement: {}\n  workspace: {}\n",
            b.sandboxed,
            b.network_enforcement,
            match b.workspace {
                WorkspaceMode::InPlace => "in_place",
                WorkspaceMode::Private => "private",
            }
        ));
        // In the order the hook gave them.
        for name in b.diagnostics.iter().flatten() {
            if let Some(value) = b.facts.get(name) {
                out.push_str(&format!("  {}: {}\n", esc(name), esc(&value.to_string())));
            }
        }
        render_options(&mut out, b.options);
        render_boundaries(&mut out, b);
    }
    for r in &doc.external_backends_refused {
        out.push_str(&format!(
            "\nexternal backend `{}` not loaded: {}\n",
            esc(&r.id),
            esc(&r.error)
        ));
    }
    match &doc.recommended {
        Some(r) => out.push_str(&format!(
            "\nrecommended: {} — {}\n",
            esc(&r.id),
            esc(&r.reason)
        )),
        None if !doc.backends.is_empty() && doc.backends.iter().all(|b| b.external.is_some()) => {
            out.push_str("\nrecommended: none (external backends are never recommended)\n")
        }
        None => out.push_str("\nrecommended: none (no backend is available here)\n"),
    }
    out.push_str(&format!(
        "\nlevels: uncontrolled < observed < requested (handed to an external tool, not verified) < \
         filtered (network only: agentdiff's egress proxy the only route out) < enforced.\n\
         `{}` means a probe showed the control holding on this host; `{}` means the attempt succeeded.\n",
        Verdict::Verified.as_str(),
        Verdict::NotEnforced.as_str()
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> agentdiff_plugins::Registry {
        agentdiff_plugins::Registry::from_inventory().unwrap()
    }

    #[test]
    fn matrix_lists_every_builtin_backend_with_the_seed_wording_for_local() {
        let rt = crate::common::context::runtime().unwrap();
        let reg = registry();
        let ids = reg.ids();
        let report = rt
            .block_on(assemble(&reg, &ids, &BackendOptions::new(), false))
            .unwrap();
        // The JSON document as `--format json` prints it.
        let doc = serde_json::to_value(&report).unwrap();
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
        let text = render_summary(&report);
        assert!(text.contains("sandboxed: false"));
        assert!(text.contains("network_enforcement: false"));
    }

    #[test]
    fn probing_local_verifies_nothing_it_does_not_control() {
        let rt = crate::common::context::runtime().unwrap();
        let reg = registry();
        let report = rt
            .block_on(assemble(&reg, &["local"], &BackendOptions::new(), true))
            .unwrap();
        let doc = serde_json::to_value(&report).unwrap();
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
        let record = report.backends[0].probe_record.as_ref().unwrap();
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
