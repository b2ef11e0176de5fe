//! `agentdiff conformance --runtime ID`: run the backend conformance suite against any registered
//! backend (built in, or an `agentdiff-backend-<id>` executable on PATH) and print TAP 13 or JSON.
//!
//! Exit status: 0 when no MUST check failed; `exit::CONFORMANCE_FAILED` (74) when at least one did;
//! `BACKEND_UNAVAILABLE` (69) when the backend cannot run here, so that a report made only of
//! skips never looks like a pass.

use std::process::ExitCode;

use agentdiff_conformance::{run_suite, FailClosedCase, SuiteOptions};
use anyhow::Context;

use crate::common::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Tap,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The registered backend to test.
    #[arg(long, value_name = "ID")]
    runtime: String,
    #[arg(long, value_enum, default_value = "tap")]
    format: Format,
    /// KEY=VALUE option every launch carries (repeatable); `agentdiff doctor` lists each
    /// backend's options.
    #[arg(long = "backend-option", value_name = "KEY=VALUE")]
    backend_option: Vec<String>,
    /// KEY=VALUE option that makes the backend unusable (repeatable; together they form one
    /// fail-closed case on top of --backend-option). Default: the cases the backend declares.
    #[arg(long = "fail-closed-option", value_name = "KEY=VALUE")]
    fail_closed_option: Vec<String>,
    /// Only checks whose id starts with this prefix (repeatable).
    #[arg(long, value_name = "PREFIX")]
    only: Vec<String>,
    /// Fail (instead of skip) every launching check when the backend is unavailable; also set by
    /// AGENTDIFF_REQUIRE_REAL_BACKENDS=1.
    #[arg(long)]
    require_available: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut registry = crate::common::context::registry(None)?;
    let descriptor = crate::common::context::resolve_backend(&mut registry, &args.runtime)?;
    let backend_options = crate::cli::doctor::parse_options(&args.backend_option)?;
    descriptor
        .validate_options(&backend_options)
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let fail_closed = if args.fail_closed_option.is_empty() {
        FailClosedCase::declared(descriptor, &backend_options)
    } else {
        let extra = crate::cli::doctor::parse_options(&args.fail_closed_option)?;
        let mut o = backend_options.clone();
        for key in extra.keys() {
            for v in extra.get_all(key) {
                o.push(key, v.clone());
            }
        }
        vec![FailClosedCase {
            name: "given by --fail-closed-option".into(),
            options: o,
            factory: None,
        }]
    };
    let defaults = SuiteOptions::default();
    let options = SuiteOptions {
        backend_options,
        fail_closed,
        require_available: args.require_available || defaults.require_available,
        only: args.only.clone(),
        plugin: registry.external(descriptor.id).map(|e| e.plugin.clone()),
        ..defaults
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    let factory = registry
        .constructor(descriptor.id)
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let report = rt.block_on(run_suite(factory, options));
    let text = match args.format {
        Format::Tap => report.to_tap(),
        Format::Json => format!("{}\n", report.to_json()),
    };
    out!("{text}");
    // An unavailable backend is reported as such first: its failed launching checks (under
    // --require-available) say nothing about the backend's conformance.
    if !report.availability.is_ready() {
        errln!(
            "agentdiff: runtime backend `{}` is unavailable here; launching checks were {}",
            descriptor.id,
            if report.summary.must_failed > 0 {
                "failed"
            } else {
                "skipped"
            }
        );
        return Ok(ExitCode::from(exit::BACKEND_UNAVAILABLE));
    }
    let not_run = report.not_run_ids();
    if report.summary.must_failed == 0 && !not_run.is_empty() {
        errln!(
            "agentdiff: MUST check(s) not run for runtime backend `{}`: {}; the backend declares \
             no fail-closed case: give one with --fail-closed-option KEY=VALUE",
            descriptor.id,
            not_run.join(", ")
        );
    }
    if !report.conformant() {
        return Ok(ExitCode::from(exit::CONFORMANCE_FAILED));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use agentdiff_backend_api::BackendOptions;

    use super::*;

    /// FAIL-001 runs for every built-in backend: each declares at least one unusable
    /// configuration that changes the options it runs with.
    #[test]
    fn every_built_in_backend_declares_a_fail_closed_case() {
        let registry = agentdiff_plugins::Registry::from_inventory().unwrap();
        for d in registry.descriptors() {
            let base = BackendOptions::new();
            let cases = FailClosedCase::declared(d, &base);
            assert!(!cases.is_empty(), "{} declares no fail-closed case", d.id);
            for case in cases {
                assert_ne!(
                    case.options, base,
                    "{}: `{}` changes nothing",
                    d.id, case.name
                );
            }
        }
    }
}
