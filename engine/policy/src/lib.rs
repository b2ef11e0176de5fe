//! Deterministic mutation policy: a strict versioned schema, segment-aware globs with fixed
//! precedence (deny > review > allow > default) and full provenance on every decision.
//!
//! ```text
//! load(root, --policy) ─▶ text ─▶ node (bounded tree) ─▶ schema::check ─▶ Spec ─▶ compile ─▶ Policy
//! Policy::decide_path / decide_command ─▶ Decision { action, rule, pattern, reason, … }
//! hook::evaluate (agent tool call) ─▶ path / tool decisions ─▶ strictest
//! ```
//! The user-facing reference is docs/policy.md.

mod builtin;
mod decide;
pub mod egress;
mod error;
pub mod glob;
pub mod hook;
mod load;
mod nesting;
mod node;
mod path;
mod schema;
pub mod score;

use std::ffi::OsStr;
use std::sync::Arc;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub use builtin::{never_ignored, BUILTIN_DENY, PROTECTED_CONFIG_RULE, STARTER};
pub use decide::{Action, Decision, Phase};
pub use egress::{Egress, EgressDecision, OnDenied};
pub use error::PolicyError;
pub use load::{load, load_file, LoadedPolicy, PolicySource, MAX_POLICY_BYTES, POLICY_FILE_NAME};
pub use path::{normalize_path, PathProblem};
pub use schema::{
    BwrapHome, BwrapSettings, CaptureSettings, EnvMode, EnvironmentSettings, Limits, NetworkMode,
    ObserveSettings, RollbackSettings, RuntimeSettings, Weights, SUPPORTED_VERSIONS, WEIGHT_NAMES,
};

use decide::Rules;
use glob::RuleSet;

/// A compiled, immutable policy. Cloning is cheap (the compiled globs are shared).
#[derive(Debug, Clone)]
pub struct Policy {
    inner: Arc<Inner>,
    /// Project-relative paths the policy was loaded from (protected like `agentdiff.yaml`).
    loaded_from: Arc<Vec<String>>,
}

#[derive(Debug, Clone)]
struct Inner {
    version: u32,
    filesystem: Rules,
    /// `filesystem.deny_read`, for the pre-tool-use hook.
    deny_read: hook::DenyRead,
    process: Rules,
    network_mode: NetworkMode,
    egress: Egress,
    limits: Limits,
    rollback: RollbackSettings,
    capture: CaptureSettings,
    weights: Weights,
    environment: EnvironmentSettings,
    runtime: RuntimeSettings,
    observe: ObserveSettings,
}

impl Policy {
    /// The built-in policy: deny `.env`, `.env.*`, `.git/**`, `**/.git/**`, `.ssh/**`, `**/*.key`,
    /// `**/*.pem`;
    /// review every other write; allow command launch.
    pub fn builtin() -> Policy {
        match Policy::compile(builtin::spec(), "built-in policy") {
            Ok(policy) => policy,
            // The built-in patterns are constants covered by tests; an empty rule set is the
            // only possible fallback and is stricter than nothing (default review).
            Err(_) => Policy::empty_review(),
        }
    }

    fn empty_review() -> Policy {
        let empty = |section| RuleSet::empty(section);
        let rules = |kind, allow, review, deny| Rules {
            kind,
            deny: empty(deny),
            review: empty(review),
            allow: empty(allow),
            default: Action::Review,
        };
        Policy {
            loaded_from: Arc::default(),
            inner: Arc::new(Inner {
                version: 1,
                filesystem: rules(
                    "filesystem",
                    "filesystem.allow_write",
                    "filesystem.review",
                    "filesystem.deny",
                ),
                deny_read: hook::DenyRead::empty(),
                process: rules("process", "process.allow", "process.review", "process.deny"),
                network_mode: NetworkMode::Observe,
                egress: Egress::default(),
                limits: Limits::default(),
                rollback: RollbackSettings::default(),
                capture: CaptureSettings::default(),
                weights: Weights::default(),
                environment: EnvironmentSettings::default(),
                runtime: RuntimeSettings::default(),
                observe: ObserveSettings::default(),
            }),
        }
    }

    /// Parse and check a YAML or JSON policy document. `origin` names it in error messages
    /// (a path, or e.g. `<stdin>`); an origin ending in `.json` is read as JSON only.
    pub fn from_yaml_or_json(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        let spec = load::parse(text, origin)?;
        Policy::compile(spec, origin)
    }

    fn compile(spec: schema::Spec, origin: &str) -> Result<Policy, PolicyError> {
        let mut problems = Vec::new();
        let mut compile = |section: &'static str, patterns: Vec<String>, dirs: bool| {
            RuleSet::compile(section, patterns, dirs).unwrap_or_else(|mut p| {
                problems.append(&mut p);
                RuleSet::empty(section)
            })
        };
        let fs = spec.filesystem;
        let filesystem = Rules {
            kind: "filesystem",
            deny: compile("filesystem.deny", fs.deny, true),
            review: compile("filesystem.review", fs.review, true),
            allow: compile("filesystem.allow_write", fs.allow, true),
            default: fs.default,
        };
        let pr = spec.process;
        let process = Rules {
            kind: "process",
            deny: compile("process.deny", pr.deny, false),
            review: compile("process.review", pr.review, false),
            allow: compile("process.allow", pr.allow, false),
            default: pr.default,
        };
        // Observe patterns are handed to the scanner; compile them here so a bad glob is a
        // policy error, not a scan-time surprise.
        let _ = compile("observe.include", spec.observe.include.clone(), true);
        let deny_read = hook::DenyRead::compile(
            spec.deny_read
                .unwrap_or_else(hook::DenyRead::default_patterns),
        )
        .unwrap_or_else(|mut p| {
            problems.append(&mut p);
            hook::DenyRead::empty()
        });
        let egress = Egress::compile(&spec.egress).unwrap_or_else(|mut p| {
            problems.append(&mut p);
            Egress::default()
        });
        if !problems.is_empty() {
            return Err(PolicyError::Invalid {
                origin: origin.to_owned(),
                problems,
            });
        }
        Ok(Policy {
            loaded_from: Arc::default(),
            inner: Arc::new(Inner {
                version: spec.version,
                filesystem,
                deny_read,
                process,
                network_mode: spec.network_mode,
                egress,
                limits: spec.limits,
                rollback: spec.rollback,
                capture: spec.capture,
                weights: spec.weights,
                environment: spec.environment,
                runtime: spec.runtime,
                observe: spec.observe,
            }),
        })
    }

    /// Decide a write/delete of a project-relative path. The path is normalised first
    /// ([`normalize_path`]); an invalid path is an error, never a decision.
    ///
    /// agentdiff's own configuration (`agentdiff.yaml`, `.agentdiffignore` at any depth, the file
    /// the policy was loaded from) is denied first, by the built-in rule
    /// `builtin.protected_config`.
    pub fn decide_path(&self, rel_path: &str, phase: Phase) -> Result<Decision, PolicyError> {
        let unified = normalize_path(rel_path)?;
        let decision = self.decide_normalized(unified, phase);
        // Normalising reads `\` as a separator (paths an agent proposes may be Windows-style),
        // but on POSIX it is part of a name: `secrets/a\b.pem` is a file in `secrets/` and must
        // meet `secrets/*.pem` too. Both readings are decided and the stricter one counts. The
        // literal reading is valid whenever the unified one is (its segments are joins of them).
        if !rel_path.contains('\\') {
            return Ok(decision);
        }
        let literal = self.decide_normalized(rel_path.to_owned(), phase);
        Ok(if literal.action > decision.action {
            literal
        } else {
            decision
        })
    }

    fn decide_normalized(&self, subject: String, phase: Phase) -> Decision {
        if let Some(d) =
            builtin::protected_config(&subject, &self.loaded_from, self.inner.version, phase)
        {
            return d;
        }
        self.inner
            .filesystem
            .decide(subject, self.inner.version, phase)
    }

    /// Decide the launch of a command by the executable basename of `argv[0]` (never a shell
    /// string). An empty basename is denied: there is nothing to launch.
    pub fn decide_command(&self, argv0: &OsStr) -> Decision {
        let subject = path::executable_basename(argv0);
        if subject.is_empty() {
            return Decision {
                action: Action::Deny,
                subject,
                rule: "process.invalid".to_owned(),
                pattern: None,
                reason: format!(
                    "argv[0] {:?} has no executable name",
                    argv0.to_string_lossy()
                ),
                policy_version: self.inner.version,
                phase: Phase::Command,
            };
        }
        self.inner
            .process
            .decide(subject, self.inner.version, Phase::Command)
    }

    /// Records that the policy was loaded from `rel_path` below the project root, so a change to
    /// that file is protected configuration.
    pub fn protect_source(&mut self, rel_path: &str) {
        if let Ok(p) = normalize_path(rel_path) {
            Arc::make_mut(&mut self.loaded_from).push(p);
        }
    }

    pub fn version(&self) -> u32 {
        self.inner.version
    }

    pub fn limits(&self) -> &Limits {
        &self.inner.limits
    }

    pub fn rollback(&self) -> &RollbackSettings {
        &self.inner.rollback
    }

    pub fn capture(&self) -> &CaptureSettings {
        &self.inner.capture
    }

    pub fn network_mode(&self) -> NetworkMode {
        self.inner.network_mode
    }

    /// `network.egress` with the hosts `--allow-host` added (empty when the policy has none).
    pub fn egress(&self) -> &Egress {
        &self.inner.egress
    }

    /// Decide a connection to `host:port` (see [`Egress::decide`]).
    pub fn decide_host(&self, host: &str, port: u16) -> EgressDecision {
        self.inner.egress.decide(host, port)
    }

    /// What a run decides for `host:port` without resolving (see [`Egress::explain`]).
    pub fn explain_host(&self, host: &str, port: u16) -> EgressDecision {
        self.inner.egress.explain(host, port)
    }

    /// This policy with host patterns from `agentdiff run --allow-host` added to
    /// `network.egress` (recorded in the effective policy). `network.egress` is a version-2
    /// key, so a version-1 policy given hosts becomes the equivalent version-2 document (version
    /// 2 keeps every version-1 key's meaning). A bad pattern is an error naming it.
    pub fn with_allowed_hosts(mut self, hosts: &[String]) -> Result<Policy, PolicyError> {
        if hosts.is_empty() {
            return Ok(self);
        }
        let inner = Arc::make_mut(&mut self.inner);
        inner
            .egress
            .add_command_hosts(hosts)
            .map_err(|problems| PolicyError::Invalid {
                origin: "--allow-host".to_owned(),
                problems,
            })?;
        inner.version = inner.version.max(2);
        Ok(self)
    }

    pub fn weights(&self) -> &Weights {
        &self.inner.weights
    }

    /// The filesystem deny globs, so the scanner can re-include default-excluded directories
    /// (such as `.git`) that a deny pattern names.
    pub fn deny_patterns(&self) -> Vec<String> {
        self.inner.filesystem.deny.patterns().to_vec()
    }

    /// `filesystem.deny_read` (its default when the policy does not set it).
    pub fn deny_read(&self) -> &hook::DenyRead {
        &self.inner.deny_read
    }

    /// Globs the scanner must always observe, whatever `.agentdiffignore` says: the deny patterns
    /// and agentdiff's own configuration (the policy files and ignore files at any depth, and the
    /// file this policy was loaded from).
    pub fn always_observed(&self) -> Vec<String> {
        let mut globs = self.deny_patterns();
        globs.extend(builtin::protected_globs());
        globs.extend(self.loaded_from.iter().cloned());
        globs
    }

    /// Environment handling (version 2; version 1 policies inherit the environment).
    pub fn environment(&self) -> &EnvironmentSettings {
        &self.inner.environment
    }

    /// Preferred runtime backend and its options (version 2; empty for version 1).
    pub fn runtime(&self) -> &RuntimeSettings {
        &self.inner.runtime
    }

    /// Extra observed path patterns (version 2; empty for version 1).
    pub fn observe(&self) -> &ObserveSettings {
        &self.inner.observe
    }

    /// The normalised effective policy with every default filled in. It is itself a valid
    /// policy document of the same version that loads to an equivalent policy.
    pub fn to_json(&self) -> Value {
        let i = &*self.inner;
        let section = |rules: &Rules, allow_key: &str| {
            json!({
                allow_key: rules.allow.patterns(),
                "review": rules.review.patterns(),
                "deny": rules.deny.patterns(),
                "default": rules.default,
            })
        };
        let mut filesystem = section(&i.filesystem, "allow_write");
        if let Value::Object(map) = &mut filesystem {
            map.insert("deny_read".to_owned(), json!(i.deny_read.patterns()));
        }
        let mut network = json!({ "mode": i.network_mode });
        // Only when set, so the effective document (and digest) of other policies is unchanged.
        if !i.egress.is_empty() {
            if let Value::Object(map) = &mut network {
                let egress = json!({
                    "allow": i.egress.allow_patterns(),
                    "deny": i.egress.deny_patterns(),
                    "presets": i.egress.presets(),
                    "on_denied": i.egress.on_denied().as_str(),
                });
                map.insert("egress".to_owned(), egress);
            }
        }
        let mut doc = json!({
            "version": i.version,
            "filesystem": filesystem,
            "process": section(&i.process, "allow"),
            "network": network,
            "limits": i.limits,
            "rollback": i.rollback,
            "scoring": { "weights": i.weights },
        });
        // Only when set, so the effective document (and digest) of other policies is unchanged.
        if !i.capture.is_default() {
            if let Value::Object(map) = &mut doc {
                map.insert("capture".to_owned(), json!(i.capture));
            }
        }
        if i.version >= 2 {
            if let Value::Object(map) = &mut doc {
                map.insert("environment".to_owned(), json!(i.environment));
                map.insert("runtime".to_owned(), json!(i.runtime));
                map.insert("observe".to_owned(), json!(i.observe));
            }
        }
        doc
    }

    /// SHA-256 (hex) of the canonical JSON of [`Policy::to_json`]: identifies the effective
    /// policy independently of formatting and comments (used for the built-in policy).
    pub fn effective_sha256(&self) -> String {
        let bytes = serde_json::to_vec(&self.to_json()).unwrap_or_default();
        hex::encode(Sha256::digest(bytes))
    }
}

#[cfg(test)]
mod tests;
