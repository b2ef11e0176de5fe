//! The backend registry: built once from `inventory` submissions, sorted by id, plus an explicit
//! [`Registry::register`] path for embedders and tests.
//!
//! A backend crate registers itself with
//! `inventory::submit! { BackendDescriptor::new("id", "summary", factory).with_options(…) }`. The linker drops a
//! crate nothing references (dtolnay/inventory#50), so the binary names each backend crate
//! explicitly and a test pins the set of built-in ids.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::external::{self, External, Plugin, Timeouts};
use agentdiff_backend_api::{BackendDescriptor, DynRuntimeBackend};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    #[error("runtime backend id `{0}` is registered twice; each backend needs a unique id")]
    Duplicate(String),
    #[error("invalid runtime backend id `{0}`: use lowercase ASCII letters, digits and `-`")]
    InvalidId(String),
    #[error("runtime backends `{0}` and `{1}` both declare themselves the default; only one may")]
    TwoDefaults(String, String),
    #[error("unknown runtime backend `{id}`; registered backends: {known}")]
    Unknown { id: String, known: String },
    #[error(
        "{path} would serve runtime backend `{id}`, which is built in; a built-in backend cannot \
         be replaced: rename or remove that file"
    )]
    Shadowed { id: String, path: PathBuf },
    #[error(
        "runtime backend `{id}` is served by more than one executable on PATH: {}; keep one",
        paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" and ")
    )]
    Conflict { id: String, paths: Vec<PathBuf> },
    #[error("{0}")]
    External(String),
    #[error(
        "refusing runtime backend `{id}`: {reason}; it was not run. Install plugins outside any \
         project, in a directory only you (or root) can write, such as ~/.local/bin"
    )]
    Untrusted {
        id: String,
        reason: crate::external::Untrusted,
    },
}

/// The set of backends this program knows, sorted by id.
#[derive(Debug, Default)]
pub struct Registry {
    entries: BTreeMap<&'static str, &'static BackendDescriptor>,
    /// Backends served by plugin executables (also in `entries`).
    external: BTreeMap<&'static str, Arc<External>>,
    /// Project roots (canonical) no plugin may be loaded from (see `external::check_trusted`).
    project_roots: Vec<PathBuf>,
}

/// What became of one plugin found on `PATH` (see [`Registry::load_external`]).
#[derive(Debug)]
pub struct PluginOutcome {
    pub id: String,
    pub paths: Vec<PathBuf>,
    /// `Ok` once registered; otherwise why it is not usable.
    pub result: Result<(), RegistryError>,
}

impl Registry {
    /// A registry with nothing in it.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Every backend submitted through `inventory` by the crates linked into this program.
    pub fn from_inventory() -> Result<Self, RegistryError> {
        let mut registry = Self::empty();
        for descriptor in inventory::iter::<BackendDescriptor> {
            registry.register(descriptor)?;
        }
        Ok(registry)
    }

    /// Add one backend. Duplicate or malformed ids are refused.
    pub fn register(
        &mut self,
        descriptor: &'static BackendDescriptor,
    ) -> Result<(), RegistryError> {
        if !agentdiff_backend_api::descriptor::valid_id(descriptor.id) {
            return Err(RegistryError::InvalidId(descriptor.id.to_string()));
        }
        if self.entries.contains_key(descriptor.id) {
            return Err(RegistryError::Duplicate(descriptor.id.to_string()));
        }
        if let Some(other) = self.default_id().filter(|_| descriptor.is_default) {
            return Err(RegistryError::TwoDefaults(
                other.to_string(),
                descriptor.id.to_string(),
            ));
        }
        self.entries.insert(descriptor.id, descriptor);
        Ok(())
    }

    /// The backend used when none is chosen.
    pub fn default_id(&self) -> Option<&'static str> {
        self.descriptors().find(|d| d.is_default).map(|d| d.id)
    }

    /// Registered ids, sorted.
    pub fn ids(&self) -> Vec<&'static str> {
        self.entries.keys().copied().collect()
    }

    pub fn descriptors(&self) -> impl Iterator<Item = &'static BackendDescriptor> + '_ {
        self.entries.values().copied()
    }

    pub fn get(&self, id: &str) -> Option<&'static BackendDescriptor> {
        self.entries.get(id).copied()
    }

    /// The descriptor with this id, or the one "unknown runtime backend" error.
    pub fn descriptor(&self, id: &str) -> Result<&'static BackendDescriptor, RegistryError> {
        self.get(id).ok_or_else(|| RegistryError::Unknown {
            id: id.to_string(),
            known: self.ids().join(", "),
        })
    }

    /// Construct the backend with this id.
    pub fn create(&self, id: &str) -> Result<Box<dyn DynRuntimeBackend>, RegistryError> {
        if let Some(ext) = self.external.get(id) {
            return Ok(ext.create());
        }
        self.descriptor(id).map(|d| (d.factory)())
    }

    /// A constructor for the backend with this id, callable any number of times.
    #[allow(clippy::type_complexity)]
    pub fn constructor(
        &self,
        id: &str,
    ) -> Result<Arc<dyn Fn() -> Box<dyn DynRuntimeBackend> + Send + Sync>, RegistryError> {
        if let Some(ext) = self.external.get(id) {
            let ext = ext.clone();
            return Ok(Arc::new(move || ext.create()));
        }
        let factory = self.descriptor(id)?.factory;
        Ok(Arc::new(factory))
    }

    /// The plugin serving `id`, when it is an external backend.
    pub fn external(&self, id: &str) -> Option<&External> {
        self.external.get(id).map(Arc::as_ref)
    }

    /// Add a described plugin. Its id may be neither built in nor registered already.
    pub fn register_external(&mut self, ext: External) -> Result<(), RegistryError> {
        let id = ext.descriptor.id;
        if self.entries.contains_key(id) {
            return Err(if self.external.contains_key(id) {
                RegistryError::Duplicate(id.to_string())
            } else {
                RegistryError::Shadowed {
                    id: id.to_string(),
                    path: ext.plugin.path.clone(),
                }
            });
        }
        if ext.descriptor.is_default {
            return Err(RegistryError::External(format!(
                "external backend `{id}` cannot be the default backend"
            )));
        }
        self.register(ext.descriptor)?;
        self.external.insert(id, Arc::new(ext));
        Ok(())
    }

    /// The backend `id`: registered, or else the `agentdiff-backend-<id>` plugin on `PATH`,
    /// described and registered now. An unknown id lists the built-in and plugin ids.
    pub fn resolve(&mut self, id: &str) -> Result<&'static BackendDescriptor, RegistryError> {
        if let Some(d) = self.get(id) {
            return Ok(d);
        }
        let found = external::scan_path(std::env::var_os("PATH").as_deref());
        let Some(paths) = found.get(id) else {
            let mut known = self.ids().join(", ");
            let plugins: Vec<&str> = found
                .keys()
                .map(String::as_str)
                .filter(|k| self.get(k).is_none())
                .collect();
            if !plugins.is_empty() {
                known = format!("{known}; on PATH: {}", plugins.join(", "));
            }
            return Err(RegistryError::Unknown {
                id: id.to_string(),
                known,
            });
        };
        self.load_plugin(id, paths)?;
        self.descriptor(id)
    }

    /// Refuse plugins inside `root` (the current project), besides those inside any directory
    /// marked as a project root.
    pub fn add_project_root(&mut self, root: &std::path::Path) {
        if let Ok(canonical) = std::fs::canonicalize(root) {
            self.project_roots.push(canonical);
        }
    }

    fn load_plugin(&mut self, id: &str, paths: &[PathBuf]) -> Result<(), RegistryError> {
        if self.get(id).is_some() && !self.external.contains_key(id) {
            return Err(RegistryError::Shadowed {
                id: id.to_string(),
                path: paths.first().cloned().unwrap_or_default(),
            });
        }
        let [path] = paths else {
            return Err(RegistryError::Conflict {
                id: id.to_string(),
                paths: paths.to_vec(),
            });
        };
        // Checked before the plugin is ever executed (even to describe itself).
        external::check_trusted(path, &self.project_roots).map_err(|reason| {
            RegistryError::Untrusted {
                id: id.to_string(),
                reason,
            }
        })?;
        let plugin = Plugin {
            id: id.to_string(),
            path: path.clone(),
            timeouts: Timeouts::default(),
        };
        let ext =
            external::describe(&plugin).map_err(|e| RegistryError::External(e.to_string()))?;
        self.register_external(ext)
    }

    /// Describe and register every plugin on `PATH` (for `agentdiff doctor`): one outcome per id
    /// found, including those refused (a built-in id, two files, a broken plugin).
    pub fn load_external(&mut self) -> Vec<PluginOutcome> {
        let found = external::scan_path(std::env::var_os("PATH").as_deref());
        found
            .into_iter()
            .map(|(id, paths)| {
                let result = if self.external.contains_key(id.as_str()) {
                    Ok(())
                } else {
                    self.load_plugin(&id, &paths)
                };
                PluginOutcome { id, paths, result }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use agentdiff_backend_api::{
        Availability, BackendOptions, Capabilities, CleanupReport, LaunchContext, LaunchSpec,
        PreparedLaunch, Result, RunningCommand, RuntimeBackend,
    };
    use agentdiff_process::ProcessIdentity;

    struct Dummy;

    impl RuntimeBackend for Dummy {
        fn id(&self) -> &'static str {
            "dummy"
        }
        fn capabilities(&self, _options: &BackendOptions) -> Capabilities {
            Capabilities::default()
        }
        async fn availability(&self, _options: &BackendOptions) -> Availability {
            Availability::Unavailable {
                reason: "test double".into(),
                remedy: "none".into(),
            }
        }
        fn prepare(&self, spec: &LaunchSpec) -> Result<PreparedLaunch> {
            Err(agentdiff_backend_api::BackendError::InvalidRequest {
                backend: spec.run_id.clone(),
                message: "dummy".into(),
            })
        }
        async fn launch(
            &self,
            _prepared: PreparedLaunch,
            _ctx: LaunchContext,
        ) -> Result<Box<dyn RunningCommand>> {
            Err(agentdiff_backend_api::BackendError::Launch {
                backend: "dummy".into(),
                message: "dummy".into(),
            })
        }
        async fn cleanup_run(
            &self,
            _run_id: &str,
            _ids: &[ProcessIdentity],
            _grace: Duration,
        ) -> CleanupReport {
            CleanupReport::default()
        }
    }

    fn make() -> Box<dyn DynRuntimeBackend> {
        Box::new(Dummy)
    }

    static A: BackendDescriptor = BackendDescriptor::new("zeta", "z", make);
    static B: BackendDescriptor = BackendDescriptor::new("alpha", "a", make);
    static A2: BackendDescriptor = BackendDescriptor::new("zeta", "again", make);
    static BAD: BackendDescriptor = BackendDescriptor::new("Bad Id", "bad", make);

    #[test]
    fn explicit_registration_sorts_and_refuses_duplicates() {
        let mut r = Registry::empty();
        r.register(&A).unwrap();
        r.register(&B).unwrap();
        assert_eq!(r.ids(), vec!["alpha", "zeta"]);
        assert_eq!(
            r.register(&A2),
            Err(RegistryError::Duplicate("zeta".into()))
        );
        assert_eq!(
            r.register(&BAD),
            Err(RegistryError::InvalidId("Bad Id".into()))
        );
        assert_eq!(r.create("alpha").unwrap().id(), "dummy");
        let err = r.create("nope").err().unwrap();
        assert_eq!(
            err.to_string(),
            "unknown runtime backend `nope`; registered backends: alpha, zeta"
        );
    }

    #[test]
    fn the_engine_alone_registers_nothing() {
        // The engine never names a backend; only linked backend crates submit descriptors.
        assert!(Registry::from_inventory().unwrap().ids().is_empty());
    }
}
