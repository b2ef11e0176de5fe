//! The schemas compiled into this crate are the ones published in docs/schemas, and what the
//! engine's protocol code sends and accepts validates against them.

use std::path::Path;

use agentdiff_backend_api::environment::EnvMode;
use agentdiff_backend_api::protocol::{
    ErrorKind, ExitReport, Request, Response, WireCommand, WireDescriptor, WireFailClosed,
    WireOption, WireSpec, WireText,
};
use agentdiff_backend_api::{Availability, Capabilities, CleanupReport, ProcessIdentity};
use agentdiff_conformance::schema::validate;
use serde_json::Value;

const SCHEMAS: &[&str] = &[
    "runtime.schema.json",
    "backend-protocol-request.schema.json",
    "backend-protocol-response.schema.json",
];

fn crate_copy(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("schemas")
            .join(name),
    )
    .unwrap()
}

#[test]
fn the_crate_copies_of_the_schemas_match_docs() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schemas");
    for name in SCHEMAS {
        let published = std::fs::read_to_string(docs.join(name)).unwrap();
        assert_eq!(
            crate_copy(name),
            published,
            "conformance/schemas/{name} differs from docs/schemas/{name}: copy the docs version \
             into the crate (it is packaged with it)"
        );
    }
}

fn schema(name: &str) -> Value {
    serde_json::from_str(&crate_copy(name)).unwrap()
}

fn assert_valid(schema: &Value, message: &impl serde::Serialize) {
    let doc = serde_json::to_value(message).unwrap();
    let v = validate(schema, &doc);
    assert!(v.is_valid(), "{doc}: {:?}", v.errors);
}

fn spec() -> WireSpec {
    WireSpec {
        run_id: "r".into(),
        root: "/p".into(),
        workdir: "/p".into(),
        capsule_dir: "/p/.agentdiff/runs/r".into(),
        argv: vec![
            "sh".into(),
            "-c".into(),
            "true".into(),
            WireText::Bytes { hex: "fffe".into() },
        ],
        env: vec![("PATH".into(), "/bin".into())],
        env_mode: EnvMode::Scrub,
        env_dropped: vec!["TOKEN".into()],
        timeout_ms: Some(5000),
        grace_ms: 2000,
        poll_interval_ms: 10,
        observe_ports: false,
        options: [("k".to_string(), vec!["v".to_string()])].into(),
        egress_proxy: Some("/tmp/agentdiff-egress-1-2/egress.sock".into()),
    }
}

fn command() -> WireCommand {
    WireCommand {
        program: "/usr/bin/nice".into(),
        args: vec!["--".into(), "true".into()],
        env: vec![],
        cwd: "/p".into(),
    }
}

#[test]
fn every_request_validates() {
    let s = schema("backend-protocol-request.schema.json");
    let identity = ProcessIdentity {
        pid: 42,
        start_time_ticks: 7,
        boot_id: "b".into(),
    };
    for r in [
        Request::Hello {
            protocol: 1,
            protocols: Vec::new(),
        },
        Request::Hello {
            protocol: 1,
            protocols: vec![1, 2],
        },
        Request::Describe {},
        Request::Capabilities {
            options: spec().options,
        },
        Request::Availability {
            options: spec().options,
        },
        Request::Prepare { spec: spec() },
        Request::Launch {
            spec: spec(),
            command: command(),
        },
        Request::Ack {},
        Request::Interrupt { signal: 2 },
        Request::Cleanup {
            run_id: "r".into(),
            identities: vec![identity],
            grace_ms: 100,
        },
    ] {
        assert_valid(&s, &r);
    }
    // And the schema is not vacuous: an unknown type is rejected.
    assert!(!validate(&s, &serde_json::json!({"type": "exec"})).is_valid());
}

#[test]
fn every_response_validates() {
    let s = schema("backend-protocol-response.schema.json");
    for r in [
        Response::Hello {
            protocol: 1,
            id: "nice".into(),
        },
        Response::Descriptor(WireDescriptor {
            id: "nice".into(),
            summary: "s".into(),
            options: vec![WireOption {
                name: "mode".into(),
                kind: "choice".into(),
                choices: vec!["a".into()],
                help: "h".into(),
                default: Some("a".into()),
                repeatable: false,
                command_line_only: true,
            }],
            fail_closed: vec![WireFailClosed {
                name: "missing".into(),
                remove: vec![],
                set: vec![("mode".into(), "b".into())],
            }],
            requires_scrubbed_environment: false,
        }),
        Response::Capabilities {
            capabilities: Capabilities::default(),
        },
        Response::Availability {
            availability: Availability::Unavailable {
                reason: "r".into(),
                remedy: "m".into(),
            },
        },
        Response::Prepared {
            command: command(),
            enforcement: Default::default(),
            wrapped: true,
            runtime_config: serde_json::json!({"niceness": "10"}),
            egress_routed: true,
        },
        Response::Launched {
            pid: 42,
            start_time_ticks: 7,
        },
        Response::Exited {
            report: Box::new(ExitReport {
                capabilities: Some(Capabilities::default()),
                ..ExitReport::default()
            }),
        },
        Response::CleanupReport {
            report: CleanupReport::default(),
        },
        Response::Error {
            kind: ErrorKind::Protocol,
            message: "m".into(),
            remedy: None,
        },
    ] {
        assert_valid(&s, &r);
    }
    assert!(!validate(&s, &serde_json::json!({"type": "telemetry"})).is_valid());
    assert!(!validate(&s, &serde_json::json!({"type": "launched", "pid": 1})).is_valid());
}

/// The labels runtime.json's schema allows for `tracking` and `cleanup.mechanism`, without the
/// `""` older capsules hold.
fn schema_enum(pointer: &str) -> Vec<String> {
    let schema: Value = serde_json::from_str(&crate_copy("runtime.schema.json")).unwrap();
    schema
        .pointer(pointer)
        .and_then(Value::as_array)
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}

fn serde_names<T: serde::Serialize>(all: &[T]) -> Vec<String> {
    all.iter()
        .map(|v| {
            serde_json::to_value(v)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

#[test]
fn the_runtime_schema_lists_exactly_the_tracking_cleanup_and_exec_labels() {
    use agentdiff_backend_api::{CleanupMechanism as C, Tracking as T};
    let tracking = [
        T::Untracked,
        T::Cgroup,
        T::SubreaperProcPoll,
        T::SubreaperProcScan,
        T::SysinfoPoll,
        T::ContainerEngine,
        T::EnvMarkerProcScan,
    ];
    assert_eq!(
        serde_names(&tracking),
        schema_enum("/properties/tracking/enum")
    );
    let cleanup = [
        C::None,
        C::Pidfd,
        C::KillWithStartTimeCheck,
        C::ContainerEngine,
    ];
    assert_eq!(
        serde_names(&cleanup),
        schema_enum("/properties/cleanup/properties/mechanism/enum")
    );
    use agentdiff_process::exec_log::ExecMechanism as E;
    // A new variant stops this from compiling until it is listed here and in the schema.
    let _all = |e: E| match e {
        E::CnProc | E::ProcPoll | E::None => (),
    };
    let execs = [E::CnProc, E::ProcPoll, E::None];
    assert_eq!(
        serde_names(&execs),
        schema_enum("/properties/execs/properties/mechanism/enum")
    );
}
