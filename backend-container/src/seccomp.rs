//! The seccomp profile a local podman run gets: podman's own default profile with `socket`
//! allowed for every address family but `AF_VSOCK`.
//!
//! Why: `AF_VSOCK` belongs to no network namespace. On a virtual machine whose hypervisor host
//! listens on vsock, a command in a `--network none` container could reach that host past every
//! network control; podman's default profile allows `socket` for any family (it refuses only
//! `NETLINK_AUDIT` without `CAP_AUDIT_WRITE`). An appended refusal does not help: the allow rules
//! still match. So the profile is derived: `socket`, `socketcall` and io_uring (whose rings make
//! sockets no `socket` call shows) leave every rule, and one rule
//! allows `socket` when the family is not `AF_VSOCK` and the protocol is not `NETLINK_AUDIT`
//! (protocol 9 is refused for every family: only netlink's audit and the long-obsolete IGP use it).
//! Everything else of the engine's profile is kept as it is.
//!
//! Invariants: the profile is derived from the file podman itself would use (the first of
//! [`DEFAULT_PROFILES`] that exists), never from a file a `containers.conf` (system, drop-in,
//! the user's, `$CONTAINERS_CONF`) names instead (that choice is the user's; the run then says vsock was not refused and why); a profile whose default
//! action lets unlisted calls through is refused, because removing its `socket` rules would allow
//! every family.
//! Not defended: `socketcall` is refused outright, so 32-bit programs cannot use sockets at all,
//! and io_uring is unavailable;
//! a profile podman compiled in (no file on the host) is not derived; the docker CLI (whose
//! engine's default refuses vsock since 20.10.22 and 23.0, moby/moby#44562) and remote engines
//! keep their engine's default.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::engine::EngineKind;

/// `AF_VSOCK` (linux/socket.h).
pub const AF_VSOCK: u64 = 40;
/// `NETLINK_AUDIT` (linux/netlink.h), the protocol podman refuses without `CAP_AUDIT_WRITE`.
pub const NETLINK_AUDIT: u64 = 9;
/// Where podman (containers/common) looks for its default profile, in this order.
pub const DEFAULT_PROFILES: [&str; 2] = [
    "/etc/containers/seccomp.json",
    "/usr/share/containers/seccomp.json",
];
/// The system-wide `containers.conf` files and drop-in directories that may name another profile
/// (`seccomp_profile`); the user's and `$CONTAINERS_CONF` come on top.
const CONTAINERS_CONF: [&str; 2] = [
    "/usr/share/containers/containers.conf",
    "/etc/containers/containers.conf",
];
const CONTAINERS_CONF_DIRS: [&str; 2] = [
    "/usr/share/containers/containers.conf.d",
    "/etc/containers/containers.conf.d",
];
/// Default actions that refuse what the profile does not list.
const REFUSING_DEFAULTS: [&str; 5] = [
    "SCMP_ACT_ERRNO",
    "SCMP_ACT_KILL",
    "SCMP_ACT_KILL_PROCESS",
    "SCMP_ACT_KILL_THREAD",
    "SCMP_ACT_TRAP",
];
/// Removed from every rule of the engine's profile: the calls that create sockets, and io_uring,
/// whose rings create sockets (`IORING_OP_SOCKET`) without a `socket` call the filter could see.
const REMOVED_CALLS: [&str; 5] = [
    "socket",
    "socketcall",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
];

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("podman's default seccomp profile is not a file here (looked at {looked})")]
    NotFound { looked: String },
    #[error("{path} names podman's seccomp profile (`seccomp_profile`); agentdiff keeps that choice and does not derive from it")]
    Configured { path: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a seccomp profile agentdiff can read: {source}")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path} lets every call it does not list through (defaultAction {action}); without its socket rules it would allow AF_VSOCK")]
    AllowsByDefault { path: PathBuf, action: String },
}

/// The parts of an OCI seccomp profile the derivation touches; every other field is kept as read.
#[derive(Debug, Serialize, Deserialize)]
struct Profile {
    #[serde(rename = "defaultAction")]
    default_action: String,
    #[serde(default)]
    syscalls: Vec<Rule>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Rule {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    names: Vec<String>,
    /// The older single-name form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// The derived profile and the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    pub source: PathBuf,
    pub profile: Vec<u8>,
}

/// Which seccomp profile a run's container gets.
#[derive(Debug, Clone)]
pub enum Plan {
    /// podman's default without `AF_VSOCK`, written beside the run's `--cidfile` at launch.
    Derived(Derived),
    /// The engine's own default, and why.
    EngineDefault { why: String },
}

impl Plan {
    /// A local podman run derives its profile; the docker CLI and remote engines keep theirs.
    pub fn choose(kind: EngineKind, remote: bool) -> Plan {
        let why = match (kind, remote) {
            (_, true) => "a remote engine applies its own default profile".to_string(),
            (EngineKind::Docker, false) => "the docker CLI's engine applies its own default profile (docker's refuses AF_VSOCK since 20.10.22 and 23.0; not checked)".to_string(),
            (EngineKind::Podman, false) => match for_podman() {
                Ok(derived) => return Plan::Derived(derived),
                Err(e) => e.to_string(),
            },
        };
        Plan::EngineDefault { why }
    }

    /// One line for `doctor`: which profile a run with this engine gets.
    pub fn summary(&self, kind: EngineKind) -> String {
        match self {
            Plan::Derived(d) => format!(
                "{} runs get seccomp derived from {} (AF_VSOCK, NETLINK_AUDIT and io_uring refused)",
                kind.as_str(),
                d.source.display()
            ),
            Plan::EngineDefault { why } => format!(
                "{} runs keep the engine's seccomp default: {why}",
                kind.as_str()
            ),
        }
    }

    pub fn evidence(&self) -> serde_json::Value {
        match self {
            Plan::Derived(d) => serde_json::json!({
                "profile": "derived",
                "derived_from": d.source.display().to_string(),
                // Handed to the engine, which applies it: the real-podman tests prove it here.
                "level": "requested",
                "refused": refused(),
            }),
            Plan::EngineDefault { why } => serde_json::json!({
                "profile": "engine_default",
                "why": why,
            }),
        }
    }
}

/// What the derived profile refuses, for the evidence: from the same constants it is made of.
fn refused() -> Vec<String> {
    let socket = [
        format!("socket(family {AF_VSOCK}: AF_VSOCK)"),
        format!("socket(protocol {NETLINK_AUDIT}: NETLINK_AUDIT)"),
    ];
    let calls = REMOVED_CALLS.iter().filter(|c| **c != "socket");
    socket
        .into_iter()
        .chain(calls.map(|c| c.to_string()))
        .collect()
}

/// podman's default profile on this host, derived (see the module doc).
pub fn for_podman() -> Result<Derived, SeccompError> {
    if let Some(path) = configured_profile() {
        return Err(SeccompError::Configured { path });
    }
    let source = DEFAULT_PROFILES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| SeccompError::NotFound {
            looked: DEFAULT_PROFILES.join(", "),
        })?;
    let text = std::fs::read(&source).map_err(|e| SeccompError::Read {
        path: source.clone(),
        source: e,
    })?;
    let profile = without_vsock(&text, &source)?;
    Ok(Derived { source, profile })
}

/// `default` (the engine's profile, read from `path`) without `AF_VSOCK` sockets.
pub fn without_vsock(default: &[u8], path: &Path) -> Result<Vec<u8>, SeccompError> {
    let parse = |e| SeccompError::Parse {
        path: path.to_path_buf(),
        source: e,
    };
    let mut profile: Profile = serde_json::from_slice(default).map_err(parse)?;
    if !REFUSING_DEFAULTS.contains(&profile.default_action.as_str()) {
        return Err(SeccompError::AllowsByDefault {
            path: path.to_path_buf(),
            action: profile.default_action,
        });
    }
    let is_socket_call = |n: &str| REMOVED_CALLS.contains(&n);
    profile.syscalls.retain_mut(|rule| {
        rule.names.retain(|n| !is_socket_call(n));
        if rule.name.as_deref().is_some_and(is_socket_call) {
            rule.name = None;
        }
        !rule.names.is_empty() || rule.name.is_some()
    });
    let condition =
        |value: u64| serde_json::json!({"value": value, "valueTwo": 0, "op": "SCMP_CMP_NE"});
    let mut family = condition(AF_VSOCK);
    family["index"] = 0.into();
    let mut protocol = condition(NETLINK_AUDIT);
    protocol["index"] = 2.into();
    let mut rest = Map::new();
    rest.insert("action".into(), "SCMP_ACT_ALLOW".into());
    rest.insert("args".into(), Value::Array(vec![family, protocol]));
    rest.insert(
        "comment".into(),
        "agentdiff: every socket family but AF_VSOCK, every protocol but NETLINK_AUDIT".into(),
    );
    profile.syscalls.push(Rule {
        names: vec!["socket".into()],
        name: None,
        rest,
    });
    serde_json::to_vec_pretty(&profile).map_err(parse)
}

/// The first `containers.conf` podman reads that sets `seccomp_profile`: the system files and
/// drop-ins, the user's (`$XDG_CONFIG_HOME` or `~/.config`), and `$CONTAINERS_CONF`.
fn configured_profile() -> Option<PathBuf> {
    let user = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .map(|c| c.join("containers"));
    let files = CONTAINERS_CONF.iter().map(PathBuf::from);
    let dirs = CONTAINERS_CONF_DIRS.iter().map(PathBuf::from);
    first_setting(
        files.chain(user.as_ref().map(|u| u.join("containers.conf"))),
        dirs.chain(user.as_ref().map(|u| u.join("containers.conf.d"))),
        std::env::var_os("CONTAINERS_CONF").map(PathBuf::from),
    )
}

/// The first of `files`, the `*.conf` drop-ins of `dirs` (each directory's in name order) and
/// `explicit` that sets `seccomp_profile`.
fn first_setting(
    files: impl Iterator<Item = PathBuf>,
    dirs: impl Iterator<Item = PathBuf>,
    explicit: Option<PathBuf>,
) -> Option<PathBuf> {
    let drop_ins = dirs.flat_map(|dir| {
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "conf"))
            .collect();
        found.sort();
        found
    });
    files
        .chain(drop_ins)
        .chain(explicit)
        .find(|p| std::fs::read_to_string(p).is_ok_and(|text| sets_profile(&text)))
}

/// Whether a `containers.conf` text sets `seccomp_profile` (a line of its own, not a comment).
fn sets_profile(text: &str) -> bool {
    text.lines().any(|l| {
        let l = l.trim_start();
        l.strip_prefix("seccomp_profile")
            .is_some_and(|rest| rest.trim_start().starts_with('='))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a local podman run derives a profile; the others say whose default applies.
    #[test]
    fn the_docker_cli_and_remote_engines_keep_their_engines_seccomp_default() {
        for (kind, remote, says) in [
            (EngineKind::Docker, false, "docker CLI"),
            (EngineKind::Podman, true, "remote engine"),
            (EngineKind::Docker, true, "remote engine"),
        ] {
            let plan = Plan::choose(kind, remote);
            let Plan::EngineDefault { why } = &plan else {
                panic!("{kind:?} remote={remote}: {plan:?}");
            };
            assert!(why.contains(says), "{why}");
            assert_eq!(plan.evidence()["profile"], "engine_default");
            let line = plan.summary(kind);
            assert!(line.contains("keep the engine's seccomp default") && line.contains(says));
        }
        let derived = Plan::Derived(Derived {
            source: "/usr/share/containers/seccomp.json".into(),
            profile: Vec::new(),
        });
        assert_eq!(
            derived.summary(EngineKind::Podman),
            "podman runs get seccomp derived from /usr/share/containers/seccomp.json (AF_VSOCK, \
             NETLINK_AUDIT and io_uring refused)"
        );
    }

    const PODMAN_LIKE: &str = r#"{
        "defaultAction": "SCMP_ACT_ERRNO",
        "defaultErrnoRet": 38,
        "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
        "syscalls": [
            {"names": ["read", "socketcall", "io_uring_setup", "write"], "action": "SCMP_ACT_ALLOW", "args": [], "includes": {}, "excludes": {}},
            {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 2, "value": 9, "valueTwo": 0, "op": "SCMP_CMP_NE"}], "excludes": {"caps": ["CAP_AUDIT_WRITE"]}},
            {"names": ["socket"], "action": "SCMP_ACT_ALLOW", "args": null, "includes": {"caps": ["CAP_AUDIT_WRITE"]}},
            {"name": "socket", "action": "SCMP_ACT_ALLOW"}
        ]
    }"#;

    fn derived(text: &str) -> Value {
        let out = without_vsock(text.as_bytes(), Path::new("/p.json")).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn only_one_socket_rule_is_left_and_it_excludes_vsock_and_audit() {
        let v = derived(PODMAN_LIKE);
        let rules = v["syscalls"].as_array().unwrap();
        let mentions = |call: &str| {
            rules
                .iter()
                .filter(|r| {
                    r["names"]
                        .as_array()
                        .is_some_and(|n| n.iter().any(|x| x == call))
                        || r["name"] == call
                })
                .count()
        };
        assert_eq!(mentions("socket"), 1, "{rules:#?}");
        assert_eq!(mentions("socketcall"), 0, "{rules:#?}");
        assert_eq!(mentions("io_uring_setup"), 0, "{rules:#?}");
        assert_eq!(mentions("read"), 1);
        let last = rules.last().unwrap();
        assert_eq!(last["action"], "SCMP_ACT_ALLOW");
        assert_eq!(last["args"][0]["index"], 0);
        assert_eq!(last["args"][0]["value"], AF_VSOCK);
        assert_eq!(last["args"][0]["op"], "SCMP_CMP_NE");
        assert_eq!(last["args"][1]["index"], 2);
        assert_eq!(last["args"][1]["value"], NETLINK_AUDIT);
    }

    #[test]
    fn the_rest_of_the_profile_is_kept() {
        let v = derived(PODMAN_LIKE);
        assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(v["defaultErrnoRet"], 38);
        assert_eq!(v["archMap"][0]["subArchitectures"][0], "SCMP_ARCH_X86");
        assert_eq!(
            v["syscalls"][0]["names"],
            serde_json::json!(["read", "write"])
        );
        assert_eq!(v["syscalls"][0]["excludes"], serde_json::json!({}));
    }

    #[test]
    fn a_profile_that_allows_by_default_is_refused() {
        let text = PODMAN_LIKE.replace("SCMP_ACT_ERRNO", "SCMP_ACT_ALLOW");
        let err = without_vsock(text.as_bytes(), Path::new("/p.json")).unwrap_err();
        assert!(matches!(err, SeccompError::AllowsByDefault { .. }), "{err}");
        let err = without_vsock(b"[]", Path::new("/p.json")).unwrap_err();
        assert!(matches!(err, SeccompError::Parse { .. }), "{err}");
    }

    #[test]
    fn a_setting_in_a_users_drop_in_or_an_explicit_file_is_found() {
        let t = tempfile::tempdir().unwrap();
        let system = t.path().join("containers.conf");
        std::fs::write(&system, "[containers]\n#seccomp_profile = \"/x\"\n").unwrap();
        let user_dir = t.path().join("user/containers.conf.d");
        std::fs::create_dir_all(&user_dir).unwrap();
        std::fs::write(user_dir.join("10-a.conf"), "[engine]\n").unwrap();
        let none = first_setting(
            [system.clone()].into_iter(),
            [user_dir.clone()].into_iter(),
            None,
        );
        assert_eq!(none, None);
        let setting = user_dir.join("20-b.conf");
        std::fs::write(&setting, "[containers]\nseccomp_profile = \"/mine.json\"\n").unwrap();
        let found = first_setting([system.clone()].into_iter(), [user_dir].into_iter(), None);
        assert_eq!(found, Some(setting.clone()));
        let explicit = first_setting(
            [system].into_iter(),
            std::iter::empty(),
            Some(setting.clone()),
        );
        assert_eq!(explicit, Some(setting));
    }

    #[test]
    fn a_containers_conf_setting_is_found_and_a_comment_is_not() {
        assert!(sets_profile(
            "[containers]\nseccomp_profile = \"/x.json\"\n"
        ));
        assert!(sets_profile("  seccomp_profile=\"/x.json\""));
        assert!(!sets_profile(
            "#seccomp_profile = \"/usr/share/containers/seccomp.json\""
        ));
        assert!(!sets_profile("seccomp_profile_other = 1"));
    }
}
