//! Project-relative path normalisation, shared by decisions, the hook and pattern validation.
//!
//! A policy subject is a POSIX-style path relative to the project root. Normalising is strict
//! rather than clever: anything that could name a location outside the project, or that means
//! different things on different systems, is rejected instead of being rewritten.

use super::PolicyError;

/// Normalise a project-relative path: backslashes become `/`; absolute paths, drive letters, UNC
/// paths, empty paths, empty / `.` / `..` segments and NUL bytes are rejected.
///
/// The result is idempotent: `normalize_path(&normalize_path(p)?) == normalize_path(p)`.
pub fn normalize_path(input: &str) -> Result<String, PolicyError> {
    check_relative(input).map_err(|reason| PolicyError::InvalidPath {
        input: input.to_owned(),
        reason,
    })
}

/// Why a path is not project-relative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    #[error("the path is empty")]
    Empty,
    #[error("the path contains a NUL byte")]
    Nul,
    #[error("UNC paths are not project-relative")]
    Unc,
    #[error("absolute paths are not project-relative")]
    Absolute,
    #[error("drive-letter paths are not project-relative")]
    DriveLetter,
    #[error("the path has an empty segment (`//` or a trailing `/`)")]
    EmptySegment,
    #[error("the path has a `.` segment")]
    DotSegment,
    #[error("the path has a `..` segment")]
    DotDotSegment,
}

/// The shared checks, returning the normalised path or why it is not project-relative.
pub(crate) fn check_relative(input: &str) -> Result<String, PathProblem> {
    if input.is_empty() {
        return Err(PathProblem::Empty);
    }
    if input.contains('\0') {
        return Err(PathProblem::Nul);
    }
    let unified = input.replace('\\', "/");
    if unified.starts_with("//") {
        return Err(PathProblem::Unc);
    }
    if unified.starts_with('/') {
        return Err(PathProblem::Absolute);
    }
    if has_drive_letter(&unified) {
        return Err(PathProblem::DriveLetter);
    }
    for segment in unified.split('/') {
        match segment {
            "" => return Err(PathProblem::EmptySegment),
            "." => return Err(PathProblem::DotSegment),
            ".." => return Err(PathProblem::DotDotSegment),
            _ => {}
        }
    }
    Ok(unified)
}

/// `C:` / `c:` at the start (with or without a following separator).
fn has_drive_letter(path: &str) -> bool {
    let bytes = path.as_bytes();
    bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':'
}

/// Why a policy pattern is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error(
        "pattern {pattern:?} has an empty segment; write `dir/**` for a directory and everything \
         below it"
    )]
    EmptySegment { pattern: String },
    #[error(
        "pattern {pattern:?} is not a project-relative glob: {}",
        problem.to_string().trim_start_matches("the path ")
    )]
    NotRelative {
        pattern: String,
        problem: PathProblem,
    },
    #[error("pattern is empty")]
    Empty,
    #[error("pattern {pattern:?} contains a NUL byte")]
    Nul { pattern: String },
    #[error(
        "pattern {pattern:?} contains a path separator; process rules match the executable \
         basename (e.g. `python*`)"
    )]
    PathSeparator { pattern: String },
}

/// Validate a filesystem glob pattern with the same rules as a path (globs are project-relative
/// and segment-aware), returning the pattern with backslashes turned into `/`.
pub(crate) fn check_pattern(pattern: &str) -> Result<String, PatternError> {
    match check_relative(pattern) {
        Ok(p) => Ok(p),
        Err(PathProblem::EmptySegment) => Err(PatternError::EmptySegment {
            pattern: pattern.to_owned(),
        }),
        Err(problem) => Err(PatternError::NotRelative {
            pattern: pattern.to_owned(),
            problem,
        }),
    }
}

/// Validate a process pattern: it matches an executable basename, so it cannot contain `/`.
pub(crate) fn check_process_pattern(pattern: &str) -> Result<String, PatternError> {
    if pattern.is_empty() {
        return Err(PatternError::Empty);
    }
    if pattern.contains('\0') {
        return Err(PatternError::Nul {
            pattern: pattern.to_owned(),
        });
    }
    if pattern.contains('/') || pattern.contains('\\') {
        return Err(PatternError::PathSeparator {
            pattern: pattern.to_owned(),
        });
    }
    Ok(pattern.to_owned())
}

/// The executable basename of `argv[0]`: the text after the last `/` (and `\`, so Windows-style
/// paths handed over from an agent cannot hide a denied name).
pub(crate) fn executable_basename(argv0: &std::ffi::OsStr) -> String {
    let text = argv0.to_string_lossy();
    let unified = text.replace('\\', "/");
    unified.rsplit('/').next().unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_unifies_relative_paths() {
        assert_eq!(normalize_path("src/main.rs").unwrap(), "src/main.rs");
        assert_eq!(normalize_path("src\\lib\\a.rs").unwrap(), "src/lib/a.rs");
        assert_eq!(normalize_path(".env").unwrap(), ".env");
        assert_eq!(normalize_path("...").unwrap(), "...");
        assert_eq!(normalize_path("a/..b/c..").unwrap(), "a/..b/c..");
    }

    #[test]
    fn rejects_everything_that_is_not_project_relative() {
        for bad in [
            "",
            "/etc/passwd",
            "\\etc\\passwd",
            "C:\\Windows",
            "c:foo",
            "Z:/x",
            "\\\\server\\share\\x",
            "//server/share",
            ".",
            "./src",
            "src/./a",
            "..",
            "../x",
            "a/../b",
            "a\\..\\b",
            "a//b",
            "a/",
            "a\0b",
        ] {
            assert!(normalize_path(bad).is_err(), "{bad:?} must be rejected");
        }
    }

    #[test]
    fn error_names_the_reason() {
        let err = normalize_path("../x").unwrap_err().to_string();
        assert!(err.contains("`..` segment"), "{err}");
        let err = normalize_path("\\\\srv\\share").unwrap_err().to_string();
        assert!(err.contains("UNC"), "{err}");
        let err = normalize_path("C:/x").unwrap_err().to_string();
        assert!(err.contains("drive-letter"), "{err}");
    }

    #[test]
    fn basename_of_argv0() {
        use std::ffi::OsStr;
        assert_eq!(executable_basename(OsStr::new("/usr/bin/curl")), "curl");
        assert_eq!(executable_basename(OsStr::new("curl")), "curl");
        assert_eq!(
            executable_basename(OsStr::new("C:\\tools\\curl.exe")),
            "curl.exe"
        );
        assert_eq!(executable_basename(OsStr::new("/usr/bin/")), "");
    }

    #[test]
    fn process_patterns_have_no_separator() {
        assert!(check_process_pattern("python*").is_ok());
        assert!(check_process_pattern("/usr/bin/curl").is_err());
        assert!(check_process_pattern("").is_err());
    }
}
