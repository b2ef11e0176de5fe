//! Claude Code's settings file on disk, as `hook install` and `uninstall` read and replace it.
//!
//! Invariants: a file that is not a settings object, or that holds a number the JSON model
//! would change (an integer beyond 64 bits, a decimal with more digits than a double keeps), is
//! refused with nothing changed; a file or directory that cannot be written, and a file whose
//! mode allows no writes (made read-only on purpose), are refused before anything is probed or
//! written (exit 68). A replacement is written beside the file and renamed over it (through a
//! symlink, over its target), with the old mode and, when root writes it, the old owner (or the
//! owner of the directory it goes into), so the user's own Claude Code can still read it; the
//! previous content first goes to a new backup file with the same owner.
//!
//! Not kept: the order of the file's object keys and its formatting (the backup holds the
//! original text).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::super::settings::Settings;
use crate::common::exit::{self, with_code};

/// Largest settings file read (Claude Code's are a few KiB).
const MAX_SETTINGS_BYTES: u64 = 4 * 1024 * 1024;

/// Significant digits a double always carries back exactly.
const EXACT_DIGITS: usize = 15;

/// A write that cannot happen: exit 68, nothing changed.
fn unwritable(e: anyhow::Error) -> anyhow::Error {
    with_code(exit::CONFLICT, e)
}

/// The file's bytes (`None` when it does not exist) and its model. A file that is not a
/// settings object, or that holds a number the model cannot carry, is refused, and nothing is
/// changed.
pub fn read_settings(path: &Path) -> anyhow::Result<(Option<Vec<u8>>, Settings)> {
    use std::io::Read;
    let shown = path.display().to_string();
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((None, Settings::default()))
        }
        Err(e) => {
            return Err(unwritable(
                anyhow::Error::new(e).context(format!("cannot read {shown}")),
            ))
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_SETTINGS_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {shown}"))?;
    let invalid = |why: String| {
        with_code(
            exit::INVALID_CONFIG,
            anyhow::anyhow!(
                "{shown} {why}; fix it (or move it away) and run this again — nothing was changed"
            ),
        )
    };
    if bytes.len() as u64 > MAX_SETTINGS_BYTES {
        return Err(invalid(format!(
            "is larger than {MAX_SETTINGS_BYTES} bytes"
        )));
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok((Some(bytes), Settings::default()));
    }
    let doc = serde_json::from_slice(&bytes)
        .map_err(|e| invalid(format!("is not a Claude Code settings object ({e})")))?;
    if let Some(number) = inexact_number(&bytes) {
        return Err(invalid(format!(
            "holds the number {number}, which would be rewritten with another value (JSON \
             numbers are kept as 64-bit integers or doubles); write it as a string, or change \
             the file by hand"
        )));
    }
    Ok((Some(bytes), doc))
}

/// The first number token outside strings that a 64-bit integer or a double does not hold
/// exactly: an integer beyond 64 bits, or more significant digits than a double keeps.
fn inexact_number(text: &[u8]) -> Option<String> {
    let mut i = 0;
    let mut in_string = false;
    while i < text.len() {
        let c = text[i];
        if in_string {
            match c {
                b'\\' => i += 1,
                b'"' => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if c == b'"' {
            in_string = true;
            i += 1;
            continue;
        }
        if c == b'-' || c.is_ascii_digit() {
            let start = i;
            while i < text.len()
                && matches!(text[i], b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')
            {
                i += 1;
            }
            let token = String::from_utf8_lossy(&text[start..i]).into_owned();
            if !number_is_exact(&token) {
                return Some(token);
            }
            continue;
        }
        i += 1;
    }
    None
}

fn number_is_exact(token: &str) -> bool {
    if !token.contains(['.', 'e', 'E']) {
        return token.parse::<i64>().is_ok() || token.parse::<u64>().is_ok();
    }
    let mantissa = token.split(['e', 'E']).next().unwrap_or_default();
    let digits = mantissa
        .chars()
        .filter(char::is_ascii_digit)
        .collect::<String>();
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    significant.len() <= EXACT_DIGITS
}

/// The file a write replaces: the symlink's target for a symlink (which must resolve).
fn target_of(path: &Path) -> anyhow::Result<PathBuf> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path)
            .with_context(|| format!("cannot follow the symlink {}", path.display()))
            .map_err(unwritable),
        _ => Ok(path.to_path_buf()),
    }
}

/// Refuses, before anything is probed or written, a settings file that cannot be replaced: its
/// mode allows no writes (made read-only on purpose), or it, or the nearest existing directory
/// it would go into, is not writable for this process.
pub fn writable(path: &Path) -> anyhow::Result<()> {
    use nix::unistd::{access, AccessFlags};
    let target = target_of(path)?;
    let refuse = |what: String| {
        unwritable(anyhow::anyhow!(
            "{what}; nothing was changed (make it writable, or install into another settings \
             file with --user or --root)"
        ))
    };
    if let Ok(meta) = std::fs::metadata(&target) {
        if meta.mode() & 0o222 == 0 {
            return Err(refuse(format!(
                "{} is read-only (mode {:o})",
                target.display(),
                meta.mode() & 0o7777
            )));
        }
        if let Err(e) = access(&target, AccessFlags::W_OK) {
            return Err(refuse(format!(
                "{} is not writable ({e})",
                target.display()
            )));
        }
    }
    let mut dir = target.parent();
    while let Some(d) = dir {
        if d.exists() {
            if let Err(e) = access(d, AccessFlags::W_OK | AccessFlags::X_OK) {
                return Err(refuse(format!(
                    "{} is not writable ({e}), so {} cannot be written there",
                    d.display(),
                    target.display()
                )));
            }
            return Ok(());
        }
        dir = d.parent();
    }
    Ok(())
}

/// Who should own what is written at `target`: its current owner, else the owner of the nearest
/// existing directory above it; `None` when this process is not root (its files are its own).
fn owner_for(target: &Path) -> Option<(u32, u32)> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    let mut at = Some(target);
    while let Some(p) = at {
        if let Ok(m) = std::fs::metadata(p) {
            return Some((m.uid(), m.gid()));
        }
        at = p.parent();
    }
    None
}

/// Creates the directories up to `dir`, each owned as `owner` says.
fn create_dirs(dir: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create {}", dir.display()))
        .map_err(unwritable)?;
    if let Some((uid, gid)) = owner {
        for d in missing {
            std::os::unix::fs::chown(d, Some(uid), Some(gid))
                .with_context(|| format!("cannot give {} to its owner", d.display()))
                .map_err(unwritable)?;
        }
    }
    Ok(())
}

/// Writes `doc` over `path` (through a symlink to its target), atomically, keeping the mode and
/// the owner; the previous content first goes to a new backup file, whose path is returned.
pub fn write_settings(
    path: &Path,
    original: Option<&[u8]>,
    doc: &Settings,
) -> anyhow::Result<Option<PathBuf>> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let target = target_of(path)?;
    let dir = target
        .parent()
        .context("the settings file has no directory")?;
    let owner = owner_for(&target);
    create_dirs(dir, owner)?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let backup = original
        .map(|bytes| write_backup(dir, &name, bytes, owner))
        .transpose()?;
    let mode = std::fs::metadata(&target)
        .map(|m| m.permissions().mode() & 0o7777)
        .unwrap_or(0o644);
    let mut text = serde_json::to_vec_pretty(doc).context("serialising the settings")?;
    text.push(b'\n');
    let tmp = dir.join(format!(".{name}.agentdiff-{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(&text)?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
            }
            f.set_permissions(std::fs::Permissions::from_mode(mode))?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, &target));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(unwritable(
            anyhow::Error::new(e).context(format!("cannot write {}", target.display())),
        ));
    }
    Ok(backup)
}

/// A new file `NAME.agentdiff-backup-<unix time>[-N]` beside the original, never overwriting one.
fn write_backup(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    owner: Option<(u32, u32)>,
) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for n in 0..100 {
        let suffix = if n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        let path = dir.join(format!("{name}.agentdiff-backup-{stamp}{suffix}"));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(mut f) => {
                f.write_all(bytes)
                    .and_then(|()| match owner {
                        Some((uid, gid)) => std::os::unix::fs::fchown(&f, Some(uid), Some(gid)),
                        None => Ok(()),
                    })
                    .and_then(|()| f.sync_all())
                    .with_context(|| format!("cannot write the backup {}", path.display()))
                    .map_err(unwritable)?;
                return Ok(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(unwritable(
                    anyhow::Error::new(e)
                        .context(format!("cannot create the backup {}", path.display())),
                ))
            }
        }
    }
    Err(unwritable(anyhow::anyhow!(
        "cannot find a free backup name beside {name} in {}",
        dir.display()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_the_model_changes_are_found_and_strings_are_skipped() {
        let exact = br#"{"a": 1, "b": -9223372036854775808, "c": 18446744073709551615,
            "d": 1.10, "e": 1e3, "f": 0.000123456789012345, "g": "12345678901234567890123"}"#;
        assert_eq!(inexact_number(exact), None);
        let big = br#"{"x": "1.0", "bigNumber": 12345678901234567890123}"#;
        assert_eq!(
            inexact_number(big).as_deref(),
            Some("12345678901234567890123")
        );
        let precise = br#"{"p": 0.1000000000000000000001}"#;
        assert!(inexact_number(precise).is_some());
        let escaped = br#"{"s": "a \" 99999999999999999999999 \\", "n": 2}"#;
        assert_eq!(inexact_number(escaped), None);
    }
}
