//! The readings of a path a tool names, and the project paths they lead to.
//!
//! Claude Code trims a tool's path and expands a leading `~` or `~/` against the home directory
//! (its `expandPath`) before the tool uses it; another caller, or a later version, may take the
//! string as written. The hook decides every reading ([`readings`]): the strictest decision
//! wins and `allow` needs all of them, so an answer never rests on one reading while the tool
//! takes another. A `~name` first component (another user's home for a shell) is expanded when
//! that user is known here, else it cannot be told where it leads.

use std::path::Path;

use super::resolve::resolve;

/// One way a tool may read a path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// The path text to resolve (relative to the call's working directory, or absolute).
    Path(String),
    /// A reading whose target cannot be told, and why.
    Unknown(String),
}

/// Whitespace as JavaScript's `trim` removes it (a superset: more readings only add decisions).
fn trimmed_char(c: char) -> bool {
    c.is_whitespace() || c == '\u{feff}'
}

/// The readings of `raw`: as written, trimmed, and each with a leading `~` expanded. `home` is
/// the home directory `~` stands for. The text as written is always the first reading.
pub fn readings(raw: &str, home: Option<&Path>) -> Vec<Reading> {
    let mut texts = vec![raw];
    let trimmed = raw.trim_matches(trimmed_char);
    if trimmed != raw {
        texts.push(trimmed);
    }
    let mut out = Vec::new();
    for text in texts {
        push_new(&mut out, Reading::Path(text.to_owned()));
        if let Some(expanded) = expand_tilde(text, home) {
            push_new(&mut out, expanded);
        }
    }
    out
}

fn push_new(out: &mut Vec<Reading>, reading: Reading) {
    if !out.contains(&reading) {
        out.push(reading);
    }
}

/// `text` with its leading `~` or `~name` replaced by that home directory; `None` when it does
/// not start with `~`.
fn expand_tilde(text: &str, home: Option<&Path>) -> Option<Reading> {
    let rest = text.strip_prefix('~')?;
    let (name, tail) = match rest.find('/') {
        Some(i) => (
            rest.get(..i).unwrap_or_default(),
            rest.get(i..).unwrap_or_default(),
        ),
        None => (rest, ""),
    };
    let dir = if name.is_empty() {
        match home {
            Some(home) => home.to_path_buf(),
            None => {
                return Some(Reading::Unknown(format!(
                    "`{text}` starts with `~`, the home directory, which is not known here"
                )))
            }
        }
    } else {
        match nix::unistd::User::from_name(name).ok().flatten() {
            Some(user) => user.dir,
            None => {
                return Some(Reading::Unknown(format!(
                    "`{text}` starts with `~{name}`, the home directory of a user `{name}` \
                     that is not known here"
                )))
            }
        }
    };
    Some(Reading::Path(format!("{}{tail}", dir.to_string_lossy())))
}

pub(crate) use agentdiff_host::system::home_dir;

/// The project paths (relative to the symlink-free root, `/`-separated) that a tool naming
/// `raw` from `cwd` may change: every reading resolved as the hook's decision resolves it
/// (symlinks and `..` taken as the kernel takes them), with a final symlink's own name. When
/// no reading leads inside the root, `raw` itself, as the tool gave it.
pub fn project_paths(root: &Path, cwd: Option<&Path>, raw: &str) -> Vec<String> {
    let root = resolve(Path::new("/"), root).map_or_else(|_| root.to_path_buf(), |r| r.target);
    let base = cwd.map_or_else(|| root.clone(), Path::to_path_buf);
    let mut out: Vec<String> = Vec::new();
    for reading in readings(raw, home_dir().as_deref()) {
        let Reading::Path(text) = reading else {
            continue;
        };
        let Ok(resolution) = resolve(&base, Path::new(&text)) else {
            continue;
        };
        for name in resolution.final_links.iter().chain([&resolution.target]) {
            let Ok(rel) = name.strip_prefix(&root) else {
                continue;
            };
            let rel = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            if !rel.is_empty() && !out.contains(&rel) {
                out.push(rel);
            }
        }
    }
    if out.is_empty() {
        out.push(raw.to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn paths(readings: Vec<Reading>) -> Vec<String> {
        readings
            .into_iter()
            .map(|r| match r {
                Reading::Path(p) => p,
                Reading::Unknown(why) => format!("?{why}"),
            })
            .collect()
    }

    #[test]
    fn trimmed_and_tilde_readings_are_added() {
        let home = Path::new("/home/dev");
        assert_eq!(paths(readings("src/a.rs", Some(home))), ["src/a.rs"]);
        assert_eq!(paths(readings(" .env\t", Some(home))), [" .env\t", ".env"]);
        assert_eq!(
            paths(readings("~/.ssh/id_rsa", Some(home))),
            ["~/.ssh/id_rsa", "/home/dev/.ssh/id_rsa"]
        );
        assert_eq!(paths(readings("~", Some(home))), ["~", "/home/dev"]);
        assert_eq!(
            paths(readings(" ~/.bashrc", Some(home))),
            [" ~/.bashrc", "~/.bashrc", "/home/dev/.bashrc"]
        );
        let unknown = paths(readings("~nosuchuser-agentdiff/x", Some(home)));
        assert_eq!(unknown.len(), 2);
        assert!(unknown[1].starts_with('?'), "{unknown:?}");
        assert!(paths(readings("~/x", None))[1].starts_with('?'));
        // `a~` and `./~` are not expanded by anyone.
        assert_eq!(paths(readings("a~/x", Some(home))), ["a~/x"]);
    }

    #[test]
    fn project_paths_are_the_resolved_targets_below_the_canonical_root() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap().join("p");
        std::fs::create_dir_all(real.join("src")).unwrap();
        std::fs::write(real.join("src/a.rs"), "x").unwrap();
        symlink("src", real.join("srclink")).unwrap();
        symlink("p", real.parent().unwrap().join("plink")).unwrap();
        let via_link = real.parent().unwrap().join("plink");
        assert_eq!(project_paths(&via_link, None, "srclink/a.rs"), ["src/a.rs"]);
        let dotted = via_link.join("src/../src/c.rs");
        assert_eq!(
            project_paths(&via_link, None, dotted.to_str().unwrap()),
            ["src/c.rs"]
        );
        assert_eq!(
            project_paths(&real, Some(&real.join("src")), "../srclink/a.rs"),
            ["src/a.rs"]
        );
        // Outside the root: as the tool gave it.
        assert_eq!(project_paths(&real, None, "/etc/passwd"), ["/etc/passwd"]);
    }
}
