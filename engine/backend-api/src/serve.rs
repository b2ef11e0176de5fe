//! The plugin side of the protocol: [`serve`] turns a backend's descriptor into an executable
//! agentdiff can drive (`fn main() -> ExitCode { serve(&DESCRIPTOR) }`).
//!
//! The protocol descriptors are made close-on-exec at once, so the launched command never
//! inherits them; the command gets exactly the environment of the request. The plugin makes
//! itself non-dumpable first, so a command of the same user cannot reach those descriptors through
//! `/proc/<plugin>/fd` either (root can; a command can still kill its plugin, which fails the run
//! closed with its changes recorded).

use std::future::Future;
use std::ops::ControlFlow;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::task::Poll;

use crate::protocol::{
    negotiate, options_from_wire, write_message, ErrorKind, ExitReport, LineReader, Request,
    Response, WireCommand, WireDescriptor, WireError, WireFailClosed, WireOption, WireSpec,
    FDS_ENV, PROTOCOL_VERSIONS,
};
use crate::{
    BackendDescriptor, BackendError, DynRuntimeBackend, LaunchContext, OptionKind, ReapGate,
    RunEvidence, StdioMode,
};

/// Serve `descriptor`'s backend on the protocol descriptors agentdiff passed
/// ([`FDS_ENV`](crate::protocol::FDS_ENV)) until agentdiff closes the channel. Started any other
/// way, it says what it is and exits 2.
pub fn serve(descriptor: &BackendDescriptor) -> ExitCode {
    let Some((read_fd, write_fd)) = std::env::var(FDS_ENV).ok().and_then(|v| parse_fds(&v)) else {
        eprintln!(
            "agentdiff-backend-{}: this program is an agentdiff runtime backend; run it through \
             `agentdiff run --runtime {}` (protocol: docs/backend-protocol.md)",
            descriptor.id, descriptor.id
        );
        return ExitCode::from(2);
    };
    harden_process(descriptor.id);
    for fd in [read_fd, write_fd] {
        // SAFETY: fcntl on a descriptor number; an invalid one only makes it fail.
        if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
            eprintln!("agentdiff-backend-{}: fd {fd} is not open", descriptor.id);
            return ExitCode::from(2);
        }
    }
    // SAFETY: agentdiff handed these two descriptors to this process alone, and nothing else
    // here owns them.
    let (reader, writer) = unsafe {
        (
            OwnedFd::from_raw_fd(read_fd),
            OwnedFd::from_raw_fd(write_fd),
        )
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentdiff-backend-{}: no async runtime: {e}", descriptor.id);
            return ExitCode::from(70);
        }
    };
    let mut server = Server {
        protocol: 1,
        descriptor,
        backend: (descriptor.factory)(),
        writer: std::fs::File::from(writer),
    };
    match runtime.block_on(server.run(LineReader::new(reader))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("agentdiff-backend-{}: {e}", descriptor.id);
            ExitCode::from(70)
        }
    }
}

/// Makes the plugin non-dumpable before it reads a request: a process of the same user (the
/// launched command among them) then cannot open `/proc/<plugin>/fd/*` — the protocol pipes, where
/// it could forge an `exited` report or garble the channel — nor read the plugin's memory or
/// attach to it; the kernel refuses those to a process without CAP_SYS_PTRACE. The command is not
/// affected (`execve` makes a new program dumpable again). Not defended: root, CAP_SYS_PTRACE, and
/// a command that kills the plugin (the run then fails closed, with its changes recorded).
fn harden_process(id: &str) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl with integer arguments.
        if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
            eprintln!(
                "agentdiff-backend-{id}: warning: could not make the process non-dumpable: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = id;
}

fn parse_fds(v: &str) -> Option<(RawFd, RawFd)> {
    let (r, w) = v.split_once(',')?;
    Some((r.trim().parse().ok()?, w.trim().parse().ok()?))
}

struct Server<'a> {
    descriptor: &'a BackendDescriptor,
    backend: Box<dyn DynRuntimeBackend>,
    writer: std::fs::File,
    /// The version the handshake settled on.
    protocol: u32,
}

/// Requests arrive through a reader thread so a run can be interrupted while it is awaited.
type Inbox = tokio::sync::mpsc::UnboundedReceiver<Result<Request, WireError>>;

fn start_reader(mut reader: LineReader) -> Inbox {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || loop {
        let next = reader.read_message::<Request>(None, || None);
        let fatal = matches!(
            next,
            Err(WireError::Closed | WireError::Io(_) | WireError::Oversized)
        );
        if tx.send(next).is_err() || fatal {
            return;
        }
    });
    rx
}

fn error(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error {
        kind,
        message: message.into(),
        remedy: None,
    }
}

fn backend_error(e: BackendError) -> Response {
    let kind = match &e {
        BackendError::Unavailable { .. } => ErrorKind::Unavailable,
        BackendError::InvalidRequest { .. } | BackendError::Option(_) => ErrorKind::InvalidRequest,
        BackendError::Launch { .. } => ErrorKind::Launch,
        BackendError::Runtime { .. } => ErrorKind::Runtime,
    };
    let remedy = match &e {
        BackendError::Unavailable { remedy, .. } => Some(remedy.clone()),
        _ => None,
    };
    Response::Error {
        kind,
        message: e.to_string(),
        remedy,
    }
}

impl Server<'_> {
    fn send(&mut self, response: &Response) -> Result<(), WireError> {
        write_message(&mut self.writer, response)
    }

    async fn run(&mut self, reader: LineReader) -> Result<(), WireError> {
        // A signal to agentdiff's process group (Ctrl-C without a terminal hand-over, a CI
        // cancel) must not kill the plugin before it reports: agentdiff forwards it as
        // `interrupt`. Caught, not ignored, so the command starts with default dispositions.
        absorb_group_signals();
        let mut inbox = start_reader(reader);
        // The handshake: one version, answered or refused.
        match inbox.recv().await {
            Some(Ok(Request::Hello {
                protocol,
                protocols,
            })) => match negotiate(protocol, &protocols, &PROTOCOL_VERSIONS) {
                Some(version) => {
                    self.protocol = version;
                    let id = self.descriptor.id.to_string();
                    self.send(&Response::Hello {
                        protocol: version,
                        id,
                    })?;
                }
                None => {
                    return self.send(&error(
                        ErrorKind::Protocol,
                        format!(
                            "this backend speaks protocols {PROTOCOL_VERSIONS:?}, not {protocol} \
                             (offered {protocols:?})"
                        ),
                    ));
                }
            },
            Some(Ok(_)) => {
                return self.send(&error(
                    ErrorKind::Protocol,
                    "the first request must be `hello`",
                ))
            }
            Some(Err(e)) => return self.send(&error(ErrorKind::Protocol, e.to_string())),
            None => return Ok(()),
        }
        while let Some(next) = inbox.recv().await {
            let request = match next {
                Ok(r) => r,
                Err(WireError::Closed) => return Ok(()),
                Err(e) => {
                    self.send(&error(ErrorKind::Protocol, e.to_string()))?;
                    continue;
                }
            };
            let response = match request {
                Request::Describe {} => Response::Descriptor(describe(self.descriptor)),
                Request::Capabilities { options } => Response::Capabilities {
                    capabilities: self.backend.capabilities(&options_from_wire(&options)),
                },
                Request::Availability { options } => Response::Availability {
                    availability: self
                        .backend
                        .availability(&options_from_wire(&options))
                        .await,
                },
                Request::Prepare { spec } => self.prepare(&spec),
                Request::Launch { spec, command } => {
                    // One launch per process: the exchange ends with the run.
                    return self.launch(&spec, &command, &mut inbox).await;
                }
                Request::Cleanup {
                    run_id,
                    identities,
                    grace_ms,
                } => Response::CleanupReport {
                    report: self
                        .backend
                        .cleanup_run(
                            &run_id,
                            &identities,
                            std::time::Duration::from_millis(grace_ms),
                        )
                        .await,
                },
                Request::Hello { .. } | Request::Ack {} | Request::Interrupt { .. } => {
                    error(ErrorKind::Protocol, "this request is not valid here")
                }
            };
            self.send(&response)?;
        }
        Ok(())
    }

    /// The spec as the backend sees it: a version-1 exchange has no egress proxy, whatever the
    /// message carried.
    fn spec(&self, wire: &WireSpec) -> Result<crate::LaunchSpec, WireError> {
        let mut spec = wire.to_spec()?;
        if self.protocol < 2 {
            spec.egress_proxy = None;
        }
        Ok(spec)
    }

    fn prepare(&self, spec: &WireSpec) -> Response {
        let spec = match self.spec(spec) {
            Ok(s) => s,
            Err(e) => return error(ErrorKind::Protocol, e.to_string()),
        };
        match self.backend.prepare(&spec) {
            Ok(p) => match WireCommand::from_command(p.command()) {
                Ok(command) => Response::Prepared {
                    command,
                    enforcement: p.enforcement(),
                    wrapped: p.wrapper_argv().is_some(),
                    runtime_config: p.runtime_config().clone(),
                    egress_routed: self.protocol >= 2 && p.egress_routed(),
                },
                Err(e) => error(ErrorKind::InvalidRequest, e.to_string()),
            },
            Err(e) => backend_error(e),
        }
    }

    async fn launch(
        &mut self,
        spec: &WireSpec,
        expected: &WireCommand,
        inbox: &mut Inbox,
    ) -> Result<(), WireError> {
        let spec = match self.spec(spec) {
            Ok(s) => s,
            Err(e) => return self.send(&error(ErrorKind::Protocol, e.to_string())),
        };
        let mut prepared = match self.backend.prepare(&spec) {
            Ok(p) => p,
            Err(e) => return self.send(&backend_error(e)),
        };
        if prepared.cwd().as_os_str() != expected.cwd.as_str() {
            prepared = prepared.starting_in(expected.cwd.clone().into());
        }
        // Run exactly what agentdiff recorded, or nothing.
        if WireCommand::from_command(prepared.command()).ok().as_ref() != Some(expected) {
            return self.send(&error(
                ErrorKind::Launch,
                "the command prepared now differs from the one agentdiff recorded; prepare must be \
                 a pure function of the request",
            ));
        }
        let (interrupt_tx, interrupt) = tokio::sync::watch::channel(None);
        // The backend's monitor reaps the command when it exits; the gate keeps it a zombie
        // until agentdiff has checked the identity (docs/backend-protocol.md, `ack`).
        let (reap_opener, reap_gate) = ReapGate::closed();
        let ctx = LaunchContext {
            stdio: StdioMode::Inherit,
            interrupt,
            hold_reap: Some(reap_gate),
            hold_start: false,
        };
        let running = match self.backend.launch(prepared, ctx).await {
            Ok(r) => r,
            Err(e) => return self.send(&backend_error(e)),
        };
        let facts = running.launch_facts();
        let identity = facts.root.or_else(|| {
            facts
                .pid
                .and_then(|p| agentdiff_host::process_identity::read_identity(p).ok())
        });
        let Some(identity) = identity else {
            return self.send(&error(
                ErrorKind::Launch,
                "the launched process has no identity",
            ));
        };
        self.send(&Response::Launched {
            pid: identity.pid,
            start_time_ticks: identity.start_time_ticks,
        })?;
        // The command's wait runs from here, but the monitor reaps it only once the gate opens:
        // on `ack`, on `interrupt`, or when agentdiff is gone (dropping the opener opens it).
        let mut reap_opener = Some(reap_opener);
        let mut listening = true;
        let mut waiting = std::pin::pin!(running.wait());
        let result = loop {
            // What `tokio::select!` did, without tokio's macros: the command's end first (its
            // result ends the loop), then the next request while agentdiff is there to send one.
            let woke = std::future::poll_fn(|cx| {
                if let Poll::Ready(result) = waiting.as_mut().poll(cx) {
                    return Poll::Ready(ControlFlow::Break(result));
                }
                if listening {
                    if let Poll::Ready(next) = inbox.poll_recv(cx) {
                        return Poll::Ready(ControlFlow::Continue(next));
                    }
                }
                Poll::Pending
            })
            .await;
            let next = match woke {
                ControlFlow::Break(result) => break result,
                ControlFlow::Continue(next) => next,
            };
            match next {
                Some(Ok(Request::Ack {})) => drop(reap_opener.take()),
                Some(Ok(Request::Interrupt { signal })) => {
                    let _ = interrupt_tx.send(Some(signal));
                    drop(reap_opener.take());
                }
                // agentdiff is gone: end the command as if interrupted.
                None | Some(Err(WireError::Closed)) => {
                    let _ = interrupt_tx.send(Some(libc::SIGTERM));
                    drop(reap_opener.take());
                    listening = false;
                }
                Some(Ok(_)) | Some(Err(_)) => self.send(&error(
                    ErrorKind::Protocol,
                    "only `ack` and `interrupt` are valid during a run",
                ))?,
            }
        };
        match result {
            Ok(evidence) => self.send(&Response::Exited {
                report: Box::new(report(evidence)),
            }),
            Err(e) => self.send(&backend_error(e)),
        }
    }
}

/// Catch SIGINT, SIGTERM and SIGHUP with a handler that does nothing, for the rest of the
/// process's life (as tokio's signal handlers stayed once installed). A caught signal is reset to
/// its default by `execve`, so the launched command starts with default dispositions; an ignored
/// one would stay ignored there. Where `sigaction` fails the disposition stays as it was, as a
/// failed tokio registration left it.
fn absorb_group_signals() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    extern "C" fn absorb(_: libc::c_int) {}
    // SA_RESTART: a blocking read interrupted by the signal resumes instead of failing.
    let action = SigAction::new(
        SigHandler::Handler(absorb),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        // SAFETY: the handler does nothing, so it is async-signal-safe, and it replaces only
        // the default (or inherited) disposition of these three signals, which nothing else in
        // the plugin handles.
        let _ = unsafe { sigaction(signal, &action) };
    }
}

/// The exit report of a backend's own evidence.
fn report(ev: RunEvidence) -> ExitReport {
    ExitReport {
        exit: ev.exit,
        failure: ev.failure,
        tracking: ev.tracking,
        processes: ev.processes,
        cleanup: ev.cleanup,
        ports: Some(ev.ports),
        execs: Some(ev.execs),
        facts: ev.wrapper.map(|w| (*w).clone()),
        warnings: ev.warnings,
        capabilities: Some(ev.capabilities),
        enforcement: Some(ev.enforcement),
    }
}

fn describe(d: &BackendDescriptor) -> WireDescriptor {
    let backend = (d.factory)();
    WireDescriptor {
        id: d.id.to_string(),
        summary: d.summary.to_string(),
        options: d
            .options
            .iter()
            .map(|o| {
                let (kind, choices) = match o.kind {
                    OptionKind::Text => ("text", vec![]),
                    OptionKind::Path => ("path", vec![]),
                    OptionKind::Bool => ("bool", vec![]),
                    OptionKind::Integer => ("integer", vec![]),
                    OptionKind::EnvName => ("env_name", vec![]),
                    OptionKind::Choice(c) => ("choice", c.iter().map(|s| s.to_string()).collect()),
                };
                WireOption {
                    name: o.name.to_string(),
                    kind: kind.to_string(),
                    choices,
                    help: o.help.to_string(),
                    default: o.default.map(str::to_string),
                    repeatable: o.repeatable,
                    command_line_only: o.command_line_only,
                }
            })
            .collect(),
        fail_closed: d
            .fail_closed
            .iter()
            .map(|f| WireFailClosed {
                name: f.name.to_string(),
                remove: f.remove.iter().map(|s| s.to_string()).collect(),
                set: f
                    .set
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            })
            .collect(),
        requires_scrubbed_environment: backend.requires_scrubbed_environment(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        Availability, BackendOptions, Capabilities, CleanupReport, Enforcement, LaunchCommand,
        LaunchSpec, PreparedLaunch, ProcessIdentity, RunningCommand, RuntimeBackend,
    };
    use serde_json::{json, Value};
    use std::time::Duration;

    /// Prepares `/bin/true`, says it routes through the proxy whenever its spec has one, and
    /// records in its runtime configuration whether it had one.
    struct Routing;

    impl RuntimeBackend for Routing {
        fn id(&self) -> &'static str {
            "routing"
        }
        fn capabilities(&self, _: &BackendOptions) -> Capabilities {
            Capabilities::default()
        }
        async fn availability(&self, _: &BackendOptions) -> Availability {
            Availability::Ready {
                detail: String::new(),
            }
        }
        fn prepare(&self, spec: &LaunchSpec) -> crate::Result<PreparedLaunch> {
            let command = LaunchCommand {
                program: "/bin/true".into(),
                args: Vec::new(),
                env: Vec::new(),
                cwd: spec.workdir.clone(),
            };
            // What the backend saw, for the test to read back.
            let saw = json!({ "saw_proxy": spec.egress_proxy.is_some() });
            Ok(
                PreparedLaunch::new("routing", spec, command, Enforcement::None, ())
                    .with_runtime_config(saw)
                    .routes_egress(),
            )
        }
        async fn launch(
            &self,
            _: PreparedLaunch,
            _: LaunchContext,
        ) -> crate::Result<Box<dyn RunningCommand>> {
            Err(BackendError::Launch {
                backend: "routing".into(),
                message: "not in this test".into(),
            })
        }
        async fn cleanup_run(&self, _: &str, _: &[ProcessIdentity], _: Duration) -> CleanupReport {
            CleanupReport::default()
        }
    }

    fn factory() -> Box<dyn DynRuntimeBackend> {
        Box::new(Routing)
    }

    static DESCRIPTOR: BackendDescriptor = BackendDescriptor::new("routing", "a test", factory);

    /// `hello` then a `prepare` whose spec names a proxy socket, served; the answers.
    fn serve_prepare(hello: Value) -> Vec<Value> {
        let spec = json!({
            "run_id": "r", "root": "/p", "workdir": "/p", "capsule_dir": "/p/c",
            "argv": ["true"], "env": [], "env_mode": "scrub", "grace_ms": 100,
            "poll_interval_ms": 10, "egress_proxy": "/tmp/agentdiff-egress-1-2/egress.sock",
        });
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (answers_ours, answers_theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut w = ours;
        for message in [hello, json!({"type": "prepare", "spec": spec})] {
            std::io::Write::write_all(&mut w, format!("{message}\n").as_bytes()).unwrap();
        }
        w.shutdown(std::net::Shutdown::Write).unwrap();
        let mut server = Server {
            protocol: 1,
            descriptor: &DESCRIPTOR,
            backend: factory(),
            writer: std::fs::File::from(OwnedFd::from(answers_theirs)),
        };
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(server.run(LineReader::new(OwnedFd::from(theirs))))
            .unwrap();
        drop(server);
        let mut text = String::new();
        std::io::Read::read_to_string(&mut &answers_ours, &mut text).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn a_version_2_exchange_hands_the_backend_the_proxy_and_reports_the_route() {
        let answers = serve_prepare(json!({"type": "hello", "protocol": 1, "protocols": [1, 2]}));
        assert_eq!(
            answers[0],
            json!({"type": "hello", "protocol": 2, "id": "routing"})
        );
        assert_eq!(answers[1]["type"], "prepared", "{answers:?}");
        assert_eq!(answers[1]["egress_routed"], true, "{answers:?}");
        assert_eq!(answers[1]["runtime_config"]["saw_proxy"], true);
    }

    #[test]
    fn a_version_1_exchange_never_hands_the_backend_the_proxy() {
        // An agentdiff that speaks only version 1: the socket in the message is dropped, so the
        // backend has no proxy to route through, and nothing is claimed.
        let answers = serve_prepare(json!({"type": "hello", "protocol": 1}));
        assert_eq!(
            answers[0],
            json!({"type": "hello", "protocol": 1, "id": "routing"})
        );
        assert_eq!(answers[1]["type"], "prepared", "{answers:?}");
        assert!(answers[1].get("egress_routed").is_none(), "{answers:?}");
        assert_eq!(answers[1]["runtime_config"]["saw_proxy"], false);
    }

    #[test]
    fn a_version_it_does_not_speak_is_refused() {
        let answers = serve_prepare(json!({"type": "hello", "protocol": 7, "protocols": [7]}));
        assert_eq!(answers[0]["type"], "error", "{answers:?}");
        assert_eq!(answers[0]["kind"], "protocol");
        assert_eq!(answers.len(), 1, "{answers:?}");
    }

    /// The signal bits of `field` (`SigCgt`, `SigIgn`) in a `/proc/PID/status` text.
    #[cfg(target_os = "linux")]
    fn signal_mask(status: &str, field: &str) -> u64 {
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .unwrap();
        u64::from_str_radix(line.trim(), 16).unwrap()
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn group_signals_are_caught_here_and_default_in_the_command() {
        let bits = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP]
            .iter()
            .fold(0u64, |m, s| m | 1 << (s - 1));
        absorb_group_signals();
        let ours = std::fs::read_to_string("/proc/self/status").unwrap();
        assert_eq!(signal_mask(&ours, "SigCgt") & bits, bits, "caught");
        assert_eq!(signal_mask(&ours, "SigIgn") & bits, 0, "not ignored");
        for signal in [
            nix::sys::signal::Signal::SIGHUP,
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGINT,
        ] {
            nix::sys::signal::raise(signal).unwrap();
        }
        // Still here. A program started now has every one of them at its default.
        let out = std::process::Command::new("cat")
            .arg("/proc/self/status")
            .output()
            .unwrap();
        let theirs = String::from_utf8(out.stdout).unwrap();
        assert_eq!(signal_mask(&theirs, "SigCgt") & bits, 0);
        assert_eq!(signal_mask(&theirs, "SigIgn") & bits, 0);
    }
}
