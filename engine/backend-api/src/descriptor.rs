//! A backend's public face: what the CLI, `doctor` and the conformance suite know about a backend
//! without naming it. The descriptor declares the backend's options (name, type, help, default,
//! validation, an optional command-line flag alias), the configurations under which it must fail
//! closed, and a diagnostics hook for `agentdiff doctor`.
//!
//! Invariant: option validation here is the first gate, not the only one; a backend still parses
//! its options in `prepare` (options also arrive from the policy's `runtime.options`).

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;

use super::{BackendOptions, DynRuntimeBackend};

/// The type of an option's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "type", content = "choices")]
pub enum OptionKind {
    /// Any non-empty text without control characters.
    Text,
    /// A filesystem path (non-empty, no NUL).
    Path,
    /// `true` or `false`; as a flag alias, the flag alone means `true`.
    Bool,
    /// A whole number.
    Integer,
    /// One of the listed words.
    Choice(&'static [&'static str]),
    /// The name of an environment variable the command must receive; the CLI keeps such names
    /// through environment scrubbing.
    EnvName,
}

impl OptionKind {
    /// The `type` word the kind is serialised with.
    pub fn type_name(self) -> &'static str {
        match self {
            OptionKind::Text => "text",
            OptionKind::Path => "path",
            OptionKind::Bool => "bool",
            OptionKind::Integer => "integer",
            OptionKind::Choice(_) => "choice",
            OptionKind::EnvName => "env_name",
        }
    }

    fn expected(self) -> String {
        match self {
            OptionKind::Text => "non-empty text without control characters".into(),
            OptionKind::Path => "a path".into(),
            OptionKind::Bool => "true or false".into(),
            OptionKind::Integer => "a whole number".into(),
            OptionKind::Choice(c) => format!("one of {}", c.join(", ")),
            OptionKind::EnvName => "a variable name ([A-Za-z_][A-Za-z0-9_]*)".into(),
        }
    }

    fn accepts(self, value: &str) -> bool {
        match self {
            OptionKind::Text => !value.is_empty() && !value.chars().any(char::is_control),
            OptionKind::Path => !value.is_empty() && !value.contains('\0'),
            OptionKind::Bool => value == "true" || value == "false",
            OptionKind::Integer => !value.is_empty() && value.parse::<u64>().is_ok(),
            OptionKind::Choice(c) => c.contains(&value),
            OptionKind::EnvName => valid_env_name(value),
        }
    }
}

/// Whether `name` is a portable environment variable name.
pub fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256
}

/// A backend-specific check of one value; `Err` says what is expected.
pub type Validator = fn(&str) -> Result<(), &'static str>;

/// One option a backend understands.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct OptionSpec {
    /// Key in `--backend-option KEY=VALUE` and the policy's `runtime.options` (lowercase, `-`).
    pub name: &'static str,
    #[serde(flatten)]
    pub kind: OptionKind,
    pub help: &'static str,
    /// The value used when the option is not given, as shown in help.
    pub default: Option<&'static str>,
    /// Whether the option may be given more than once.
    pub repeatable: bool,
    /// A command-line flag of `agentdiff run` that sets this option (`--FLAG VALUE`, or `--FLAG`
    /// alone for a [`OptionKind::Bool`]). Kept for flags users already rely on; new options
    /// should use `--backend-option`.
    pub flag: Option<&'static str>,
    /// The option sends the project off this host (a remote engine): honoured only when the
    /// command line gives it (`--backend-option` or the flag), never from a project's policy
    /// file alone, which a cloned repository may carry.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub command_line_only: bool,
    #[serde(skip)]
    pub validate: Option<Validator>,
}

impl OptionSpec {
    pub const fn new(name: &'static str, kind: OptionKind, help: &'static str) -> Self {
        Self {
            name,
            kind,
            help,
            default: None,
            repeatable: false,
            flag: None,
            command_line_only: false,
            validate: None,
        }
    }

    /// See [`OptionSpec::command_line_only`].
    pub const fn command_line_only(mut self) -> Self {
        self.command_line_only = true;
        self
    }

    pub const fn default_value(mut self, value: &'static str) -> Self {
        self.default = Some(value);
        self
    }

    pub const fn repeatable(mut self) -> Self {
        self.repeatable = true;
        self
    }

    pub const fn flag(mut self, flag: &'static str) -> Self {
        self.flag = Some(flag);
        self
    }

    pub const fn validate(mut self, check: Validator) -> Self {
        self.validate = Some(check);
        self
    }

    /// What a valid value looks like, when `value` is not one (type first, then the backend's
    /// own validator).
    pub fn rejects(&self, value: &str) -> Option<String> {
        if !self.kind.accepts(value) {
            return Some(self.kind.expected());
        }
        self.validate
            .and_then(|check| check(value).err())
            .map(str::to_string)
    }
}

/// Why a set of options does not fit a backend's declaration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionError {
    #[error("runtime backend `{backend}` has no option `{key}`; its options: {known}")]
    Unknown {
        backend: String,
        key: String,
        known: String,
    },
    #[error(
        "option `{key}` of runtime backend `{backend}` was given more than once; give it once"
    )]
    Repeated { backend: String, key: String },
    #[error("invalid value {value:?} for option `{key}` of runtime backend `{backend}`: expected {expected}")]
    Invalid {
        backend: String,
        key: String,
        value: String,
        expected: String,
    },
}

/// Check `options` against `specs`: every key declared, non-repeatable keys once, every value
/// valid. Backends call this from `prepare` with their own declaration.
pub fn validate_options(
    backend: &str,
    specs: &[OptionSpec],
    options: &BackendOptions,
) -> Result<(), OptionError> {
    for key in options.keys() {
        let Some(spec) = specs.iter().find(|s| s.name == key) else {
            let known: Vec<&str> = specs.iter().map(|s| s.name).collect();
            return Err(OptionError::Unknown {
                backend: backend.into(),
                key: key.into(),
                known: if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                },
            });
        };
        let values = options.get_all(key);
        if values.len() > 1 && !spec.repeatable {
            return Err(OptionError::Repeated {
                backend: backend.into(),
                key: key.into(),
            });
        }
        for value in values {
            if let Some(expected) = spec.rejects(value) {
                return Err(OptionError::Invalid {
                    backend: backend.into(),
                    key: key.into(),
                    value: value.clone(),
                    expected,
                });
            }
        }
    }
    Ok(())
}

/// A configuration under which the backend's wrapper or engine is missing or unusable: the
/// conformance suite (`FAIL-001`) launches a marker command with it and requires that the launch
/// fails closed. Applied on top of the options the suite runs with: `remove` first, then `set`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct FailClosedSpec {
    pub name: &'static str,
    pub remove: &'static [&'static str],
    pub set: &'static [(&'static str, &'static str)],
}

impl FailClosedSpec {
    /// `base` with this case's changes.
    pub fn apply(&self, base: &BackendOptions) -> BackendOptions {
        let mut out = BackendOptions::new();
        for key in base
            .keys()
            .filter(|k| !self.remove.contains(k) && !self.set.iter().any(|(s, _)| s == k))
        {
            for value in base.get_all(key) {
                out.push(key, value.clone());
            }
        }
        for (key, value) in self.set {
            out.push(*key, *value);
        }
        out
    }
}

/// One fact a backend adds to `agentdiff doctor`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DiagnosticFact {
    /// Lowercase `snake_case` name, shown as `name: value`.
    pub name: String,
    pub value: serde_json::Value,
}

/// What a backend's diagnostics hook reports for `agentdiff doctor`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Diagnostics {
    /// Short facts, shown in the summary and as top-level fields of the JSON entry.
    pub facts: Vec<DiagnosticFact>,
    /// The backend's full report (JSON `details`).
    pub details: serde_json::Value,
}

/// The diagnostics future a hook returns.
pub type DiagnosticsFuture = Pin<Box<dyn Future<Output = Diagnostics> + Send>>;
/// The diagnostics hook: called by `agentdiff doctor` with the options it was given.
pub type DiagnosticsHook = fn(BackendOptions) -> DiagnosticsFuture;

/// A registered backend: id, one-line summary, a constructor, and everything the CLI needs to
/// know about it.
pub struct BackendDescriptor {
    pub id: &'static str,
    pub summary: &'static str,
    pub factory: fn() -> Box<dyn DynRuntimeBackend>,
    pub options: &'static [OptionSpec],
    pub fail_closed: &'static [FailClosedSpec],
    pub diagnostics: Option<DiagnosticsHook>,
    /// The backend `agentdiff run` uses when neither `--runtime` nor the policy names one. At
    /// most one registered backend may say so.
    pub is_default: bool,
}

impl BackendDescriptor {
    pub const fn new(
        id: &'static str,
        summary: &'static str,
        factory: fn() -> Box<dyn DynRuntimeBackend>,
    ) -> Self {
        Self {
            id,
            summary,
            factory,
            options: &[],
            fail_closed: &[],
            diagnostics: None,
            is_default: false,
        }
    }

    pub const fn default_backend(mut self) -> Self {
        self.is_default = true;
        self
    }

    pub const fn with_options(mut self, options: &'static [OptionSpec]) -> Self {
        self.options = options;
        self
    }

    pub const fn with_fail_closed(mut self, cases: &'static [FailClosedSpec]) -> Self {
        self.fail_closed = cases;
        self
    }

    pub const fn with_diagnostics(mut self, hook: DiagnosticsHook) -> Self {
        self.diagnostics = Some(hook);
        self
    }

    /// The declared option named `name`.
    pub fn option(&self, name: &str) -> Option<&'static OptionSpec> {
        self.options.iter().find(|o| o.name == name)
    }

    /// The declared option a command-line flag alias sets.
    pub fn option_for_flag(&self, flag: &str) -> Option<&'static OptionSpec> {
        self.options.iter().find(|o| o.flag == Some(flag))
    }

    /// Check options against this backend's declaration.
    pub fn validate_options(&self, options: &BackendOptions) -> Result<(), OptionError> {
        validate_options(self.id, self.options, options)
    }
}

impl std::fmt::Debug for BackendDescriptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendDescriptor")
            .field("id", &self.id)
            .field("summary", &self.summary)
            .field("options", &self.options)
            .field("fail_closed", &self.fail_closed)
            .field("diagnostics", &self.diagnostics.is_some())
            .finish()
    }
}

/// Whether `id` is a valid backend id: 1 to 64 lowercase ASCII letters, digits and `-`, not
/// starting with `-` (it becomes `--runtime ID` and part of the executable name
/// `agentdiff-backend-ID`).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !id.starts_with('-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECS: &[OptionSpec] = &[
        OptionSpec::new("mode", OptionKind::Choice(&["a", "b"]), "mode").default_value("a"),
        OptionSpec::new("env", OptionKind::EnvName, "pass").repeatable(),
        OptionSpec::new("limit", OptionKind::Integer, "limit").validate(|v| {
            if v == "0" {
                Err("a number above 0")
            } else {
                Ok(())
            }
        }),
    ];

    fn opts(pairs: &[(&str, &str)]) -> BackendOptions {
        let mut o = BackendOptions::new();
        for (k, v) in pairs {
            o.push(*k, *v);
        }
        o
    }

    #[test]
    fn validation_follows_the_declaration() {
        assert!(validate_options(
            "x",
            SPECS,
            &opts(&[("mode", "b"), ("env", "A"), ("env", "B")])
        )
        .is_ok());
        assert!(matches!(
            validate_options("x", SPECS, &opts(&[("image", "i")])),
            Err(OptionError::Unknown { .. })
        ));
        assert!(matches!(
            validate_options("x", SPECS, &opts(&[("mode", "a"), ("mode", "b")])),
            Err(OptionError::Repeated { .. })
        ));
        for (k, v) in [
            ("mode", "c"),
            ("env", "A=B"),
            ("limit", "x"),
            ("limit", "0"),
            ("limit", "-1"),
        ] {
            assert!(
                matches!(
                    validate_options("x", SPECS, &opts(&[(k, v)])),
                    Err(OptionError::Invalid { .. })
                ),
                "{k}={v}"
            );
        }
        assert!(matches!(
            validate_options("x", &[], &opts(&[("any", "v")])),
            Err(OptionError::Unknown { known, .. }) if known == "none"
        ));
    }

    #[test]
    fn fail_closed_cases_replace_and_remove_keys() {
        let case = FailClosedSpec {
            name: "missing",
            remove: &["rootfs"],
            set: &[("image", "gone")],
        };
        let out = case.apply(&opts(&[
            ("image", "x"),
            ("rootfs", "/r"),
            ("engine", "podman"),
        ]));
        assert_eq!(out.get_all("image"), ["gone".to_string()]);
        assert!(!out.is_set("rootfs"));
        assert_eq!(out.get("engine"), Some("podman"));
    }
}

// Built-in backends submit their descriptor with `inventory::submit!`; the registry (crate
// agentdiff-plugins) collects them. `inventory` wants the collection declared beside the type.
// Behind the `in-process` feature: an external backend links no registration machinery.
#[cfg(feature = "in-process")]
inventory::collect!(BackendDescriptor);
