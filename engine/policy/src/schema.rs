//! The strict policy schema: typed settings and the check that turns a document tree into them.
//!
//! Version 1 is exactly the schema users were promised (filesystem, process, network, limits,
//! rollback, scoring). Version 2 keeps all of it with the same meaning and adds `environment`,
//! `runtime` and `observe`. Every problem is reported with its full key path; all problems of a
//! document are reported at once so one CI run shows everything to fix.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::decide::Action;
use super::egress::{self, EgressSpec, HostPattern};
use super::node::Node;
use super::path::{check_pattern, check_process_pattern};

/// The schema versions this engine reads.
pub const SUPPORTED_VERSIONS: [u32; 2] = [1, 2];

/// Evidence limits. `None` means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_changed: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files_deleted: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_spawned: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u64>,
}

/// Rollback capture settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollbackSettings {
    /// Whether capture stores recoverable before-state.
    pub enabled: bool,
    /// Largest file (in MiB) that is backed up.
    pub max_backup_file_mb: u64,
}

impl Default for RollbackSettings {
    fn default() -> Self {
        RollbackSettings {
            enabled: true,
            max_backup_file_mb: 10,
        }
    }
}

/// How the before-state is captured (`capture:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSettings {
    /// Refuse to launch when a backup rollback needs could not be written (a full disk): the run
    /// would otherwise change files it cannot restore.
    pub require_backups: bool,
    /// Reuse a recorded hash when a file's (device, inode, size, mtime, ctime, mode, links) are
    /// unchanged since a verified earlier scan (the stat cache, docs/capsule-format.md). `false`
    /// reads and hashes every file in every scan.
    pub trust_stat: bool,
}

impl Default for CaptureSettings {
    fn default() -> Self {
        CaptureSettings {
            require_backups: false,
            trust_stat: true,
        }
    }
}

impl CaptureSettings {
    /// Whether the settings differ from the defaults (the effective policy shows them only then).
    pub fn is_default(&self) -> bool {
        *self == CaptureSettings::default()
    }
}

/// Network observation. Neither mode blocks network access.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Compare machine-wide listening endpoints before and after.
    #[default]
    Observe,
    /// Do not collect that observation.
    Off,
}

impl NetworkMode {
    pub fn as_str(self) -> &'static str {
        match self {
            NetworkMode::Observe => "observe",
            NetworkMode::Off => "off",
        }
    }
}

/// Blast-radius scoring weights. A policy overrides individual weights; the rest keep defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Weights {
    pub review_created: u64,
    pub review_modified: u64,
    pub review_deleted: u64,
    pub denied_mutation: u64,
    pub denied_deletion: u64,
    pub sensitive_path: u64,
    pub dependency_change: u64,
    pub mode_change: u64,
    pub orphan_process: u64,
    pub opened_port: u64,
    pub budget_violation: u64,
    pub scope_drift: u64,
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            review_created: 8,
            review_modified: 4,
            review_deleted: 12,
            denied_mutation: 30,
            denied_deletion: 40,
            sensitive_path: 35,
            dependency_change: 8,
            mode_change: 8,
            orphan_process: 10,
            opened_port: 5,
            budget_violation: 12,
            scope_drift: 2,
        }
    }
}

/// The weight names a policy may set, in documentation order.
pub const WEIGHT_NAMES: [&str; 12] = [
    "review_created",
    "review_modified",
    "review_deleted",
    "denied_mutation",
    "denied_deletion",
    "sensitive_path",
    "dependency_change",
    "mode_change",
    "orphan_process",
    "opened_port",
    "budget_violation",
    "scope_drift",
];

impl Weights {
    /// The weight with this name, if it is one of [`WEIGHT_NAMES`].
    pub fn get(&self, name: &str) -> Option<u64> {
        self.slot(name).copied()
    }

    fn slot(&self, name: &str) -> Option<&u64> {
        Some(match name {
            "review_created" => &self.review_created,
            "review_modified" => &self.review_modified,
            "review_deleted" => &self.review_deleted,
            "denied_mutation" => &self.denied_mutation,
            "denied_deletion" => &self.denied_deletion,
            "sensitive_path" => &self.sensitive_path,
            "dependency_change" => &self.dependency_change,
            "mode_change" => &self.mode_change,
            "orphan_process" => &self.orphan_process,
            "opened_port" => &self.opened_port,
            "budget_violation" => &self.budget_violation,
            "scope_drift" => &self.scope_drift,
            _ => return None,
        })
    }

    fn slot_mut(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "review_created" => &mut self.review_created,
            "review_modified" => &mut self.review_modified,
            "review_deleted" => &mut self.review_deleted,
            "denied_mutation" => &mut self.denied_mutation,
            "denied_deletion" => &mut self.denied_deletion,
            "sensitive_path" => &mut self.sensitive_path,
            "dependency_change" => &mut self.dependency_change,
            "mode_change" => &mut self.mode_change,
            "orphan_process" => &mut self.orphan_process,
            "opened_port" => &mut self.opened_port,
            "budget_violation" => &mut self.budget_violation,
            "scope_drift" => &mut self.scope_drift,
            _ => return None,
        })
    }
}

/// How the launched command's environment is built (version 2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EnvMode {
    /// Pass the caller's environment through (version 1 behaviour).
    #[default]
    Inherit,
    /// Keep only a minimal safe set plus the names in `pass`.
    Scrub,
}

/// `environment` section (version 2).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvironmentSettings {
    pub mode: EnvMode,
    /// Extra variable names kept when scrubbing.
    #[serde(default)]
    pub pass: Vec<String>,
}

/// `runtime` section (version 2): a preferred backend and generic backend options.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// Option name → values (a scalar in the file becomes a one-element list).
    #[serde(default)]
    pub options: BTreeMap<String, Vec<String>>,
    /// `runtime.bwrap`: handed only to the bwrap backend (see [`RuntimeSettings::section_options`]),
    /// so another backend never sees (and rejects) its keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwrap: Option<BwrapSettings>,
}

/// `runtime.bwrap` (version 2): extra hidden paths, extra writable paths, the network mode.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BwrapSettings {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable: Vec<String>,
    /// `none`, `filtered` or `host` (the backend's default: `filtered` when `network.egress`
    /// allows a host, else `none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// `runtime.bwrap.home`: how the home directories are shown to the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub home: Option<BwrapHome>,
    /// `hide` (the default) or `allow`: the host daemons' sockets below `/run`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_sockets: Option<String>,
}

/// `runtime.bwrap.home`: `mode` (`allowlist`, the default: the home is hidden except the listed
/// entries; `denylist`: the home is readable except the credential list), and `~/` paths added
/// to the allowlist read-only (`read`) or writable (`write`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BwrapHome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
    /// `hide` (the default) or `allow`: the runtime directory and agent sockets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sockets: Option<String>,
}

impl RuntimeSettings {
    /// The options a per-backend section gives the backend `id` (option name → values); empty
    /// for a backend without a section.
    pub fn section_options(&self, id: &str) -> BTreeMap<String, Vec<String>> {
        let mut out = BTreeMap::new();
        if let (Some(b), "bwrap") = (&self.bwrap, id) {
            if !b.hide.is_empty() {
                out.insert("hide".to_string(), b.hide.clone());
            }
            if !b.writable.is_empty() {
                out.insert("writable".to_string(), b.writable.clone());
            }
            if let Some(n) = &b.network {
                out.insert("network".to_string(), vec![n.clone()]);
            }
            if let Some(h) = &b.host_sockets {
                out.insert("host-sockets".to_string(), vec![h.clone()]);
            }
            if let Some(h) = &b.home {
                if let Some(m) = &h.mode {
                    out.insert("home".to_string(), vec![m.clone()]);
                }
                if !h.read.is_empty() {
                    out.insert("home-read".to_string(), h.read.clone());
                }
                if !h.write.is_empty() {
                    out.insert("home-write".to_string(), h.write.clone());
                }
                if let Some(s) = &h.sockets {
                    out.insert("home-sockets".to_string(), vec![s.clone()]);
                }
            }
        }
        out
    }
}

/// Keys of `runtime.bwrap`: extra hidden paths, extra writable paths, and the network mode.
const BWRAP_KEYS: [&str; 5] = ["hide", "writable", "network", "home", "host_sockets"];
const BWRAP_HOME_KEYS: [&str; 4] = ["mode", "read", "write", "sockets"];

/// `observe` section (version 2): extra paths the scanner observes even where they are excluded
/// by default (e.g. `node_modules/**`), so that they can be decided and scored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObserveSettings {
    #[serde(default)]
    pub include: Vec<String>,
}

/// Patterns and default of one subject kind, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SectionSpec {
    pub(crate) allow: Vec<String>,
    pub(crate) review: Vec<String>,
    pub(crate) deny: Vec<String>,
    pub(crate) default: Action,
}

/// A checked document, before glob compilation.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) version: u32,
    pub(crate) filesystem: SectionSpec,
    pub(crate) process: SectionSpec,
    pub(crate) network_mode: NetworkMode,
    /// `network.egress` (version 2); empty when absent.
    pub(crate) egress: EgressSpec,
    pub(crate) limits: Limits,
    pub(crate) rollback: RollbackSettings,
    pub(crate) capture: CaptureSettings,
    pub(crate) weights: Weights,
    pub(crate) environment: EnvironmentSettings,
    pub(crate) runtime: RuntimeSettings,
    pub(crate) observe: ObserveSettings,
    /// `filesystem.deny_read` as written; `None` when absent (the default list applies).
    pub(crate) deny_read: Option<Vec<String>>,
}

const ROOT_KEYS_V1: [&str; 8] = [
    "version",
    "filesystem",
    "process",
    "network",
    "limits",
    "rollback",
    "capture",
    "scoring",
];
const ROOT_KEYS_V2: [&str; 3] = ["environment", "runtime", "observe"];
/// Most problems reported for one document; the rest are summarised.
const MAX_PROBLEMS: usize = 50;

/// Check a document tree against the schema.
pub(crate) fn check(root: &Node) -> Result<Spec, Vec<String>> {
    let mut c = Checker::default();
    let spec = c.root(root);
    match spec {
        Some(spec) if c.problems.is_empty() => Ok(spec),
        _ => {
            if c.problems.is_empty() {
                c.problems
                    .push("the document is not a valid policy".to_owned());
            }
            if c.problems.len() > MAX_PROBLEMS {
                let more = c.problems.len() - MAX_PROBLEMS;
                c.problems.truncate(MAX_PROBLEMS);
                c.problems.push(format!("… and {more} more problems"));
            }
            Err(c.problems)
        }
    }
}

#[derive(Default)]
struct Checker {
    problems: Vec<String>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

impl Checker {
    fn problem(&mut self, message: String) {
        self.problems.push(message);
    }

    /// The entries of a mapping, after rejecting keys not in `allowed`.
    fn mapping<'n>(
        &mut self,
        node: &'n Node,
        path: &str,
        allowed: &[&str],
    ) -> Option<&'n [(String, Node)]> {
        match node {
            Node::Map(entries) => {
                for (key, _) in entries {
                    if !allowed.contains(&key.as_str()) {
                        self.problem(format!("unknown policy key: {}", join(path, key)));
                    }
                }
                Some(entries)
            }
            other => {
                self.problem(format!("{path} must be a mapping (got {})", other.kind()));
                None
            }
        }
    }

    fn uint(&mut self, node: &Node, path: &str) -> Option<u64> {
        match node {
            Node::Int(i) => match u64::try_from(*i) {
                Ok(v) => Some(v),
                Err(_) if *i > 0 => {
                    self.problem(out_of_range(path, &i.to_string()));
                    None
                }
                Err(_) => {
                    self.problem(format!("{path} must be a non-negative integer (got {i})"));
                    None
                }
            },
            // An integer too long for the parser's integers arrives as a float: the same "too
            // large", not "got a decimal number".
            Node::Float(f) if f.is_finite() && f.fract() == 0.0 && *f > u64::MAX as f64 => {
                self.problem(out_of_range(path, &format!("{f:e}")));
                None
            }
            other => {
                self.problem(format!(
                    "{path} must be a non-negative integer (got {})",
                    other.kind()
                ));
                None
            }
        }
    }

    fn boolean(&mut self, node: &Node, path: &str) -> Option<bool> {
        match node {
            Node::Bool(b) => Some(*b),
            other => {
                self.problem(format!(
                    "{path} must be true or false (got {})",
                    other.kind()
                ));
                None
            }
        }
    }

    fn string(&mut self, node: &Node, path: &str) -> Option<String> {
        match node {
            Node::Str(s) => Some(s.clone()),
            other => {
                self.problem(format!("{path} must be a string (got {})", other.kind()));
                None
            }
        }
    }

    fn string_list(&mut self, node: &Node, path: &str) -> Vec<String> {
        match node {
            Node::Seq(items) => items
                .iter()
                .enumerate()
                .filter_map(|(i, item)| self.string(item, &format!("{path}[{i}]")))
                .collect(),
            other => {
                self.problem(format!(
                    "{path} must be a list of strings (got {}; write `[]` for none)",
                    other.kind()
                ));
                Vec::new()
            }
        }
    }

    fn action(&mut self, node: &Node, path: &str) -> Option<Action> {
        match node {
            Node::Str(s) => match s.as_str() {
                "allow" => Some(Action::Allow),
                "review" => Some(Action::Review),
                "deny" => Some(Action::Deny),
                other => {
                    self.problem(format!(
                        "{path} must be one of allow, review, deny (got {other:?})"
                    ));
                    None
                }
            },
            other => {
                self.problem(format!(
                    "{path} must be one of allow, review, deny (got {})",
                    other.kind()
                ));
                None
            }
        }
    }

    fn root(&mut self, root: &Node) -> Option<Spec> {
        let Node::Map(entries) = root else {
            self.problem(format!(
                "the document root must be a mapping (got {})",
                root.kind()
            ));
            return None;
        };
        let version = match lookup(entries, "version") {
            None => {
                self.problem(
                    "missing required key: version (write `version: 1` at the top)".to_owned(),
                );
                None
            }
            Some(Node::Int(v)) => match u32::try_from(*v) {
                Ok(v) if SUPPORTED_VERSIONS.contains(&v) => Some(v),
                _ => {
                    self.problem(format!(
                        "unsupported policy version {v} (this agentdiff reads versions 1 and 2)"
                    ));
                    None
                }
            },
            Some(other) => {
                self.problem(format!(
                    "version must be the integer 1 or 2 (got {})",
                    other.kind()
                ));
                None
            }
        };
        for (key, _) in entries {
            if ROOT_KEYS_V1.contains(&key.as_str()) {
                continue;
            }
            if ROOT_KEYS_V2.contains(&key.as_str()) {
                if version == Some(1) {
                    self.problem(format!(
                        "policy key `{key}` requires `version: 2` (this document is version 1)"
                    ));
                }
                continue;
            }
            self.problem(format!("unknown policy key: {key}"));
        }

        let filesystem = match lookup(entries, "filesystem") {
            Some(node) => self.section(node, "filesystem", "allow_write", true),
            None => Some(SectionSpec {
                allow: Vec::new(),
                review: Vec::new(),
                deny: Vec::new(),
                default: Action::Review,
            }),
        };
        let process = match lookup(entries, "process") {
            Some(node) => self.section(node, "process", "allow", false),
            None => Some(SectionSpec {
                allow: Vec::new(),
                review: Vec::new(),
                deny: Vec::new(),
                default: Action::Review,
            }),
        };
        let network_mode = lookup(entries, "network")
            .map(|n| self.network(n))
            .unwrap_or(Some(NetworkMode::Observe));
        let egress = lookup(entries, "network")
            .map(|n| self.egress(n, version))
            .unwrap_or_default();
        let limits = lookup(entries, "limits")
            .map(|n| self.limits(n))
            .unwrap_or_default();
        let rollback = lookup(entries, "rollback")
            .map(|n| self.rollback(n))
            .unwrap_or_default();
        let capture = lookup(entries, "capture")
            .map(|n| self.capture(n))
            .unwrap_or_default();
        let weights = lookup(entries, "scoring")
            .map(|n| self.scoring(n))
            .unwrap_or_default();
        let environment = lookup(entries, "environment")
            .map(|n| self.environment(n))
            .unwrap_or_default();
        let runtime = lookup(entries, "runtime")
            .map(|n| self.runtime(n))
            .unwrap_or_default();
        let observe = lookup(entries, "observe")
            .map(|n| self.observe(n))
            .unwrap_or_default();
        let deny_read = lookup(entries, "filesystem").and_then(|n| self.deny_read(n));

        Some(Spec {
            version: version?,
            filesystem: filesystem?,
            process: process?,
            network_mode: network_mode?,
            egress,
            limits,
            rollback,
            capture,
            weights,
            environment,
            runtime,
            observe,
            deny_read,
        })
    }

    fn section(
        &mut self,
        node: &Node,
        path: &str,
        allow_key: &'static str,
        paths: bool,
    ) -> Option<SectionSpec> {
        // `deny_read` is read by [`Checker::deny_read`]; it exists for paths only.
        let keys: &[&str] = if paths {
            &[allow_key, "review", "deny", "default", "deny_read"]
        } else {
            &[allow_key, "review", "deny", "default"]
        };
        let entries = self.mapping(node, path, keys)?;
        let patterns = |key: &str, this: &mut Checker| -> Vec<String> {
            let key_path = join(path, key);
            let Some(list) = lookup(entries, key) else {
                return Vec::new();
            };
            let raw = this.string_list(list, &key_path);
            raw.iter()
                .enumerate()
                .filter_map(|(i, p)| {
                    let checked = if paths {
                        check_pattern(p)
                    } else {
                        check_process_pattern(p)
                    };
                    match checked {
                        Ok(p) => Some(p),
                        Err(reason) => {
                            this.problem(format!("{key_path}[{i}]: {reason}"));
                            None
                        }
                    }
                })
                .collect()
        };
        let allow = patterns(allow_key, self);
        let review = patterns("review", self);
        let deny = patterns("deny", self);
        let default = match lookup(entries, "default") {
            Some(n) => self.action(n, &join(path, "default"))?,
            None => Action::Review,
        };
        Some(SectionSpec {
            allow,
            review,
            deny,
            default,
        })
    }

    /// `filesystem.deny_read`: globs anchored at the project, at `~/` or at `/`.
    fn deny_read(&mut self, filesystem: &Node) -> Option<Vec<String>> {
        let Node::Map(entries) = filesystem else {
            return None;
        };
        let list = lookup(entries, "deny_read")?;
        let raw = self.string_list(list, "filesystem.deny_read");
        let mut patterns = Vec::new();
        for (i, p) in raw.iter().enumerate() {
            match crate::hook::check_read_pattern(p) {
                Ok(p) => patterns.push(p),
                Err(reason) => self.problem(format!("filesystem.deny_read[{i}]: {reason}")),
            }
        }
        Some(patterns)
    }

    fn network(&mut self, node: &Node) -> Option<NetworkMode> {
        let entries = self.mapping(node, "network", &["mode", "egress"])?;
        match lookup(entries, "mode") {
            None => Some(NetworkMode::Observe),
            Some(Node::Str(s)) if s == "observe" => Some(NetworkMode::Observe),
            Some(Node::Str(s)) if s == "off" => Some(NetworkMode::Off),
            Some(Node::Str(s)) => {
                self.problem(format!(
                    "network.mode must be \"observe\" or \"off\" (got {s:?})"
                ));
                None
            }
            Some(Node::Bool(_)) => {
                self.problem(
                    "network.mode must be \"observe\" or \"off\" (got a boolean; a YAML 1.1 \
                     reader turns an unquoted off into false, so write \"off\" in quotes)"
                        .to_owned(),
                );
                None
            }
            Some(other) => {
                self.problem(format!(
                    "network.mode must be \"observe\" or \"off\" (got {})",
                    other.kind()
                ));
                None
            }
        }
    }

    /// `network.egress` (version 2): `allow` and `deny` host patterns, `presets` by name. Each
    /// pattern is kept in its canonical form.
    fn egress(&mut self, network: &Node, version: Option<u32>) -> EgressSpec {
        let mut spec = EgressSpec::default();
        let Node::Map(entries) = network else {
            return spec;
        };
        let Some(node) = lookup(entries, "egress") else {
            return spec;
        };
        if version == Some(1) {
            self.problem(
                "policy key `network.egress` requires `version: 2` (this document is version 1)"
                    .to_owned(),
            );
            return spec;
        }
        let Some(entries) = self.mapping(
            node,
            "network.egress",
            &["allow", "deny", "presets", "on_denied"],
        ) else {
            return spec;
        };
        if let Some(n) = lookup(entries, "on_denied") {
            spec.on_denied = self.on_denied(n);
        }
        for key in ["allow", "deny"] {
            let Some(n) = lookup(entries, key) else {
                continue;
            };
            let path = join("network.egress", key);
            let mut checked = Vec::new();
            for (i, text) in self.string_list(n, &path).iter().enumerate() {
                match HostPattern::parse(text) {
                    Ok(p) => checked.push(p.to_string()),
                    Err(reason) => self.problem(format!("{path}[{i}]: {reason}")),
                }
            }
            if key == "allow" {
                spec.allow = checked;
            } else {
                spec.deny = checked;
            }
        }
        if let Some(n) = lookup(entries, "presets") {
            for (i, name) in self
                .string_list(n, "network.egress.presets")
                .into_iter()
                .enumerate()
            {
                if egress::preset(&name).is_some() {
                    spec.presets.push(name);
                } else {
                    self.problem(format!(
                        "network.egress.presets[{i}]: {name:?} is not a preset (known: {})",
                        egress::PRESETS.map(|(n, _)| n).join(", ")
                    ));
                }
            }
        }
        spec
    }

    /// `network.egress.on_denied`: `review` or `deny` (anything else is a problem; the default
    /// stays).
    fn on_denied(&mut self, node: &Node) -> egress::OnDenied {
        let written = match node {
            Node::Str(text) => egress::OnDenied::parse(text).ok_or(format!("{text:?}")),
            other => Err(other.kind().to_owned()),
        };
        written.unwrap_or_else(|got| {
            self.problem(format!(
                "network.egress.on_denied: {got} is not one of {} (what a refused connection is \
                 in the run's findings: `review`, the default, or `deny` to fail the run under \
                 `--fail-on deny`)",
                egress::OnDenied::NAMES.join(", ")
            ));
            egress::OnDenied::default()
        })
    }

    fn limits(&mut self, node: &Node) -> Limits {
        let mut limits = Limits::default();
        let keys = [
            "files_changed",
            "files_deleted",
            "processes_spawned",
            "duration_seconds",
        ];
        let Some(entries) = self.mapping(node, "limits", &keys) else {
            return limits;
        };
        for (key, value) in entries {
            let path = join("limits", key);
            let slot = match key.as_str() {
                "files_changed" => &mut limits.files_changed,
                "files_deleted" => &mut limits.files_deleted,
                "processes_spawned" => &mut limits.processes_spawned,
                "duration_seconds" => &mut limits.duration_seconds,
                _ => continue,
            };
            *slot = self.uint(value, &path);
        }
        limits
    }

    fn rollback(&mut self, node: &Node) -> RollbackSettings {
        let mut rollback = RollbackSettings::default();
        let Some(entries) = self.mapping(
            node,
            "rollback",
            &["enabled", "max_backup_file_mb", "backup_max_file_mb"],
        ) else {
            return rollback;
        };
        if let Some(n) = lookup(entries, "enabled") {
            if let Some(b) = self.boolean(n, "rollback.enabled") {
                rollback.enabled = b;
            }
        }
        let size = lookup(entries, "max_backup_file_mb");
        let alias = lookup(entries, "backup_max_file_mb");
        match (size, alias) {
            (Some(_), Some(_)) => self.problem(
                "rollback.max_backup_file_mb and rollback.backup_max_file_mb are the same \
                 setting; give only rollback.max_backup_file_mb"
                    .to_owned(),
            ),
            (Some(n), None) => {
                if let Some(v) = self.uint(n, "rollback.max_backup_file_mb") {
                    rollback.max_backup_file_mb = v;
                }
            }
            (None, Some(n)) => {
                if let Some(v) = self.uint(n, "rollback.backup_max_file_mb") {
                    rollback.max_backup_file_mb = v;
                }
            }
            (None, None) => {}
        }
        rollback
    }

    fn capture(&mut self, node: &Node) -> CaptureSettings {
        let mut capture = CaptureSettings::default();
        let Some(entries) = self.mapping(node, "capture", &["require_backups", "trust_stat"])
        else {
            return capture;
        };
        if let Some(n) = lookup(entries, "require_backups") {
            if let Some(b) = self.boolean(n, "capture.require_backups") {
                capture.require_backups = b;
            }
        }
        if let Some(n) = lookup(entries, "trust_stat") {
            if let Some(b) = self.boolean(n, "capture.trust_stat") {
                capture.trust_stat = b;
            }
        }
        capture
    }

    fn scoring(&mut self, node: &Node) -> Weights {
        let mut weights = Weights::default();
        let Some(entries) = self.mapping(node, "scoring", &["weights"]) else {
            return weights;
        };
        let Some(node) = lookup(entries, "weights") else {
            return weights;
        };
        let Some(entries) = self.mapping(node, "scoring.weights", &WEIGHT_NAMES) else {
            return weights;
        };
        for (name, value) in entries {
            let path = join("scoring.weights", name);
            if weights.slot(name).is_none() {
                continue; // already reported as unknown
            }
            if let Some(v) = self.uint(value, &path) {
                if let Some(slot) = weights.slot_mut(name) {
                    *slot = v;
                }
            }
        }
        weights
    }

    fn environment(&mut self, node: &Node) -> EnvironmentSettings {
        let mut env = EnvironmentSettings::default();
        let Some(entries) = self.mapping(node, "environment", &["mode", "pass"]) else {
            return env;
        };
        if let Some(n) = lookup(entries, "mode") {
            match n {
                Node::Str(s) if s == "inherit" => env.mode = EnvMode::Inherit,
                Node::Str(s) if s == "scrub" => env.mode = EnvMode::Scrub,
                Node::Str(s) => self.problem(format!(
                    "environment.mode must be \"inherit\" or \"scrub\" (got {s:?})"
                )),
                other => self.problem(format!(
                    "environment.mode must be \"inherit\" or \"scrub\" (got {})",
                    other.kind()
                )),
            }
        }
        if let Some(n) = lookup(entries, "pass") {
            let names = self.string_list(n, "environment.pass");
            for (i, name) in names.into_iter().enumerate() {
                if is_env_name(&name) {
                    env.pass.push(name);
                } else {
                    self.problem(format!(
                        "environment.pass[{i}]: {name:?} is not a variable name \
                         (letters, digits and `_`, not starting with a digit)"
                    ));
                }
            }
        }
        env
    }

    fn runtime(&mut self, node: &Node) -> RuntimeSettings {
        let mut runtime = RuntimeSettings::default();
        let Some(entries) = self.mapping(node, "runtime", &["backend", "options", "bwrap"]) else {
            return runtime;
        };
        if let Some(n) = lookup(entries, "bwrap") {
            runtime.bwrap = Some(self.bwrap_section(n));
        }
        if let Some(n) = lookup(entries, "backend") {
            if let Some(id) = self.string(n, "runtime.backend") {
                if is_identifier(&id) {
                    runtime.backend = Some(id);
                } else {
                    self.problem(format!(
                        "runtime.backend: {id:?} is not a backend id (letters, digits, `-`, `_`)"
                    ));
                }
            }
        }
        if let Some(n) = lookup(entries, "options") {
            match n {
                Node::Map(options) => {
                    for (name, value) in options {
                        let path = join("runtime.options", name);
                        if !is_identifier(name) {
                            self.problem(format!(
                                "{path}: option names use letters, digits, `-` and `_`"
                            ));
                            continue;
                        }
                        if let Some(values) = self.option_values(value, &path) {
                            runtime.options.insert(name.clone(), values);
                        }
                    }
                }
                other => self.problem(format!(
                    "runtime.options must be a mapping (got {})",
                    other.kind()
                )),
            }
        }
        runtime
    }

    /// `runtime.bwrap`: `hide` and `writable` are lists of absolute (or `~/`) paths, `network` is
    /// `none`, `filtered` or `host`.
    fn bwrap_section(&mut self, node: &Node) -> BwrapSettings {
        let mut section = BwrapSettings::default();
        let Some(entries) = self.mapping(node, "runtime.bwrap", &BWRAP_KEYS) else {
            return section;
        };
        for key in ["hide", "writable"] {
            if let Some(n) = lookup(entries, key) {
                let path = join("runtime.bwrap", key);
                let values = self.string_list(n, &path);
                for (i, v) in values.iter().enumerate() {
                    if !(v.starts_with('/') || v.starts_with("~/")) {
                        self.problem(format!(
                            "{path}[{i}]: {v:?} must be an absolute path or start with `~/`"
                        ));
                    }
                }
                if key == "hide" {
                    section.hide = values;
                } else {
                    section.writable = values;
                }
            }
        }
        if let Some(n) = lookup(entries, "network") {
            if let Some(mode) = self.string(n, "runtime.bwrap.network") {
                if ["none", "filtered", "host"].contains(&mode.as_str()) {
                    section.network = Some(mode);
                } else {
                    self.problem(format!(
                        "runtime.bwrap.network: {mode:?} is not `none`, `filtered` or `host`"
                    ));
                }
            }
        }
        if let Some(n) = lookup(entries, "home") {
            section.home = Some(self.bwrap_home(n));
        }
        if let Some(n) = lookup(entries, "host_sockets") {
            if let Some(v) = self.string(n, "runtime.bwrap.host_sockets") {
                if v == "hide" || v == "allow" {
                    section.host_sockets = Some(v);
                } else {
                    self.problem(format!(
                        "runtime.bwrap.host_sockets: {v:?} is not `hide` or `allow`"
                    ));
                }
            }
        }
        section
    }

    /// `runtime.bwrap.home`: the mode, and `~/` paths below the home (never the home itself,
    /// never with `..`; the backend refuses agentdiff's state directory).
    fn bwrap_home(&mut self, node: &Node) -> BwrapHome {
        let mut home = BwrapHome::default();
        let Some(entries) = self.mapping(node, "runtime.bwrap.home", &BWRAP_HOME_KEYS) else {
            return home;
        };
        if let Some(n) = lookup(entries, "mode") {
            if let Some(mode) = self.string(n, "runtime.bwrap.home.mode") {
                if mode == "allowlist" || mode == "denylist" {
                    home.mode = Some(mode);
                } else {
                    self.problem(format!(
                        "runtime.bwrap.home.mode: {mode:?} is not `allowlist` or `denylist`"
                    ));
                }
            }
        }
        if let Some(n) = lookup(entries, "sockets") {
            if let Some(v) = self.string(n, "runtime.bwrap.home.sockets") {
                if v == "hide" || v == "allow" {
                    home.sockets = Some(v);
                } else {
                    self.problem(format!(
                        "runtime.bwrap.home.sockets: {v:?} is not `hide` or `allow`"
                    ));
                }
            }
        }
        for key in ["read", "write"] {
            let Some(n) = lookup(entries, key) else {
                continue;
            };
            let path = join("runtime.bwrap.home", key);
            let values = self.string_list(n, &path);
            for (i, v) in values.iter().enumerate() {
                let rest = v.strip_prefix("~/").unwrap_or("");
                if rest.trim_matches('/').is_empty() || rest.split('/').any(|s| s == "..") {
                    self.problem(format!(
                        "{path}[{i}]: {v:?} must name a path below the home, as `~/…`, \
                         without `..`"
                    ));
                }
            }
            if key == "read" {
                home.read = values;
            } else {
                home.write = values;
            }
        }
        home
    }

    fn option_values(&mut self, node: &Node, path: &str) -> Option<Vec<String>> {
        fn scalar(node: &Node) -> Option<String> {
            match node {
                Node::Str(s) => Some(s.clone()),
                Node::Int(i) => Some(i.to_string()),
                Node::Float(f) if f.is_finite() => Some(f.to_string()),
                _ => None,
            }
        }
        if let Some(s) = scalar(node) {
            return Some(vec![s]);
        }
        if let Node::Seq(items) = node {
            let mut values = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item {
                    Node::Str(s) => values.push(s.clone()),
                    other => {
                        self.problem(format!(
                            "{path}[{i}] must be a string (got {})",
                            other.kind()
                        ));
                        return None;
                    }
                }
            }
            return Some(values);
        }
        self.problem(format!(
            "{path} must be a string, a number or a list of strings (got {}; quote it)",
            node.kind()
        ));
        None
    }

    fn observe(&mut self, node: &Node) -> ObserveSettings {
        let mut observe = ObserveSettings::default();
        let Some(entries) = self.mapping(node, "observe", &["include"]) else {
            return observe;
        };
        if let Some(n) = lookup(entries, "include") {
            let raw = self.string_list(n, "observe.include");
            for (i, p) in raw.iter().enumerate() {
                match check_pattern(p) {
                    Ok(p) => observe.include.push(p),
                    Err(reason) => self.problem(format!("observe.include[{i}]: {reason}")),
                }
            }
        }
        observe
    }
}

fn lookup<'n>(entries: &'n [(String, Node)], key: &str) -> Option<&'n Node> {
    entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

/// The problem for a non-negative integer beyond what a policy number holds.
fn out_of_range(path: &str, number: &str) -> String {
    format!(
        "{path} is out of range: {number} is too large (the maximum is {})",
        u64::MAX
    )
}
