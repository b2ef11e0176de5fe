//! The project context every subcommand works in: the root, the async runtime, the backend an id
//! names, the project lock, and a stored run's view with its seal verified.

use agentdiff_report::RunView;

/// Turns the orphaned-run notice of [`project_root`] on or off for this command.
pub fn set_orphan_notice(on: bool) {
    ORPHAN_NOTICE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether [`project_root`] points to `agentdiff cleanup` when the root's last run lost its
/// monitor. Off for `cleanup` (it is the remedy) and for the hook (its output is read by
/// programs).
static ORPHAN_NOTICE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// One line on stderr when the last run in `root` lost its monitor and left processes running.
fn orphan_notice(root: &std::path::Path) {
    if !ORPHAN_NOTICE.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    if let Some(run) = agentdiff_engine::recovery::orphans::orphaned_last_run(root) {
        errln!("{}", agentdiff_engine::recovery::orphans::notice(&run));
    }
}

/// A tokio runtime for subcommands that drive backends. Single-threaded: the transaction's heavy
/// work (hashing) uses its own threads, and a small runtime keeps start-up cheap.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")
}

/// The project root every subcommand works on: `--root` if given, else the discovery of
/// `agentdiff_engine::root` (nearest `.agentdiff/` or `agentdiff.yaml`, else the nearest VCS
/// root, else the current directory; `$HOME` and `/` only when named). The chosen root is printed
/// on stderr whenever it is not the current directory, so a run never silently covers another
/// tree than the user expects.
pub fn project_root(
    explicit: Option<&std::path::Path>,
) -> anyhow::Result<agentdiff_engine::root::Root> {
    use anyhow::Context;
    let cwd = std::env::current_dir()
        .context("cannot determine the current directory; pass --root")
        .map_err(|e| crate::common::exit::with_code(crate::common::exit::USAGE, e))?;
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let root = agentdiff_engine::root::discover(explicit, &cwd, home.as_deref())
        .map_err(|e| crate::common::exit::with_code(crate::common::exit::USAGE, e))?;
    let same_as_cwd = std::fs::canonicalize(&cwd).is_ok_and(|c| c == root.path);
    if root.reason != agentdiff_engine::root::Reason::Explicit && !same_as_cwd {
        errln!(
            "agentdiff: project root: {} ({})",
            agentdiff_host::redact::escape_terminal(&root.path.display().to_string()),
            root.describe()
        );
    }
    orphan_notice(&root.path);
    Ok(root)
}

/// The backend registry, which refuses plugins planted inside `root` (when given) or inside the
/// project the current directory belongs to, besides every directory marked as a project root.
pub fn registry(root: Option<&std::path::Path>) -> anyhow::Result<agentdiff_plugins::Registry> {
    use anyhow::Context;
    let mut registry = agentdiff_plugins::Registry::from_inventory()
        .context("could not build the backend registry")?;
    match root {
        Some(root) => registry.add_project_root(root),
        None => {
            let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
            let found = std::env::current_dir()
                .ok()
                .and_then(|cwd| agentdiff_engine::root::discover(None, &cwd, home.as_deref()).ok());
            if let Some(found) = found {
                registry.add_project_root(&found.path);
            }
        }
    }
    Ok(registry)
}

/// The backend `id`, built in or a plugin on `PATH`. An id nobody serves, or one two plugins
/// claim, is a usage error (64); a plugin that is there but cannot be described (it exits, hangs,
/// or answers out of protocol) is an unavailable backend (69).
pub fn resolve_backend(
    registry: &mut agentdiff_plugins::Registry,
    id: &str,
) -> anyhow::Result<&'static agentdiff_backend_api::BackendDescriptor> {
    use agentdiff_plugins::RegistryError;
    registry.resolve(id).map_err(|e| {
        let code = match e {
            RegistryError::External(_) | RegistryError::Untrusted { .. } => {
                crate::common::exit::BACKEND_UNAVAILABLE
            }
            _ => crate::common::exit::USAGE,
        };
        crate::common::exit::with_code(code, e)
    })
}

/// Takes the project lock (`.agentdiff/lock`) for a command that writes the tree or the store:
/// another `run`, `rollback` or `promote` in the same root is refused (exit 75) or, with
/// `--wait`, waited for with a message.
pub fn lock_store(
    store: &agentdiff_store::Store,
    wait: bool,
) -> anyhow::Result<agentdiff_store::StoreLock> {
    use agentdiff_store::{LockError, Wait};
    let mode = if wait { Wait::Yes } else { Wait::No };
    store
        .lock(mode, |holder| {
            errln!(
                "agentdiff: waiting for the other agentdiff{} in this project to finish",
                holder.map(|p| format!(" (pid {p})")).unwrap_or_default()
            )
        })
        .map_err(|e| match e {
            LockError::Busy { .. } => crate::common::exit::with_code(crate::common::exit::BUSY, e),
            LockError::Io { .. } => {
                crate::common::exit::with_code(crate::common::exit::INTERNAL, e)
            }
        })
}

/// This user's key and ledger; a state directory that cannot be used is reported, not fatal:
/// verification still checks integrity, and says it could not authenticate.
pub fn verify_context(
    root: &std::path::Path,
) -> (agentdiff_store::seal::VerifyContext, Option<String>) {
    let loaded = agentdiff_store::seal::StateDir::from_env()
        .and_then(|state| agentdiff_store::seal::VerifyContext::for_user(&state, root));
    match loaded {
        Ok(ctx) => (ctx, None),
        Err(e) => (
            agentdiff_store::seal::VerifyContext::default(),
            Some(e.to_string()),
        ),
    }
}

/// A stored run for a report, its seal verified as `agentdiff verify` does (this user's key and
/// ledger). A capsule that cannot be read, or whose result names another run, exits
/// [`crate::common::exit::INVALID_CAPSULE`].
/// The verdict `agentdiff verify` reaches for `capsule`, with this user's key and ledger (an
/// unreadable capsule exits 67).
pub fn seal_of(
    store: &agentdiff_store::Store,
    capsule: &agentdiff_store::Capsule,
) -> anyhow::Result<agentdiff_store::VerifyReport> {
    let (ctx, _) = verify_context(store.root());
    capsule
        .verify_with(store.objects(), &ctx)
        .map_err(|e| crate::common::exit::with_code(crate::common::exit::INVALID_CAPSULE, e))
}

pub fn load_verified(
    store: &agentdiff_store::Store,
    capsule: &agentdiff_store::Capsule,
) -> anyhow::Result<RunView> {
    let (ctx, _) = verify_context(store.root());
    RunView::load_verified(capsule, store.objects(), &ctx)
        .map_err(|e| crate::common::exit::with_code(crate::common::exit::INVALID_CAPSULE, e))
}

/// The HTML report of a run: its view, its seal verified with this user's key and ledger, and
/// its diffs (the after side from the working tree at the store's root); `back` links above it.
pub fn html_report(
    store: &agentdiff_store::Store,
    capsule: &agentdiff_store::Capsule,
    back: Option<&str>,
) -> anyhow::Result<String> {
    use agentdiff_report::diff::DiffSource;
    let view = load_verified(store, capsule)?;
    let diffs =
        DiffSource::open(capsule, store.objects(), store.root()).diffs(&view.result.changes);
    Ok(agentdiff_report::html::render(&view, &diffs, back))
}
