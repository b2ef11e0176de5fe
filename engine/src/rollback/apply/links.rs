//! The symlink steps of the applier: a link is written beside its place under a temporary name
//! and renamed over it (rename replaces the link itself; nothing is ever written through one),
//! removed by renaming it aside and unlinking it only when it is the link that was checked, and
//! put back where the run left a file or a directory once that is removed.

use super::files::{move_aside, put_back_aside};
use super::*;

impl<'a> Applier<'a> {
    /// Puts back the link `op.target` records, replacing the checked link (or creating it when
    /// `create`, where nothing may be in its place).
    pub(super) fn write_link(
        &mut self,
        op: &ApplyOp,
        parent: &DirHandle,
        name: &OsStr,
        current: &Current,
        create: bool,
    ) -> Step<OpResult> {
        let Some(target) = op.target.as_ref().and_then(|t| link_target(t).ok()) else {
            return Ok(OpResult::with(Outcome::Failed, "no recorded link target"));
        };
        self.step()?;
        let tmp = match parent.create_temp_link(OsStr::new(target)) {
            Ok(n) => n,
            Err(e) => {
                return Ok(OpResult::with(
                    Outcome::Failed,
                    format!("cannot create the link beside it: {e}"),
                ))
            }
        };
        let still = link_moved(parent, name, current).map_or(Ok(()), Err);
        self.put_in_place(parent, &tmp, name, still, create)
    }

    /// Removes the file or empty directory the run left where a link was (with the checks of
    /// their own removal) and puts the link back; with nothing there (an interrupted earlier
    /// execution), only the link is made.
    pub(super) fn replace_with_link(
        &mut self,
        op: &ApplyOp,
        parent: &DirHandle,
        name: &OsStr,
        current: Current,
        children: &DirChildren,
    ) -> Step<OpResult> {
        let removed = match current {
            Current::Absent => None,
            c @ Current::Dir(_) => Some(self.remove_dir(parent, name, c, children)?),
            c @ Current::File { .. } => Some(self.remove_file(parent, name, c)?),
            _ => {
                return Ok(OpResult::with(
                    Outcome::Failed,
                    "neither a file nor a directory",
                ))
            }
        };
        if let Some(r) = removed.filter(|r| r.outcome != Outcome::Removed) {
            return Ok(r);
        }
        let r = self.write_link(op, parent, name, &Current::Absent, true)?;
        Ok(match r.outcome {
            Outcome::Recreated => OpResult::new(Outcome::Restored),
            _ => r,
        })
    }

    /// Removes the checked link: renamed aside, unlinked only when it is still that link.
    pub(super) fn remove_link(
        &mut self,
        parent: &DirHandle,
        name: &OsStr,
        current: &Current,
    ) -> Step<OpResult> {
        let Current::Link { meta, target } = current else {
            return Ok(OpResult::with(Outcome::Failed, "not a symlink"));
        };
        let aside = match parent.unused_temp_name() {
            Ok(n) => n,
            Err(e) => {
                return Ok(OpResult::with(
                    Outcome::Failed,
                    format!("cannot choose a temporary name: {e}"),
                ))
            }
        };
        if let Some(why) = link_moved(parent, name, current) {
            return Ok(OpResult::with(
                Outcome::Conflict,
                format!("{why}; the current state was preserved"),
            ));
        }
        self.step()?;
        if let Err(r) = move_aside(parent, name, &aside) {
            return Ok(r);
        }
        let moved = Current::Link {
            meta: *meta,
            target: target.clone(),
        };
        if link_moved(parent, &aside, &moved).is_some() {
            return Ok(put_back_aside(parent, &aside, name, "it was replaced"));
        }
        self.step()?;
        if let Err(e) = parent.unlink_file(&aside) {
            return Ok(OpResult::with(
                Outcome::Failed,
                format!(
                    "moved aside as {} but not removed: {e}",
                    aside.to_string_lossy()
                ),
            ));
        }
        if let Err(e) = parent.sync() {
            return Ok(OpResult::with(
                Outcome::Failed,
                format!("removed, but the directory could not be synced: {e}"),
            ));
        }
        Ok(OpResult::new(Outcome::Removed))
    }
}

/// The last check before a swap: `name` still is what was checked (absent, or the same link
/// inode holding the same target). `Some(why)` when it is not.
fn link_moved(parent: &DirHandle, name: &OsStr, checked: &Current) -> Option<String> {
    let now = match parent.stat(name) {
        Ok(now) => now,
        Err(e) => return Some(format!("cannot re-check it: {e}")),
    };
    match (checked, now) {
        (Current::Absent, None) => None,
        (Current::Link { meta, target }, Some(now))
            if now.kind == NodeKind::Symlink && now.same_identity(meta) =>
        {
            match parent.read_link(name) {
                Ok(t) if &t == target => None,
                _ => Some("it was repointed while being restored".into()),
            }
        }
        _ => Some("it changed while being restored".into()),
    }
}
