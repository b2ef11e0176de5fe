//! The file steps of the applier: write a file's content (temporary file, mode, fsync, checked
//! swap), change its mode, remove it (renamed aside first, unlinked only when it is the checked
//! inode).

use super::*;

impl<'a> Applier<'a> {
    /// Writes the target content into a temp file (content, then mode, fsync) and swaps it in.
    pub(super) fn write_file(
        &mut self,
        op: &ApplyOp,
        parent: &DirHandle,
        name: &OsStr,
        current: Current,
        create: bool,
    ) -> Step<OpResult> {
        let Some(target) = &op.target else {
            return Ok(OpResult::with(Outcome::Failed, "no target entry"));
        };
        let Some(hex) = target.sha256.as_deref() else {
            return Ok(OpResult::with(
                Outcome::Failed,
                "the target has no recorded hash",
            ));
        };
        self.step()?;
        let (mut tmp, tmp_name) = match parent.create_temp() {
            Ok(t) => t,
            Err(e) => {
                return Ok(OpResult::with(
                    Outcome::Failed,
                    format!("cannot create a temporary file beside it: {e}"),
                ))
            }
        };
        let filled = self
            .objects
            .copy_verified_to(hex, &mut tmp)
            .map_err(|e| match e {
                StoreError::ObjectCorrupt { .. } => format!(
                    "its backup object {hex} no longer matches its hash; refusing to restore from it"
                ),
                other => format!("cannot copy its backup: {other}"),
            })
            .and_then(|n| {
                if n == target.size {
                    Ok(())
                } else {
                    Err(format!(
                        "its backup object has {n} bytes, the recorded file {}",
                        target.size
                    ))
                }
            })
            .and_then(|()| {
                dir::chmod_file(&tmp, target.mode)
                    .and_then(|()| tmp.flush())
                    .and_then(|()| tmp.sync_all())
                    .map_err(|e| format!("cannot write the temporary file: {e}"))
            });
        drop(tmp);
        if let Err(why) = filled {
            let _ = parent.unlink_file(&tmp_name);
            return Ok(OpResult::with(Outcome::Failed, why));
        }
        // Re-check that the path still is what was checked, just before the swap.
        let still = match (&current, parent.stat(name)) {
            (Current::Absent, Ok(None)) => Ok(()),
            (Current::File { meta, file, .. }, Ok(Some(_))) => {
                if still_verified(parent, name, meta, file) {
                    Ok(())
                } else {
                    Err("it was replaced or modified while being restored".to_string())
                }
            }
            (_, Ok(_)) => Err("it changed while being restored".to_string()),
            (_, Err(e)) => Err(format!("cannot re-check it: {e}")),
        };
        self.put_in_place(parent, &tmp_name, name, still, create)
    }

    /// Renames the prepared `tmp` over `name` (or into its empty place when `create`) once
    /// `still` confirms the path is what was checked, and syncs the directory; `tmp` is removed
    /// whenever it is not renamed. Files and links are put back the same way.
    pub(super) fn put_in_place(
        &mut self,
        parent: &DirHandle,
        tmp: &OsStr,
        name: &OsStr,
        still: Result<(), String>,
        create: bool,
    ) -> Step<OpResult> {
        if let Err(why) = still {
            let _ = parent.unlink_file(tmp);
            return Ok(OpResult::with(
                Outcome::Conflict,
                format!("{why}; the current state was preserved"),
            ));
        }
        self.step()?;
        let swapped = if create {
            parent.rename_noreplace(tmp, name)
        } else {
            parent.rename(tmp, name)
        };
        if let Err(e) = swapped {
            let _ = parent.unlink_file(tmp);
            return Ok(if e.kind() == io::ErrorKind::AlreadyExists {
                OpResult::with(
                    Outcome::Conflict,
                    "it was created by someone else while being restored; the current state was \
                     preserved",
                )
            } else {
                OpResult::with(Outcome::Failed, format!("cannot rename into place: {e}"))
            });
        }
        if let Err(e) = parent.sync() {
            return Ok(OpResult::with(
                Outcome::Failed,
                format!("restored, but the directory could not be synced: {e}"),
            ));
        }
        Ok(OpResult::new(if create {
            Outcome::Recreated
        } else {
            Outcome::Restored
        }))
    }

    pub(super) fn chmod_file(
        &mut self,
        op: &ApplyOp,
        parent: &DirHandle,
        name: &OsStr,
        current: Current,
    ) -> Step<OpResult> {
        let (Current::File { meta, file, .. }, Some(target)) = (current, &op.target) else {
            return Ok(OpResult::with(Outcome::Failed, "not a regular file"));
        };
        if !still_verified(parent, name, &meta, &file) {
            return Ok(OpResult::with(
                Outcome::Conflict,
                "it was replaced or modified while being restored; the current state was preserved",
            ));
        }
        self.step()?;
        match dir::chmod_file(&file, target.mode).and_then(|()| file.sync_all()) {
            Ok(()) => Ok(OpResult::new(Outcome::Restored)),
            Err(e) => Ok(OpResult::with(
                Outcome::Failed,
                format!("cannot change its mode: {e}"),
            )),
        }
    }

    /// Renames the file aside, checks it is the inode that was verified, then unlinks it (or
    /// renames it back).
    pub(super) fn remove_file(
        &mut self,
        parent: &DirHandle,
        name: &OsStr,
        current: Current,
    ) -> Step<OpResult> {
        let Current::File { meta, file, .. } = current else {
            return Ok(OpResult::with(Outcome::Failed, "not a regular file"));
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
        // Last check before touching it: still the inode that was hashed, unmodified.
        if !still_verified(parent, name, &meta, &file) {
            return Ok(OpResult::with(
                Outcome::Conflict,
                "it was replaced or modified while being removed; the current state was preserved",
            ));
        }
        self.step()?;
        if let Err(r) = move_aside(parent, name, &aside) {
            return Ok(r);
        }
        let ours = match (parent.stat(&aside), dir::file_meta(&file)) {
            // The rename itself updates ctime, so only size and mtime are compared here.
            (Ok(Some(moved)), Ok(fd_now)) => {
                moved.same_identity(&meta)
                    && fd_now.size == meta.size
                    && fd_now.mtime_ns == meta.mtime_ns
            }
            _ => false,
        };
        if !ours {
            return Ok(put_back_aside(
                parent,
                &aside,
                name,
                "it was replaced or modified",
            ));
        }
        self.step()?;
        if let Err(e) = parent.unlink_file(&aside) {
            let _ = parent.rename_noreplace(&aside, name);
            return Ok(OpResult::with(
                Outcome::Failed,
                format!("cannot unlink it: {e}"),
            ));
        }
        match parent.sync() {
            Ok(()) => Ok(OpResult::new(Outcome::Removed)),
            Err(e) => Ok(OpResult::with(
                Outcome::Failed,
                format!("removed, but the directory could not be synced: {e}"),
            )),
        }
    }
}

/// Renames `name` to `aside` (never over anything) before it is removed; a name already gone is
/// someone else's removal, anything else a failure.
pub(super) fn move_aside(parent: &DirHandle, name: &OsStr, aside: &OsStr) -> Result<(), OpResult> {
    parent.rename_noreplace(name, aside).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            OpResult::with(
                Outcome::AlreadyRestored,
                "removed by someone else meanwhile",
            )
        } else {
            OpResult::with(Outcome::Failed, format!("cannot move it aside: {e}"))
        }
    })
}

/// What was moved aside for removal is not what was checked (`raced` says how it changed): it is
/// renamed back, never over anything, and kept, a conflict.
pub(super) fn put_back_aside(
    parent: &DirHandle,
    aside: &OsStr,
    name: &OsStr,
    raced: &str,
) -> OpResult {
    let back = parent.rename_noreplace(aside, name);
    let _ = parent.sync();
    OpResult::with(
        Outcome::Conflict,
        match back {
            Ok(()) => format!("{raced} while being removed; it was put back unchanged"),
            Err(e) => format!(
                "{raced} while being removed and could not be put back ({e}); it is kept as {}",
                aside.to_string_lossy()
            ),
        },
    )
}
