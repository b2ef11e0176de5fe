//! The directories a run creates next to its private workspace (the ship-out staging copy and
//! the client's `--cidfile` directory), named after the workspace so that `agentdiff cleanup`
//! finds what a killed run left: `.<run>.shipped-XXXXXX[.old]`, `.<run>.cid-XXXXXX`.

use std::path::Path;

/// Directory kinds a run creates next to its private workspace.
pub const STAGING_DIR: &str = "shipped";
pub const CID_DIR: &str = "cid";

/// The name prefix of a `kind` directory next to `workdir`: `.<workspace name>.<kind>-` (the
/// workspace is named after the run).
pub fn sibling_prefix(workdir: &Path, kind: &str) -> String {
    let name = workdir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    format!(".{name}.{kind}-")
}

/// Whether `name` is one of the directories a run with workspace `workdir` creates:
/// `PREFIX` + six random characters (tempfile's), a staging directory possibly with `.old`.
pub(crate) fn is_run_sibling(name: &str, workdir: &Path) -> bool {
    let random = |rest: &str| rest.len() == 6 && rest.bytes().all(|b| b.is_ascii_alphanumeric());
    let staging = name
        .strip_prefix(&sibling_prefix(workdir, STAGING_DIR))
        .is_some_and(|rest| random(rest.strip_suffix(".old").unwrap_or(rest)));
    let cid = name
        .strip_prefix(&sibling_prefix(workdir, CID_DIR))
        .is_some_and(random);
    staging || cid
}
