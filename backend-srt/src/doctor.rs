//! `agentdiff doctor` for srt: found or not, version, prerequisites, user namespaces, remedies.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{Availability, Capabilities, DiagnosticFact, Diagnostics, Enforcement};
use serde::Serialize;

use crate::host::{self, Prerequisite, UserNamespaces};
use crate::{ENFORCEMENT, ID};

/// The srt executable as found on agentdiff's PATH.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SrtStatus {
    pub path: Option<PathBuf>,
    pub version: Option<String>,
    /// Whether `srt --version` ran now or an earlier answer for the same srt binary was reused.
    pub version_source: Option<crate::version::VersionSource>,
    /// Why it was not found or did not answer.
    pub error: Option<String>,
}

/// Result of `bwrap --unshare-user --dev-bind / / true`: whether bubblewrap can create a user
/// namespace here. It shows a prerequisite works; it does not verify srt's enforcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NamespaceProbe {
    pub ok: bool,
    pub detail: String,
}

/// Everything `agentdiff doctor` reports for srt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DoctorReport {
    pub backend: &'static str,
    /// Whether srt is discoverable on PATH (the seed's `sandbox_runtime_cli_detected`).
    pub sandbox_runtime_cli_detected: bool,
    pub srt: SrtStatus,
    /// Linux only: bubblewrap, socat, ripgrep.
    pub prerequisites: Vec<Prerequisite>,
    pub user_namespaces: Option<UserNamespaces>,
    pub namespace_probe: Option<NamespaceProbe>,
    /// Whether the host side is ready: prerequisites present, user namespaces usable.
    pub host_ready: bool,
    /// Whether `--runtime srt` can run here with the srt found on PATH.
    pub ready: bool,
    pub enforcement: Enforcement,
    pub capabilities: Capabilities,
    /// Always false: srt's sandbox is requested, not verified by agentdiff.
    pub sandboxed: bool,
    pub network_enforcement: bool,
    pub remedies: Vec<String>,
    pub limits: Vec<&'static str>,
}

impl DoctorReport {
    /// What `agentdiff doctor` shows: whether srt was found, and the whole report.
    pub fn diagnostics(&self) -> Diagnostics {
        Diagnostics {
            facts: vec![DiagnosticFact {
                name: "sandbox_runtime_cli_detected".into(),
                value: serde_json::json!(self.sandbox_runtime_cli_detected),
            }],
            details: serde_json::to_value(self).unwrap_or(serde_json::Value::Null),
        }
    }

    /// The report as an [`Availability`] for the srt it was made for (the run's
    /// `srt-executable`, else `srt` on PATH): Ready only when that srt exists and answers
    /// `srt --version` and the host prerequisites are there; otherwise Unavailable with what is
    /// missing and the remedies, so availability never disagrees with `prepare`.
    pub fn availability(&self) -> Availability {
        if self.host_ready && !self.ready {
            let error = self.srt.error.as_deref().unwrap_or("not usable");
            return Availability::Unavailable {
                reason: format!("srt is not usable: {error}"),
                remedy: format!(
                    "{}; or name a working srt with --srt-executable",
                    self.remedies.join("; ")
                ),
            };
        }
        if self.ready {
            let prereqs: Vec<String> = self
                .prerequisites
                .iter()
                .map(|p| {
                    format!(
                        "{} {}",
                        p.name,
                        p.path.as_deref().unwrap_or(Path::new("?")).display()
                    )
                })
                .collect();
            let mut detail = format!(
                "srt {} at {}",
                self.srt.version.as_deref().unwrap_or("?"),
                self.srt.path.as_deref().unwrap_or(Path::new("?")).display()
            );
            if !prereqs.is_empty() {
                detail.push_str(&format!("; {}", prereqs.join(", ")));
            }
            if let Some(p) = &self.namespace_probe {
                detail.push_str(&format!("; user namespaces: {}", p.detail));
            }
            detail.push_str("; sandbox requested, not verified");
            return Availability::Ready { detail };
        }
        let mut reasons = Vec::new();
        if let Some(e) = &self.srt.error {
            reasons.push(format!("srt is not usable: {e}"));
        }
        let missing: Vec<&str> = self
            .prerequisites
            .iter()
            .filter(|p| !p.found())
            .map(|p| p.name)
            .collect();
        if !missing.is_empty() {
            reasons.push(format!("missing {}", missing.join(", ")));
        }
        if let Some(u) = self.user_namespaces.as_ref().filter(|u| !u.allowed) {
            reasons.push(u.detail.clone());
        }
        if let Some(p) = self.namespace_probe.as_ref().filter(|p| !p.ok) {
            reasons.push(format!(
                "bubblewrap cannot create a user namespace: {}",
                p.detail
            ));
        }
        Availability::Unavailable {
            reason: reasons.join("; "),
            remedy: self.remedies.join("; "),
        }
    }
}

const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

async fn namespace_probe(bwrap: &Path) -> NamespaceProbe {
    let mut cmd = tokio::process::Command::new(bwrap);
    cmd.args(["--unshare-user", "--dev-bind", "/", "/", "true"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    match tokio::time::timeout(PROBE_TIMEOUT, cmd.output()).await {
        Err(_) => NamespaceProbe {
            ok: false,
            detail: "bwrap did not finish within 10s".into(),
        },
        Ok(Err(e)) => NamespaceProbe {
            ok: false,
            detail: format!("cannot run {}: {e}", bwrap.display()),
        },
        Ok(Ok(out)) if out.status.success() => NamespaceProbe {
            ok: true,
            detail: "bwrap created a user namespace".into(),
        },
        Ok(Ok(out)) => NamespaceProbe {
            ok: false,
            detail: String::from_utf8_lossy(&out.stderr)
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("bwrap failed without a message")
                .chars()
                .take(200)
                .collect(),
        },
    }
}

/// Build the doctor report for `executable` (the `srt-executable` option; default `srt`) from
/// agentdiff's own PATH. Runs `srt --version` and, on Linux, the bubblewrap user-namespace probe.
pub async fn doctor_report(executable: Option<&str>) -> DoctorReport {
    let path = std::env::var_os("PATH");
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let mut remedies = Vec::new();
    let state_dir = crate::settings::agentdiff_state_dir();
    let requested = executable.unwrap_or("srt");
    let srt = match host::resolve_executable(OsStr::new(requested), path.as_deref(), &cwd) {
        Ok(p) => match crate::version::version(&p, None, state_dir.as_deref()).await {
            Ok(v) => SrtStatus {
                path: Some(p),
                version: Some(v.version),
                version_source: Some(v.source),
                error: None,
            },
            Err(e) => {
                remedies.push(
                    "reinstall srt: `npm install -g @anthropic-ai/sandbox-runtime`".to_string(),
                );
                SrtStatus {
                    path: Some(p),
                    version: None,
                    version_source: None,
                    error: Some(e.to_string()),
                }
            }
        },
        Err(e) => {
            remedies.push(crate::host::remedy(&e));
            SrtStatus {
                path: None,
                version: None,
                version_source: None,
                error: Some(e.to_string()),
            }
        }
    };
    let detected = srt.path.is_some();

    let (prerequisites, user_namespaces, namespace_probe) = if cfg!(target_os = "linux") {
        let prereqs = host::linux_prerequisites(path.as_deref(), &cwd);
        let userns = host::user_namespaces(Path::new("/proc/sys"), host::euid());
        if let Some((_, remedy)) = host::missing_linux_prerequisites(&prereqs, &userns) {
            remedies.push(remedy);
        }
        let probe = match prereqs
            .iter()
            .find(|p| p.program == "bwrap")
            .and_then(|p| p.path.clone())
        {
            Some(bwrap) => {
                let probe = namespace_probe(&bwrap).await;
                if !probe.ok {
                    remedies.push(
                        "allow user namespaces for bubblewrap (e.g. `sysctl -w \
                         kernel.unprivileged_userns_clone=1`, or an AppArmor profile for bwrap \
                         on Ubuntu 24.04)"
                            .into(),
                    );
                }
                Some(probe)
            }
            None => None,
        };
        (prereqs, Some(userns), probe)
    } else {
        (Vec::new(), None, None)
    };
    let host_ready = prerequisites.iter().all(Prerequisite::found)
        && user_namespaces.as_ref().map_or(true, |u| u.allowed)
        && namespace_probe.as_ref().map_or(true, |p| p.ok);
    let ready = host_ready && srt.error.is_none();
    DoctorReport {
        backend: ID,
        sandbox_runtime_cli_detected: detected,
        srt,
        prerequisites,
        user_namespaces,
        namespace_probe,
        host_ready,
        ready,
        enforcement: ENFORCEMENT,
        capabilities: crate::capabilities(),
        sandboxed: false,
        network_enforcement: false,
        remedies,
        limits: crate::facts::LIMITS.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(srt_error: Option<&str>, missing_socat: bool) -> DoctorReport {
        DoctorReport {
            backend: ID,
            sandbox_runtime_cli_detected: srt_error.is_none(),
            srt: SrtStatus {
                path: srt_error.is_none().then(|| PathBuf::from("/usr/bin/srt")),
                version: srt_error.is_none().then(|| "1.2.3".to_string()),
                version_source: None,
                error: srt_error.map(str::to_string),
            },
            prerequisites: vec![Prerequisite {
                name: "socat",
                program: "socat",
                path: (!missing_socat).then(|| PathBuf::from("/usr/bin/socat")),
                package: "socat",
            }],
            user_namespaces: None,
            namespace_probe: None,
            host_ready: !missing_socat,
            ready: srt_error.is_none() && !missing_socat,
            enforcement: ENFORCEMENT,
            capabilities: crate::capabilities(),
            sandboxed: false,
            network_enforcement: false,
            remedies: vec!["install it".into()],
            limits: Vec::new(),
        }
    }

    #[test]
    fn availability_names_what_is_missing_and_the_remedy() {
        let a = report(Some("`srt` was not found on PATH"), true).availability();
        let Availability::Unavailable { reason, remedy } = a else {
            panic!("{a:?}")
        };
        assert!(reason.contains("missing socat"), "{reason}");
        assert_eq!(remedy, "install it");
        // The srt this run would use is missing: unavailable, as `prepare` would refuse.
        let a = report(Some("`srt` was not found on PATH"), false).availability();
        let Availability::Unavailable { reason, remedy } = a else {
            panic!("{a:?}")
        };
        assert!(remedy.contains("--srt-executable"), "{remedy}");
        assert!(reason.contains("was not found on PATH"), "{reason}");
        let a = report(None, false).availability();
        let Availability::Ready { detail } = a else {
            panic!("{a:?}")
        };
        assert!(detail.starts_with("srt 1.2.3 at /usr/bin/srt"), "{detail}");
        assert!(detail.contains("not verified"), "{detail}");
    }
}
