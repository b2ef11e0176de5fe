//! A request the backend cannot accept is refused before anything is written.
//!
//! [`RuntimeBackend::prepare`] is a pure transform (no process, no file), so it can be asked
//! ([`RuntimeBackend::check`]) once before the store and the capsule exist, with the spec the
//! transaction would build. An
//! `InvalidRequest` there (a container run without `--image`/`--rootfs`, an unknown option) is
//! a usage error and leaves no capsule claiming a policy outcome for a command that never ran.
//! Anything else (unavailable, runtime errors) is left to the transaction, which records it.

use std::path::Path;
use std::time::Duration;

use agentdiff_backend_api::{
    BackendError, BackendOptions, DynRuntimeBackend, LaunchSpec, WorkspaceMode,
};
use agentdiff_policy::{NetworkMode, Policy};
use agentdiff_store::{RUNS_DIR_NAME, STORE_DIR_NAME};

/// The run id the preflight spec carries; never used for a real run directory.
const PREFLIGHT_RUN_ID: &str = "preflight";

/// The backend options in force: the request's, then the policy's `runtime.options` and its
/// section for this backend (`runtime.bwrap`, which reaches only that backend) for keys the
/// request does not set.
pub fn effective_options(
    requested: &BackendOptions,
    policy: &Policy,
    backend_id: &str,
) -> BackendOptions {
    let mut options = requested.clone();
    let section = policy.runtime().section_options(backend_id);
    for (key, values) in policy.runtime().options.iter().chain(&section) {
        if !options.is_set(key) {
            for v in values {
                options.push(key.clone(), v.clone());
            }
        }
    }
    options
}

/// The options a project's policy file gives for `backend_id` that the command line did not
/// (`requested`): what [`effective_options`] adds.
pub fn options_from_policy(
    requested: &BackendOptions,
    policy: &Policy,
    backend_id: &str,
) -> Vec<String> {
    let section = policy.runtime().section_options(backend_id);
    let mut keys: Vec<String> = policy
        .runtime()
        .options
        .iter()
        .chain(&section)
        .map(|(key, _)| key.clone())
        .filter(|key| !requested.is_set(key))
        .collect();
    keys.dedup();
    keys
}

/// `Err` when the backend refuses the request as invalid; `Ok` otherwise (including when it
/// fails for another reason, which the transaction records).
pub fn check_request(
    backend: &dyn DynRuntimeBackend,
    root: &Path,
    argv: &[std::ffi::OsString],
    options: &BackendOptions,
    policy: &Policy,
) -> Result<(), BackendError> {
    let store = root.join(STORE_DIR_NAME);
    let options = effective_options(options, policy, backend.id());
    let workdir = match backend.capabilities(&options).workspace {
        WorkspaceMode::Private => store
            .join(crate::workspace::WORKSPACES_DIR_NAME)
            .join(PREFLIGHT_RUN_ID),
        _ => root.to_path_buf(),
    };
    let spec = LaunchSpec {
        run_id: PREFLIGHT_RUN_ID.to_owned(),
        root: root.to_path_buf(),
        workdir,
        capsule_dir: store.join(RUNS_DIR_NAME).join(PREFLIGHT_RUN_ID),
        argv: argv.to_vec(),
        env: Vec::new(),
        env_plan: Default::default(),
        timeout: None,
        grace: Duration::from_secs(1),
        poll_interval: Duration::from_millis(10),
        observe_ports: policy.network_mode() == NetworkMode::Observe,
        options,
        deny_patterns: policy.deny_patterns(),
        git_dirs: Vec::new(),
        // The run will have the proxy when the policy allows a host, and a backend judges
        // `network: filtered` by whether it has one; the path is never opened here.
        egress_proxy: policy
            .egress()
            .allows_anything()
            .then(|| std::env::temp_dir().join("agentdiff-egress-preflight/egress.sock")),
    };
    match backend.check(&spec) {
        Err(e @ (BackendError::InvalidRequest { .. } | BackendError::Option(_))) => Err(e),
        _ => Ok(()),
    }
}
