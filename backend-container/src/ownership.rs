//! Who the container user is, and making the private workspace writable for exactly that user.
//!
//! Decision: a root invoker (rootful engine, no user namespace) runs the container as 65532:65532
//! by default and hands the freshly materialised workspace to that uid/gid with `lchown` (no link
//! is followed). A non-root invoker runs the container as its own uid:gid; with rootless podman
//! `--userns keep-id` maps that uid to itself, so the workspace it already owns is writable
//! without any chown. In both cases the workspace directory stays 0700 and its parent
//! (`ROOT/.agentdiff/workspaces/`, 0700, owned by the invoker) keeps other host users out.

use std::path::Path;

use crate::engine::EngineKind;
use crate::options::{UserSpec, DEFAULT_USER};

#[derive(Debug, thiserror::Error)]
pub enum OwnershipError {
    #[error("could not hand the workspace entry {path} to the container user {user}: {source}")]
    Chown {
        path: String,
        user: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not read the workspace {path}: {source}")]
    Walk {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// The invoking user's effective ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invoker {
    pub uid: u32,
    pub gid: u32,
}

impl Invoker {
    pub fn current() -> Self {
        #[cfg(unix)]
        {
            Self {
                uid: nix::unistd::geteuid().as_raw(),
                gid: nix::unistd::getegid().as_raw(),
            }
        }
        #[cfg(not(unix))]
        {
            Self { uid: 1, gid: 1 }
        }
    }
}

/// The container user and whether podman must keep the invoker's id.
pub fn container_user(
    explicit: Option<UserSpec>,
    invoker: Invoker,
    kind: EngineKind,
) -> (UserSpec, bool) {
    let keep_id = invoker.uid != 0 && kind == EngineKind::Podman;
    let user = match explicit {
        Some(u) => u,
        None if invoker.uid == 0 => DEFAULT_USER,
        None => UserSpec {
            uid: invoker.uid,
            gid: invoker.gid,
        },
    };
    (user, keep_id)
}

/// Make the workspace writable by the container user. Returns a warning when that cannot be
/// arranged (a non-root invoker asking for another uid).
pub fn hand_over(
    workspace: &Path,
    user: UserSpec,
    invoker: Invoker,
) -> Result<Option<String>, OwnershipError> {
    if invoker.uid != 0 {
        if user.uid != invoker.uid {
            return Ok(Some(format!(
                "the workspace belongs to uid {} but the container runs as {}; it may not be writable inside the container",
                invoker.uid,
                user.render()
            )));
        }
        return Ok(None);
    }
    #[cfg(unix)]
    chown_tree(workspace, user)?;
    Ok(None)
}

#[cfg(unix)]
fn chown_tree(root: &Path, user: UserSpec) -> Result<(), OwnershipError> {
    let chown = |p: &Path| {
        std::os::unix::fs::lchown(p, Some(user.uid), Some(user.gid)).map_err(|source| {
            OwnershipError::Chown {
                path: p.display().to_string(),
                user: user.render(),
                source,
            }
        })
    };
    chown(root)?;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let walk = |source| OwnershipError::Walk {
            path: dir.display().to_string(),
            source,
        };
        for item in std::fs::read_dir(&dir).map_err(walk)? {
            let item = item.map_err(|source| OwnershipError::Walk {
                path: dir.display().to_string(),
                source,
            })?;
            let path = item.path();
            chown(&path)?;
            // file_type() does not follow symlinks: a link to a directory is never descended.
            if item
                .file_type()
                .map_err(|source| OwnershipError::Walk {
                    path: path.display().to_string(),
                    source,
                })?
                .is_dir()
            {
                stack.push(path);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_defaults_to_nonroot_user_without_keep_id() {
        let (u, keep) = container_user(None, Invoker { uid: 0, gid: 0 }, EngineKind::Podman);
        assert_eq!(u, DEFAULT_USER);
        assert!(!keep);
    }

    #[test]
    fn non_root_runs_as_itself_and_keeps_id_with_podman() {
        let inv = Invoker {
            uid: 1000,
            gid: 100,
        };
        let (u, keep) = container_user(None, inv, EngineKind::Podman);
        assert_eq!(
            u,
            UserSpec {
                uid: 1000,
                gid: 100
            }
        );
        assert!(keep);
        let (_, keep) = container_user(None, inv, EngineKind::Docker);
        assert!(!keep);
        let explicit = UserSpec { uid: 7, gid: 7 };
        assert_eq!(
            container_user(Some(explicit), inv, EngineKind::Docker).0,
            explicit
        );
        let w = tempfile::tempdir().unwrap();
        assert!(hand_over(w.path(), explicit, inv).unwrap().is_some());
        assert!(hand_over(
            w.path(),
            UserSpec {
                uid: 1000,
                gid: 100
            },
            inv
        )
        .unwrap()
        .is_none());
    }

    #[cfg(unix)]
    #[test]
    fn root_hands_the_tree_over_without_following_links() {
        use std::os::unix::fs::MetadataExt;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP root_hands_the_tree_over_without_following_links: needs root to chown");
            return;
        }
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("target");
        std::fs::write(&target, b"x").unwrap();
        let w = tempfile::tempdir().unwrap();
        std::fs::create_dir(w.path().join("d")).unwrap();
        std::fs::write(w.path().join("d/f"), b"y").unwrap();
        std::os::unix::fs::symlink(&target, w.path().join("link")).unwrap();
        let user = UserSpec {
            uid: 65532,
            gid: 65532,
        };
        hand_over(w.path(), user, Invoker { uid: 0, gid: 0 }).unwrap();
        for p in ["", "d", "d/f", "link"] {
            let m = std::fs::symlink_metadata(w.path().join(p)).unwrap();
            assert_eq!((m.uid(), m.gid()), (65532, 65532), "{p}");
        }
        let t = std::fs::metadata(&target).unwrap();
        assert_eq!(t.uid(), 0, "the link's target outside must stay untouched");
    }
}
