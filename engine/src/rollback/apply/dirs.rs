//! The directory steps of the applier: create a directory (and settle its mode once its entries
//! are in), remove an empty one, change its mode.

use super::*;

impl<'a> Applier<'a> {
    pub(super) fn create_dir(
        &mut self,
        op: &ApplyOp,
        parent: &DirHandle,
        name: &OsStr,
    ) -> Step<OpResult> {
        let Some(target) = &op.target else {
            return Ok(OpResult::with(Outcome::Failed, "no target entry"));
        };
        self.step()?;
        if let Err(e) = parent.mkdir(name, OWNER_RWX) {
            return Ok(if e.kind() == io::ErrorKind::AlreadyExists {
                OpResult::with(
                    Outcome::Conflict,
                    "it was created by someone else while being restored; the current state was \
                     preserved",
                )
            } else {
                OpResult::with(Outcome::Failed, format!("cannot create it: {e}"))
            });
        }
        // A crash between the mkdir and the chmod leaves it at 0700; the next execution finishes
        // it (see `finish_created_dir`).
        self.step()?;
        let made = parent
            .open_dir(name)
            .and_then(|d| {
                let work = working_dir_mode(target.mode);
                d.chmod(work)
            })
            .and_then(|()| parent.sync());
        match made {
            Ok(()) => Ok(OpResult::new(Outcome::Recreated)),
            Err(e) => Ok(OpResult::with(
                Outcome::Failed,
                format!("created, but cannot set its mode: {e}"),
            )),
        }
    }

    /// Finishes a directory an interrupted earlier execution created: gives it its working mode
    /// (its final mode, when that leaves the owner full access; otherwise the final mode follows
    /// after its contents, from the `SettleDirMode` step that is planned for it in every
    /// execution).
    pub(super) fn finish_created_dir(
        &mut self,
        parent: &DirHandle,
        name: &OsStr,
        meta: &NodeMeta,
        target_mode: u32,
    ) -> Step<OpResult> {
        let work = working_dir_mode(target_mode);
        let reason = "re-created by an interrupted earlier rollback; finished now";
        if self.dry_run {
            return Ok(OpResult::with(Outcome::WouldRecreate, reason));
        }
        if meta.mode != work {
            let dir = match parent.open_dir(name) {
                Ok(d) if d.meta().is_ok_and(|m| m.same_identity(meta)) => d,
                _ => {
                    return Ok(OpResult::with(
                        Outcome::Conflict,
                        "it was replaced while being restored; nothing was changed",
                    ))
                }
            };
            self.step()?;
            if let Err(e) = dir.chmod(work).and_then(|()| parent.sync()) {
                return Ok(OpResult::with(
                    Outcome::Failed,
                    format!("cannot set its mode {work:04o}: {e}"),
                ));
            }
        }
        Ok(OpResult::with(Outcome::Recreated, reason))
    }

    /// `Some` when the directory holds entries that are not leftovers of this tool.
    pub(super) fn dir_not_empty(
        &self,
        parent: &DirHandle,
        name: &OsStr,
        children: &DirChildren,
    ) -> Option<OpResult> {
        let entries = match parent.open_dir(name).and_then(|d| d.entries()) {
            Ok(e) => e,
            Err(e) => {
                return Some(OpResult::with(
                    Outcome::Failed,
                    format!("cannot list it: {e}"),
                ))
            }
        };
        let extra: Vec<String> = entries
            .iter()
            .filter(|n| !(self.dry_run && dir::is_temp_name(n)))
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !children.gone.contains(n))
            .collect();
        if extra.is_empty() {
            return None;
        }
        if extra.iter().all(|n| children.kept.contains(n)) {
            return Some(OpResult::with(
                Outcome::Skipped,
                format!(
                    "not empty: it still holds {} entr{} that {} not selected or kept (see \
                     their outcomes)",
                    extra.len(),
                    if extra.len() == 1 { "y" } else { "ies" },
                    if extra.len() == 1 { "was" } else { "were" }
                ),
            ));
        }
        let shown: Vec<&str> = extra.iter().take(5).map(String::as_str).collect();
        Some(OpResult::with(
            Outcome::Conflict,
            format!(
                "not empty: it holds entries added after the run ({}{}); it was kept",
                shown.join(", "),
                if extra.len() > shown.len() {
                    ", ..."
                } else {
                    ""
                }
            ),
        ))
    }

    pub(super) fn remove_dir(
        &mut self,
        parent: &DirHandle,
        name: &OsStr,
        current: Current,
        children: &DirChildren,
    ) -> Step<OpResult> {
        let Current::Dir(meta) = current else {
            return Ok(OpResult::with(Outcome::Failed, "not a directory"));
        };
        if let Some(r) = self.dir_not_empty(parent, name, children) {
            return Ok(r);
        }
        match parent.stat(name) {
            Ok(Some(now)) if now.same_identity(&meta) => {}
            _ => {
                return Ok(OpResult::with(
                    Outcome::Conflict,
                    "it was replaced while being removed; the current state was preserved",
                ))
            }
        }
        self.step()?;
        if let Err(e) = parent.remove_dir(name) {
            let not_empty =
                e.raw_os_error() == Some(libc::ENOTEMPTY) || e.raw_os_error() == Some(libc::EEXIST);
            return Ok(if not_empty {
                OpResult::with(
                    Outcome::Conflict,
                    "entries were added to it while it was being removed; it was kept",
                )
            } else {
                OpResult::with(Outcome::Failed, format!("cannot remove it: {e}"))
            });
        }
        match parent.sync() {
            Ok(()) => Ok(OpResult::new(Outcome::Removed)),
            Err(e) => Ok(OpResult::with(
                Outcome::Failed,
                format!("removed, but the directory could not be synced: {e}"),
            )),
        }
    }

    pub(super) fn chmod_dir(
        &mut self,
        op: &ApplyOp,
        parent: &DirHandle,
        name: &OsStr,
        current: Current,
    ) -> Step<OpResult> {
        let (Current::Dir(meta), Some(target)) = (current, &op.target) else {
            return Ok(OpResult::with(Outcome::Failed, "not a directory"));
        };
        let dir = match parent.open_dir(name) {
            Ok(d) => d,
            Err(e) => {
                return Ok(OpResult::with(
                    Outcome::Conflict,
                    format!("it was replaced while being restored ({e}); nothing was changed"),
                ))
            }
        };
        match dir.meta() {
            Ok(now) if now.same_identity(&meta) => {}
            _ => {
                return Ok(OpResult::with(
                    Outcome::Conflict,
                    "it was replaced while being restored; nothing was changed",
                ))
            }
        }
        self.step()?;
        match dir.chmod(target.mode).and_then(|()| dir.sync()) {
            Ok(()) => Ok(OpResult::new(Outcome::Restored)),
            Err(e) => Ok(OpResult::with(
                Outcome::Failed,
                format!("cannot change its mode: {e}"),
            )),
        }
    }

    /// Final mode of a directory created by this tool; reports only problems.
    pub(super) fn settle_dir_mode(
        &mut self,
        op: &ApplyOp,
        parent: Option<&DirHandle>,
        name: &OsStr,
        current: &Current,
    ) -> Step<OpResult> {
        let Some(target) = &op.target else {
            return Ok(OpResult::with(Outcome::Failed, "no target entry"));
        };
        let (Some(parent), Current::Dir(meta)) = (parent, current) else {
            // Its creation already reported why it is not there.
            return Ok(OpResult::new(Outcome::AlreadyRestored));
        };
        if meta.mode == target.mode {
            return Ok(OpResult::new(Outcome::AlreadyRestored));
        }
        if meta.mode != working_dir_mode(target.mode) && meta.mode != OWNER_RWX {
            return Ok(OpResult::with(
                Outcome::Conflict,
                format!(
                    "its mode changed while it was being restored (now {:04o}); it was kept",
                    meta.mode
                ),
            ));
        }
        if self.dry_run {
            return Ok(OpResult::new(Outcome::WouldRestore));
        }
        let dir = match parent.open_dir(name) {
            Ok(d) if d.meta().is_ok_and(|m| m.same_identity(meta)) => d,
            _ => {
                return Ok(OpResult::with(
                    Outcome::Conflict,
                    "it was replaced while being restored; nothing was changed",
                ))
            }
        };
        self.step()?;
        match dir.chmod(target.mode).and_then(|()| dir.sync()) {
            Ok(()) => Ok(OpResult::new(Outcome::Restored)),
            Err(e) => Ok(OpResult::with(
                Outcome::Failed,
                format!("cannot set its final mode {:04o}: {e}", target.mode),
            )),
        }
    }
}
