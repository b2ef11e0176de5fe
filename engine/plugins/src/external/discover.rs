//! Finding plugins on `PATH` and turning a plugin's `describe` answer into a registry entry.
//!
//! A descriptor made from a plugin lives as long as the program (it is leaked once per plugin
//! and process: the registry hands out `&'static` descriptors).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::session::{Plugin, PluginStdio, Session};
use super::{ExternalBackend, ExternalError};
use agentdiff_backend_api::protocol::{Request, Response, WireDescriptor};
use agentdiff_backend_api::{
    Availability, BackendDescriptor, BackendError, BackendOptions, Capabilities, CleanupReport,
    DynRuntimeBackend, FailClosedSpec, LaunchContext, LaunchSpec, OptionKind, OptionSpec,
    PreparedLaunch, ProcessIdentity, Result, RunningCommand, RuntimeBackend,
};

/// Plugin executables are named this, followed by the backend id.
pub const EXECUTABLE_PREFIX: &str = "agentdiff-backend-";

/// Every `agentdiff-backend-<id>` executable in the directories of `path_var` (a `PATH` value):
/// id → the distinct files found, in `PATH` order. The same file reached through two directories
/// (a symlinked `/bin`) counts once; more than one file for an id is a conflict for the caller.
pub fn scan_path(path_var: Option<&OsStr>) -> BTreeMap<String, Vec<PathBuf>> {
    let mut found: BTreeMap<String, Vec<(PathBuf, PathBuf)>> = BTreeMap::new();
    let Some(path_var) = path_var else {
        return BTreeMap::new();
    };
    for dir in std::env::split_paths(path_var) {
        // Relative PATH entries depend on the working directory: not a place to find code.
        if !dir.is_absolute() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        names.sort();
        for path in names {
            let Some(id) = path
                .file_name()
                .and_then(OsStr::to_str)
                .and_then(|n| n.strip_prefix(EXECUTABLE_PREFIX))
            else {
                continue;
            };
            if !agentdiff_backend_api::descriptor::valid_id(id) || !is_executable(&path) {
                continue;
            }
            let real = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            let seen = found.entry(id.to_string()).or_default();
            if !seen.iter().any(|(_, r)| *r == real) {
                seen.push((path, real));
            }
        }
    }
    found
        .into_iter()
        .map(|(id, v)| (id, v.into_iter().map(|(p, _)| p).collect()))
        .collect()
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A described plugin, ready for the registry.
#[derive(Debug, Clone)]
pub struct External {
    pub plugin: Plugin,
    pub descriptor: &'static BackendDescriptor,
    pub requires_scrubbed_environment: bool,
    /// The protocol version its handshake settled on when it described itself.
    pub protocol: u32,
}

impl External {
    pub fn create(&self) -> Box<dyn DynRuntimeBackend> {
        Box::new(ExternalBackend::new(
            self.descriptor.id,
            self.plugin.clone(),
            self.requires_scrubbed_environment,
        ))
    }
}

/// Ask the plugin to describe itself and check the answer.
pub fn describe(plugin: &Plugin) -> Result<External, ExternalError> {
    let mut session = Session::start(plugin, PluginStdio::Quiet)?;
    let protocol = session.protocol();
    let answer = session.request(&Request::Describe {}, plugin.timeouts.request);
    session.finish();
    let wire = match answer? {
        Response::Descriptor(d) => d,
        other => return Err(Session::describe_unexpected(plugin, "descriptor", &other)),
    };
    let bad = |message: String| ExternalError::Protocol {
        id: plugin.id.clone(),
        path: plugin.path.clone(),
        message,
    };
    if wire.id != plugin.id {
        return Err(bad(format!(
            "it describes backend `{}`, but its name makes it backend `{}`",
            wire.id, plugin.id
        )));
    }
    let descriptor = leak_descriptor(&wire).map_err(|e| bad(e.to_string()))?;
    Ok(External {
        plugin: plugin.clone(),
        descriptor,
        requires_scrubbed_environment: wire.requires_scrubbed_environment,
        protocol,
    })
}

fn leak(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

/// Why a plugin's descriptor cannot be registered.
#[derive(Debug, thiserror::Error)]
enum DescriptorProblem {
    #[error("option type `{0}` is not one the protocol defines")]
    OptionType(String),
    #[error("option name `{0}` is not lowercase ASCII with `-`")]
    OptionName(String),
}

fn option_kind(kind: &str, choices: &[String]) -> Result<OptionKind, DescriptorProblem> {
    Ok(match kind {
        "text" => OptionKind::Text,
        "path" => OptionKind::Path,
        "bool" => OptionKind::Bool,
        "integer" => OptionKind::Integer,
        "env_name" => OptionKind::EnvName,
        "choice" if !choices.is_empty() => {
            let words: Vec<&'static str> = choices.iter().map(|c| leak(c)).collect();
            OptionKind::Choice(Box::leak(words.into_boxed_slice()))
        }
        other => return Err(DescriptorProblem::OptionType(other.to_string())),
    })
}

fn leak_descriptor(wire: &WireDescriptor) -> Result<&'static BackendDescriptor, DescriptorProblem> {
    let mut options = Vec::new();
    for o in &wire.options {
        if !agentdiff_backend_api::descriptor::valid_id(&o.name) {
            return Err(DescriptorProblem::OptionName(o.name.clone()));
        }
        let mut spec = OptionSpec::new(
            leak(&o.name),
            option_kind(&o.kind, &o.choices)?,
            leak(&o.help),
        );
        if let Some(d) = &o.default {
            spec = spec.default_value(leak(d));
        }
        if o.command_line_only {
            spec = spec.command_line_only();
        }
        if o.repeatable {
            spec = spec.repeatable();
        }
        options.push(spec);
    }
    let mut fail_closed = Vec::new();
    for f in &wire.fail_closed {
        let remove: Vec<&'static str> = f.remove.iter().map(|k| leak(k)).collect();
        let set: Vec<(&'static str, &'static str)> =
            f.set.iter().map(|(k, v)| (leak(k), leak(v))).collect();
        fail_closed.push(FailClosedSpec {
            name: leak(&f.name),
            remove: Box::leak(remove.into_boxed_slice()),
            set: Box::leak(set.into_boxed_slice()),
        });
    }
    let descriptor = BackendDescriptor::new(leak(&wire.id), leak(&wire.summary), unserved)
        .with_options(Box::leak(options.into_boxed_slice()))
        .with_fail_closed(Box::leak(fail_closed.into_boxed_slice()));
    Ok(Box::leak(Box::new(descriptor)))
}

/// The `factory` of a plugin's descriptor. A plugin backend is constructed through the registry
/// ([`crate::Registry::create`]), which knows its path; this constructor, reached only
/// by code that bypasses the registry, makes a backend that refuses everything.
fn unserved() -> Box<dyn DynRuntimeBackend> {
    Box::new(Unserved)
}

struct Unserved;

const UNSERVED: &str =
    "an external backend must be constructed through the registry, which knows its executable";

impl RuntimeBackend for Unserved {
    fn id(&self) -> &'static str {
        "external"
    }
    fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
        Capabilities::default()
    }
    async fn availability(&self, _options: &BackendOptions) -> Availability {
        Availability::Unavailable {
            reason: UNSERVED.into(),
            remedy: "use Registry::create".into(),
        }
    }
    fn prepare(&self, _spec: &LaunchSpec) -> Result<PreparedLaunch> {
        Err(BackendError::InvalidRequest {
            backend: "external".into(),
            message: UNSERVED.into(),
        })
    }
    async fn launch(
        &self,
        _prepared: PreparedLaunch,
        _ctx: LaunchContext,
    ) -> Result<Box<dyn RunningCommand>> {
        Err(BackendError::Launch {
            backend: "external".into(),
            message: UNSERVED.into(),
        })
    }
    async fn cleanup_run(
        &self,
        _run_id: &str,
        _ids: &[ProcessIdentity],
        _grace: Duration,
    ) -> CleanupReport {
        CleanupReport {
            errors: vec![UNSERVED.into()],
            ..CleanupReport::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        agentdiff_test_support::write_executable(&p, "#!/bin/sh\nexit 0\n", 0o755);
        p
    }

    #[test]
    fn path_scan_finds_plugins_dedupes_links_and_keeps_conflicts() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let one = script(a.path(), "agentdiff-backend-one");
        let two_a = script(a.path(), "agentdiff-backend-two");
        let two_b = script(b.path(), "agentdiff-backend-two");
        script(a.path(), "agentdiff-backend-Bad");
        std::fs::write(a.path().join("agentdiff-backend-noexec"), "x").unwrap();
        let link = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(a.path(), link.path().join("a")).unwrap();
        let path = std::env::join_paths([
            a.path().to_path_buf(),
            link.path().join("a"),
            PathBuf::from("relative/dir"),
            b.path().to_path_buf(),
        ])
        .unwrap();
        let found = scan_path(Some(&path));
        assert_eq!(found.keys().collect::<Vec<_>>(), ["one", "two"]);
        assert_eq!(found["one"], vec![one]);
        assert_eq!(found["two"], vec![two_a, two_b]);
    }
}
