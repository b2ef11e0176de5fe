//! The container backend's options: parsed and validated from [`BackendOptions`] (command-line
//! flags and the policy's version-2 `runtime.options` map feed the same keys).

use agentdiff_backend_api::BackendOptions;
use serde::Serialize;

/// Option keys this backend reads. Any other key is refused, so a typo never silently weakens a
/// run.
pub const KEYS: [&str; 11] = [
    "engine",
    "engine-host",
    "image",
    "rootfs",
    "network",
    "memory",
    "cpus",
    "pids-limit",
    "user",
    "env",
    "pull",
];

pub const DEFAULT_NETWORK: Network = Network::None;
pub const DEFAULT_MEMORY: &str = "512m";
pub const DEFAULT_CPUS: &str = "1";
/// What a valid `image` looks like.
pub const IMAGE_EXPECTED: &str = "an image reference such as localhost/name:tag or name@sha256:…";
/// What a valid `memory` looks like.
pub const MEMORY_EXPECTED: &str =
    "a size of at least 6m with an optional b, k, m or g suffix, e.g. 512m";
/// What a valid `cpus` looks like.
pub const CPUS_EXPECTED: &str = "a number of CPUs from 0.01 to 1024, e.g. 1 or 0.5";
pub const DEFAULT_PIDS_LIMIT: u32 = 64;
/// Non-root default user inside the container (the conventional "nonroot" uid/gid).
pub const DEFAULT_USER: UserSpec = UserSpec {
    uid: 65532,
    gid: 65532,
};
/// Size of the writable tmpfs mounted on /tmp.
pub const TMPFS_TMP: &str = "/tmp:rw,size=64m,mode=1777";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OptionsError {
    #[error("unknown container option `{0}`; known options: {keys}", keys = KEYS.join(", "))]
    UnknownKey(String),
    #[error("option `{key}` was given more than once; give it once")]
    Repeated { key: String },
    #[error("invalid value {value:?} for `{key}`: {expected}")]
    Invalid {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("the container backend needs exactly one of `--image REF` or `--rootfs DIR`")]
    NoImageOrRootfs,
    #[error("`--image` and `--rootfs` are mutually exclusive; give one")]
    BothImageAndRootfs,
    #[error("the docker CLI has no `--rootfs`; use `--engine podman`, or import the directory as an image (`tar -C DIR -cf rootfs.tar . && docker import rootfs.tar localhost/NAME:TAG`) and pass `--image`")]
    RootfsNeedsPodman,
    #[error("`--pull` only applies to `--image`; a rootfs is never pulled")]
    PullWithRootfs,
    #[error("a remote engine (`engine-host`) runs an image; `--rootfs` names a directory of this machine, which the remote engine cannot see. Import the directory as an image on the engine (`tar -C DIR -cf rootfs.tar . && podman --url URL import rootfs.tar localhost/NAME:TAG`) and pass `--image`")]
    RemoteNeedsImage,
}

/// What `engine-host` accepts.
pub const ENGINE_HOST_EXPECTED: &str =
    "an engine API address (unix:///path, tcp://host:port or ssh://[user@]host[:port][/path]), or `env` to use DOCKER_HOST (docker) or CONTAINER_HOST (podman) from agentdiff's environment";

/// Where the engine runs when it may be another machine (remote mode: the workspace is shipped
/// through the engine's archive API, never bind-mounted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum EngineHost {
    /// This address.
    Url(String),
    /// DOCKER_HOST (docker) or CONTAINER_HOST (podman) of agentdiff's environment.
    Env,
}

/// Which container engine CLI to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineChoice {
    Podman,
    Docker,
    /// podman when found on PATH, else docker.
    Auto,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    /// Only a loopback interface.
    None,
    /// The engine's default bridge network.
    Bridge,
    /// No network (`--network none`) except agentdiff's egress proxy, reached through a
    /// forwarder on the container's `127.0.0.1` (local podman only; the default when the run has
    /// the proxy).
    Filtered,
}

impl Network {
    pub const fn as_str(self) -> &'static str {
        match self {
            Network::None => "none",
            Network::Bridge => "bridge",
            Network::Filtered => "filtered",
        }
    }

    /// The engine's `--network` value.
    pub const fn engine_value(self) -> &'static str {
        match self {
            Network::None | Network::Filtered => "none",
            Network::Bridge => "bridge",
        }
    }
}

/// Numeric `UID:GID` of the container user (names would be resolved inside an untrusted image).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct UserSpec {
    pub uid: u32,
    pub gid: u32,
}

impl UserSpec {
    pub fn render(self) -> String {
        format!("{}:{}", self.uid, self.gid)
    }
}

/// What the container runs from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "value", rename_all = "snake_case")]
pub enum Source {
    /// An image reference that must already be present locally (unless `pull`).
    Image(String),
    /// A root filesystem directory (podman `--rootfs`).
    Rootfs(String),
}

/// Validated options of one container run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerOptions {
    pub engine: EngineChoice,
    pub source: Source,
    pub network: Network,
    pub memory: String,
    pub cpus: String,
    pub pids_limit: u32,
    /// `None` means "the default for this invoker" (see [`crate::ownership`]).
    pub user: Option<UserSpec>,
    /// Host environment variable names passed through (`--env NAME`; values never on argv).
    pub env: Vec<String>,
    pub pull: bool,
    /// Remote mode when set.
    pub engine_host: Option<EngineHost>,
}

impl ContainerOptions {
    pub fn parse(options: &BackendOptions) -> Result<Self, OptionsError> {
        for key in options.keys() {
            if !KEYS.contains(&key) {
                return Err(OptionsError::UnknownKey(key.to_string()));
            }
            if key != "env" && options.get_all(key).len() > 1 {
                return Err(OptionsError::Repeated {
                    key: key.to_string(),
                });
            }
        }
        let engine = match options.get("engine").unwrap_or("auto") {
            "podman" => EngineChoice::Podman,
            "docker" => EngineChoice::Docker,
            "auto" => EngineChoice::Auto,
            other => {
                return Err(invalid("engine", other, "one of podman, docker, auto"));
            }
        };
        let source = match (options.get("image"), options.get("rootfs")) {
            (Some(_), Some(_)) => return Err(OptionsError::BothImageAndRootfs),
            (None, None) => return Err(OptionsError::NoImageOrRootfs),
            (Some(image), None) => {
                validate_image(image)?;
                Source::Image(image.to_string())
            }
            (None, Some(dir)) => {
                if dir.is_empty() || dir.chars().any(char::is_control) {
                    return Err(invalid("rootfs", dir, "a directory path"));
                }
                // The engine runs in the private workspace, so a relative path must be resolved
                // here, against the directory agentdiff was started in (as the rootfs check does).
                let absolute = std::path::absolute(dir)
                    .ok()
                    .and_then(|p| p.to_str().map(str::to_string))
                    .ok_or_else(|| invalid("rootfs", dir, "a directory path"))?;
                Source::Rootfs(absolute)
            }
        };
        if engine == EngineChoice::Docker && matches!(source, Source::Rootfs(_)) {
            return Err(OptionsError::RootfsNeedsPodman);
        }
        let network = match options.get("network").unwrap_or(DEFAULT_NETWORK.as_str()) {
            "none" => Network::None,
            "bridge" => Network::Bridge,
            "filtered" => Network::Filtered,
            other => return Err(invalid("network", other, "none, filtered or bridge")),
        };
        let memory = options.get("memory").unwrap_or(DEFAULT_MEMORY);
        validate_memory(memory)?;
        let cpus = options.get("cpus").unwrap_or(DEFAULT_CPUS);
        validate_cpus(cpus)?;
        let pids_limit = match options.get("pids-limit") {
            None => DEFAULT_PIDS_LIMIT,
            Some(v) => match v.parse::<u32>() {
                Ok(n) if (1..=1_000_000).contains(&n) => n,
                _ => {
                    return Err(invalid(
                        "pids-limit",
                        v,
                        "a whole number from 1 to 1000000 (a run is never unlimited)",
                    ))
                }
            },
        };
        let user = match options.get("user") {
            None => None,
            Some(v) => Some(parse_user(v)?),
        };
        let mut env = Vec::new();
        for name in options.get_all("env") {
            if !valid_env_name(name) {
                return Err(invalid(
                    "env",
                    name,
                    "a variable name ([A-Za-z_][A-Za-z0-9_]*); values are taken from the host environment, never given on the command line",
                ));
            }
            if !env.contains(name) {
                env.push(name.clone());
            }
        }
        let pull = match options.get("pull") {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => return Err(invalid("pull", other, "true or false")),
        };
        if pull && matches!(source, Source::Rootfs(_)) {
            return Err(OptionsError::PullWithRootfs);
        }
        let engine_host = match options.get("engine-host") {
            None => None,
            Some(v) => Some(parse_engine_host(v)?),
        };
        if engine_host.is_some() && matches!(source, Source::Rootfs(_)) {
            return Err(OptionsError::RemoteNeedsImage);
        }
        Ok(Self {
            engine,
            source,
            network,
            memory: memory.to_ascii_lowercase(),
            cpus: cpus.to_string(),
            pids_limit,
            user,
            env,
            pull,
            engine_host,
        })
    }
}

pub(crate) fn parse_engine_host(v: &str) -> Result<EngineHost, OptionsError> {
    if v == "env" {
        return Ok(EngineHost::Env);
    }
    validate_engine_url(v)
        .map(|()| EngineHost::Url(v.to_string()))
        .map_err(|_| invalid("engine-host", v, ENGINE_HOST_EXPECTED))
}

/// An engine address the docker and podman clients both understand, as one printable token.
pub(crate) fn validate_engine_url(v: &str) -> Result<(), OptionsError> {
    let rest = ["unix://", "tcp://", "ssh://"]
        .iter()
        .find_map(|scheme| v.strip_prefix(scheme));
    let ok = rest.is_some_and(|r| !r.is_empty())
        && v.len() <= 1024
        && !v.chars().any(|c| c.is_control() || c.is_whitespace());
    if ok {
        Ok(())
    } else {
        Err(invalid("engine-host", v, ENGINE_HOST_EXPECTED))
    }
}

fn invalid(key: &'static str, value: &str, expected: &'static str) -> OptionsError {
    OptionsError::Invalid {
        key,
        value: value.to_string(),
        expected,
    }
}

/// An image reference must not look like a flag and must be one printable token.
pub(crate) fn validate_image(image: &str) -> Result<(), OptionsError> {
    let ok = !image.is_empty()
        && image.len() <= 512
        && !image.starts_with('-')
        && image
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "./:_-@+".contains(c));
    if ok {
        Ok(())
    } else {
        Err(invalid("image", image, IMAGE_EXPECTED))
    }
}

pub(crate) fn validate_memory(memory: &str) -> Result<(), OptionsError> {
    let lower = memory.to_ascii_lowercase();
    let digits = lower.trim_end_matches(['b', 'k', 'm', 'g']);
    let suffix_len = lower.len() - digits.len();
    let ok = !digits.is_empty()
        && suffix_len <= 1
        && digits.bytes().all(|b| b.is_ascii_digit())
        && digits.len() <= 15
        && digits.parse::<u64>().map(|n| n > 0).unwrap_or(false)
        // Engines refuse limits below 6 MiB; refuse them here with a clearer message.
        && memory_bytes(&lower).is_some_and(|b| b >= 6 * 1024 * 1024);
    if ok {
        Ok(())
    } else {
        Err(invalid("memory", memory, MEMORY_EXPECTED))
    }
}

fn memory_bytes(lower: &str) -> Option<u64> {
    let (digits, mult) = match lower.chars().last()? {
        'k' => (&lower[..lower.len() - 1], 1024u64),
        'm' => (&lower[..lower.len() - 1], 1024 * 1024),
        'g' => (&lower[..lower.len() - 1], 1024 * 1024 * 1024),
        'b' => (&lower[..lower.len() - 1], 1),
        _ => (lower, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

pub(crate) fn validate_cpus(cpus: &str) -> Result<(), OptionsError> {
    let ok = cpus.len() <= 12
        && cpus.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && cpus
            .parse::<f64>()
            .map(|n| (0.01..=1024.0).contains(&n))
            .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(invalid("cpus", cpus, CPUS_EXPECTED))
    }
}

fn parse_user(v: &str) -> Result<UserSpec, OptionsError> {
    const EXPECTED: &str =
        "numeric UID:GID of a non-root user, e.g. 65532:65532 (root inside the container is refused)";
    let Some((u, g)) = v.split_once(':') else {
        return Err(invalid("user", v, EXPECTED));
    };
    let num = |s: &str| -> Option<u32> {
        if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
            None
        } else {
            s.parse().ok()
        }
    };
    match (num(u), num(g)) {
        (Some(uid), Some(gid)) if uid != 0 && gid != 0 => Ok(UserSpec { uid, gid }),
        _ => Err(invalid("user", v, EXPECTED)),
    }
}

pub(crate) fn valid_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> BackendOptions {
        let mut o = BackendOptions::new();
        for (k, v) in pairs {
            o.push(*k, *v);
        }
        o
    }

    #[test]
    fn defaults_are_the_restrictive_ones() {
        let o = ContainerOptions::parse(&opts(&[("image", "localhost/x:1")])).unwrap();
        assert_eq!(o.engine, EngineChoice::Auto);
        assert_eq!(o.network, Network::None);
        assert_eq!(o.memory, "512m");
        assert_eq!(o.cpus, "1");
        assert_eq!(o.pids_limit, 64);
        assert_eq!(o.user, None);
        assert!(o.env.is_empty());
        assert!(!o.pull);
    }

    #[test]
    fn engine_host_is_an_address_or_env_and_needs_an_image() {
        let parse = |v: &str| {
            ContainerOptions::parse(&opts(&[("image", "a"), ("engine-host", v)]))
                .map(|o| o.engine_host)
        };
        assert_eq!(parse("env").unwrap(), Some(EngineHost::Env));
        for ok in [
            "tcp://127.0.0.1:2375",
            "ssh://u@build-1:22",
            "unix:///run/x.sock",
        ] {
            assert_eq!(parse(ok).unwrap(), Some(EngineHost::Url(ok.into())), "{ok}");
        }
        for bad in [
            "",
            "tcp://",
            "http://h",
            "/run/x.sock",
            "tcp://h:1 --x",
            "tcp://h\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            ContainerOptions::parse(&opts(&[
                ("engine", "podman"),
                ("rootfs", "/r"),
                ("engine-host", "env")
            ]))
            .unwrap_err(),
            OptionsError::RemoteNeedsImage
        );
        let local = ContainerOptions::parse(&opts(&[("image", "a")])).unwrap();
        assert_eq!(local.engine_host, None);
    }

    #[test]
    fn image_and_rootfs_are_exclusive_and_one_is_needed() {
        assert_eq!(
            ContainerOptions::parse(&opts(&[])).unwrap_err(),
            OptionsError::NoImageOrRootfs
        );
        assert_eq!(
            ContainerOptions::parse(&opts(&[("image", "a"), ("rootfs", "/r")])).unwrap_err(),
            OptionsError::BothImageAndRootfs
        );
        assert_eq!(
            ContainerOptions::parse(&opts(&[("engine", "docker"), ("rootfs", "/r")])).unwrap_err(),
            OptionsError::RootfsNeedsPodman
        );
        assert_eq!(
            ContainerOptions::parse(&opts(&[("rootfs", "/r"), ("pull", "true")])).unwrap_err(),
            OptionsError::PullWithRootfs
        );
    }

    #[test]
    fn adversarial_values_are_refused() {
        for (k, v) in [
            ("image", "--privileged"),
            ("image", "a b"),
            ("image", ""),
            ("network", "host"),
            ("network", "container:x"),
            ("memory", "0"),
            ("memory", "1k"),
            ("memory", "-1"),
            ("memory", "12x"),
            ("memory", "99999999999999999999g"),
            ("cpus", "0"),
            ("cpus", "-1"),
            ("cpus", "1e3"),
            ("cpus", "NaN"),
            ("pids-limit", "0"),
            ("pids-limit", "-1"),
            ("pids-limit", "unlimited"),
            ("user", "0:0"),
            ("user", "1000:0"),
            ("user", "root"),
            ("user", "1000"),
            ("user", "a:b"),
            ("env", "A=B"),
            ("env", "1A"),
            ("env", ""),
            ("pull", "yes"),
            ("engine", "lxc"),
        ] {
            let mut o = opts(&[(k, v)]);
            if k != "image" {
                o.push("image", "localhost/x:1");
            }
            assert!(
                ContainerOptions::parse(&o).is_err(),
                "{k}={v:?} must be refused"
            );
        }
    }

    #[test]
    fn unknown_and_repeated_keys_are_refused() {
        assert_eq!(
            ContainerOptions::parse(&opts(&[("image", "a"), ("privileged", "true")])).unwrap_err(),
            OptionsError::UnknownKey("privileged".into())
        );
        assert_eq!(
            ContainerOptions::parse(&opts(&[("image", "a"), ("image", "b")])).unwrap_err(),
            OptionsError::Repeated {
                key: "image".into()
            }
        );
    }

    #[test]
    fn explicit_values_are_kept() {
        let o = ContainerOptions::parse(&opts(&[
            ("engine", "podman"),
            ("rootfs", "/srv/rootfs"),
            ("network", "bridge"),
            ("memory", "1G"),
            ("cpus", "0.5"),
            ("pids-limit", "128"),
            ("user", "1000:1000"),
            ("env", "HOME"),
            ("env", "LANG"),
            ("env", "HOME"),
        ]))
        .unwrap();
        assert_eq!(o.engine, EngineChoice::Podman);
        assert_eq!(o.source, Source::Rootfs("/srv/rootfs".into()));
        assert_eq!(o.network, Network::Bridge);
        assert_eq!(o.memory, "1g");
        assert_eq!(o.cpus, "0.5");
        assert_eq!(o.pids_limit, 128);
        assert_eq!(
            o.user,
            Some(UserSpec {
                uid: 1000,
                gid: 1000
            })
        );
        assert_eq!(o.env, vec!["HOME".to_string(), "LANG".to_string()]);
    }

    #[test]
    fn a_relative_rootfs_is_resolved_before_it_reaches_the_engine() {
        let o = ContainerOptions::parse(&opts(&[("rootfs", "../rootfs")])).unwrap();
        let Source::Rootfs(dir) = &o.source else {
            panic!("expected a rootfs source");
        };
        assert!(std::path::Path::new(dir).is_absolute(), "{dir}");
        assert!(dir.ends_with("rootfs"));
    }
}
