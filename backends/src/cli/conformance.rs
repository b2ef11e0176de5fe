//! `agentdiff conformance --runtime ID`: run the backend conformance suite against any registered
//! backend (built in, or compiled in by a third party) and print TAP 13 or JSON.
//!
//! Exit status: 0 when no MUST check failed; `exit::CONFORMANCE_FAILED` (74) when at least one did;
//! `BACKEND_UNAVAILABLE` (69) when the backend cannot run here, so that a report made only of
//! skips never looks like a pass.

use std::process::ExitCode;

use agentdiff_conformance::{factory_fn, run_suite, FailClosedCase, SuiteOptions};
use agentdiff_engine::backend::{BackendOptions, Registry};
use anyhow::Context;

use crate::exit;

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
    /// KEY=VALUE option every launch carries (repeatable), e.g. `srt-settings=FILE`,
    /// `rootfs=DIR`.
    #[arg(long = "backend-option", value_name = "KEY=VALUE")]
    backend_option: Vec<String>,
    /// KEY=VALUE option that makes the backend unusable (repeatable; together they form one
    /// fail-closed case on top of --backend-option). Built-in backends have defaults.
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

/// Unusable configurations for the built-in wrapping backends.
fn default_fail_closed(id: &str, base: &BackendOptions) -> Vec<FailClosedCase> {
    let with = |key: &str, value: &str| {
        let mut o = base.clone();
        o.push(key, value);
        o
    };
    match id {
        "srt" => vec![FailClosedCase {
            name: "srt executable missing".into(),
            options: with("srt-executable", "/nonexistent/agentdiff-missing-srt"),
            factory: None,
        }],
        "container" if base.is_set("image") || base.is_set("rootfs") => {
            let mut o = BackendOptions::new();
            for key in base.keys().filter(|k| *k != "image" && *k != "rootfs") {
                for v in base.get_all(key) {
                    o.push(key, v.clone());
                }
            }
            o.push(
                "image",
                "localhost/agentdiff-conformance-missing-image:none",
            );
            vec![FailClosedCase {
                name: "image missing".into(),
                options: o,
                factory: None,
            }]
        }
        _ => Vec::new(),
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let registry = Registry::from_inventory().context("could not build the backend registry")?;
    let Some(descriptor) = registry.get(&args.runtime) else {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!(
                "unknown runtime backend `{}`; registered backends: {}",
                args.runtime,
                registry.ids().join(", ")
            ),
        ));
    };
    let backend_options = crate::cli::doctor::parse_options(&args.backend_option)?;
    let fail_closed = if args.fail_closed_option.is_empty() {
        default_fail_closed(descriptor.id, &backend_options)
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
        ..defaults
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    let report = rt.block_on(run_suite(factory_fn(descriptor.factory), options));
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
    if !report.conformant() {
        return Ok(ExitCode::from(exit::CONFORMANCE_FAILED));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_wrapping_backends_get_an_unusable_configuration() {
        let mut base = BackendOptions::new();
        base.push("srt-settings", "/s.json");
        let srt = default_fail_closed("srt", &base);
        assert_eq!(srt.len(), 1);
        assert_eq!(
            srt[0].options.get("srt-executable"),
            Some("/nonexistent/agentdiff-missing-srt")
        );
        assert_eq!(srt[0].options.get("srt-settings"), Some("/s.json"));
        let mut c = BackendOptions::new();
        c.push("rootfs", "/r");
        c.push("engine", "podman");
        let container = default_fail_closed("container", &c);
        assert_eq!(container.len(), 1);
        assert!(!container[0].options.is_set("rootfs"));
        assert_eq!(container[0].options.get("engine"), Some("podman"));
        assert!(default_fail_closed("local", &BackendOptions::new()).is_empty());
    }
}
