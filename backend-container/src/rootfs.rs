//! Checks that a `--rootfs` directory is usable, and a digest of its manifest for evidence.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where engines look up a bare command name inside the container (their default PATH).
const CONTAINER_PATH: [&str; 6] = [
    "usr/local/sbin",
    "usr/local/bin",
    "usr/sbin",
    "usr/bin",
    "sbin",
    "bin",
];

/// Bound on the rootfs walk so a huge tree cannot stall the launch.
const MAX_ENTRIES: usize = 200_000;

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("rootfs {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("rootfs {0} is not a directory")]
    NotDirectory(String),
    #[error("rootfs {0} is the project root or one of its ancestors, so the host tree would be visible in the container")]
    ContainsProject(String),
    #[error("rootfs {0} is not searchable by other users (mode {1:o}); the non-root container user cannot enter it")]
    NotSearchable(String, u32),
    #[error("rootfs {rootfs} has no {command:?} (looked in {looked})")]
    MissingCommand {
        rootfs: String,
        command: String,
        looked: String,
    },
    #[error("rootfs {0} has more than {MAX_ENTRIES} entries; too large to fingerprint")]
    TooLarge(String),
}

impl RootfsError {
    pub fn remedy(&self) -> &'static str {
        match self {
            RootfsError::Io { .. } | RootfsError::NotDirectory(_) => {
                "pass an existing directory holding a root filesystem (e.g. bin/busybox and its applet links)"
            }
            RootfsError::ContainsProject(_) => {
                "pass a dedicated root filesystem directory outside the project's ancestry"
            }
            RootfsError::NotSearchable(..) => "run `chmod 755` on the rootfs directory",
            RootfsError::MissingCommand { .. } => {
                "install the command in the rootfs, or give its path inside the rootfs"
            }
            RootfsError::TooLarge(_) => "import the tree as an image and pass `--image`",
        }
    }
}

/// Checked rootfs: canonical path and the digest of its manifest.
#[derive(Debug, Clone)]
pub struct CheckedRootfs {
    pub path: PathBuf,
    /// `sha256:` of the sorted (path, type, mode, size, content or link target) list.
    pub manifest_digest: String,
    pub entries: usize,
}

/// Check the rootfs can run `command` as a non-root user, and fingerprint it.
pub fn check(
    rootfs: &Path,
    project_root: &Path,
    command: &str,
    non_root_user: bool,
) -> Result<CheckedRootfs, RootfsError> {
    let display = rootfs.display().to_string();
    let io = |source| RootfsError::Io {
        path: display.clone(),
        source,
    };
    let canonical = std::fs::canonicalize(rootfs).map_err(io)?;
    let meta = std::fs::metadata(&canonical).map_err(io)?;
    if !meta.is_dir() {
        return Err(RootfsError::NotDirectory(display));
    }
    let project = std::fs::canonicalize(project_root).unwrap_or_else(|_| project_root.into());
    if project.starts_with(&canonical) {
        return Err(RootfsError::ContainsProject(display));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        if non_root_user && mode & 0o001 == 0 {
            return Err(RootfsError::NotSearchable(display, mode));
        }
    }
    let candidates: Vec<PathBuf> = if let Some(abs) = command.strip_prefix('/') {
        vec![canonical.join(abs)]
    } else if command.contains('/') {
        // Relative to the working directory /workspace: the workspace provides it.
        Vec::new()
    } else {
        CONTAINER_PATH
            .iter()
            .map(|d| canonical.join(d).join(command))
            .collect()
    };
    if !candidates.is_empty()
        && !candidates
            .iter()
            .any(|c| std::fs::symlink_metadata(c).is_ok())
    {
        return Err(RootfsError::MissingCommand {
            rootfs: display,
            command: command.to_string(),
            looked: if command.starts_with('/') {
                command.to_string()
            } else {
                CONTAINER_PATH
                    .iter()
                    .map(|d| format!("/{d}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        });
    }
    let (manifest_digest, entries) = manifest_digest(&canonical)?;
    Ok(CheckedRootfs {
        path: canonical,
        manifest_digest,
        entries,
    })
}

/// Digest of the rootfs tree: every entry's relative path, type, mode, size and content hash (or
/// symlink target), sorted, without following symlinks.
pub fn manifest_digest(root: &Path) -> Result<(String, usize), RootfsError> {
    let display = root.display().to_string();
    let io = |p: &Path, source| RootfsError::Io {
        path: p.display().to_string(),
        source,
    };
    let mut lines: Vec<Vec<u8>> = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for item in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
            let item = item.map_err(|e| io(&dir, e))?;
            let path = item.path();
            let meta = std::fs::symlink_metadata(&path).map_err(|e| io(&path, e))?;
            let rel = path.strip_prefix(root).unwrap_or(&path);
            let mut line = Vec::new();
            line.extend_from_slice(rel.as_os_str().as_encoded_bytes());
            line.push(0);
            let ft = meta.file_type();
            #[cfg(unix)]
            let mode = {
                use std::os::unix::fs::PermissionsExt;
                meta.permissions().mode() & 0o7777
            };
            #[cfg(not(unix))]
            let mode = 0u32;
            if ft.is_symlink() {
                let target = std::fs::read_link(&path).map_err(|e| io(&path, e))?;
                line.extend_from_slice(format!("l {mode:o} ").as_bytes());
                line.extend_from_slice(target.as_os_str().as_encoded_bytes());
            } else if ft.is_dir() {
                line.extend_from_slice(format!("d {mode:o}").as_bytes());
                stack.push(path.clone());
            } else if ft.is_file() {
                let mut h = Sha256::new();
                let mut f = std::fs::File::open(&path).map_err(|e| io(&path, e))?;
                std::io::copy(&mut f, &mut h).map_err(|e| io(&path, e))?;
                line.extend_from_slice(
                    format!("f {mode:o} {} {}", meta.len(), hex::encode(h.finalize())).as_bytes(),
                );
            } else {
                line.extend_from_slice(format!("o {mode:o}").as_bytes());
            }
            lines.push(line);
            if lines.len() > MAX_ENTRIES {
                return Err(RootfsError::TooLarge(display));
            }
        }
    }
    lines.sort();
    let mut h = Sha256::new();
    for l in &lines {
        h.update(l);
        h.update(b"\n");
    }
    Ok((format!("sha256:{}", hex::encode(h.finalize())), lines.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    fn make_rootfs() -> tempfile::TempDir {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(d.path().join("bin")).unwrap();
        std::fs::write(d.path().join("bin/busybox"), b"binary").unwrap();
        std::os::unix::fs::symlink("busybox", d.path().join("bin/sh")).unwrap();
        d
    }

    #[cfg(unix)]
    #[test]
    fn checks_command_presence_and_searchability() {
        use std::os::unix::fs::PermissionsExt;
        let r = make_rootfs();
        let project = tempfile::tempdir().unwrap();
        let ok = check(r.path(), project.path(), "sh", true).unwrap();
        assert!(ok.manifest_digest.starts_with("sha256:"));
        assert_eq!(ok.entries, 3);
        check(r.path(), project.path(), "/bin/sh", true).unwrap();
        check(r.path(), project.path(), "./local-script", true).unwrap();
        assert!(matches!(
            check(r.path(), project.path(), "python3", true),
            Err(RootfsError::MissingCommand { .. })
        ));
        std::fs::set_permissions(r.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(matches!(
            check(r.path(), project.path(), "sh", true),
            Err(RootfsError::NotSearchable(..))
        ));
        check(r.path(), project.path(), "sh", false).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn refuses_missing_files_and_project_ancestors() {
        let project = tempfile::tempdir().unwrap();
        let inner = project.path().join("sub");
        std::fs::create_dir(&inner).unwrap();
        assert!(matches!(
            check(Path::new("/"), &inner, "sh", false),
            Err(RootfsError::ContainsProject(_))
        ));
        assert!(matches!(
            check(project.path(), &inner, "sh", false),
            Err(RootfsError::ContainsProject(_))
        ));
        assert!(matches!(
            check(&project.path().join("nope"), &inner, "sh", false),
            Err(RootfsError::Io { .. })
        ));
        let f = project.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(matches!(
            check(&f, &inner, "sh", false),
            Err(RootfsError::NotDirectory(_))
        ));
    }

    #[cfg(unix)]
    #[test]
    fn digest_changes_with_content() {
        let r = make_rootfs();
        let (a, _) = manifest_digest(r.path()).unwrap();
        let (b, _) = manifest_digest(r.path()).unwrap();
        assert_eq!(a, b);
        std::fs::write(r.path().join("bin/busybox"), b"other").unwrap();
        let (c, _) = manifest_digest(r.path()).unwrap();
        assert_ne!(a, c);
    }
}
