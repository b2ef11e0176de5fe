//! The container backend against an engine on "another machine", through the binary: a real
//! podman API service that shares no filesystem with the test (its own mount namespace, a
//! private `/tmp`, a loopback TCP port), reached with the docker client as users reach build hosts.
//!
//! The reproduction that made remote mode: `DOCKER_HOST=tcp://… agentdiff run --runtime container
//! --engine docker …` let the engine create an empty `/workspace`, and the run was recorded as an
//! ordinary failed run with `changes: 0`. Now that environment is refused before anything runs,
//! and with `engine-host=env` the command sees the project, its changes are captured, sealed with
//! the engine's identity and promoted.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::path::Path;
use std::process::Command;

use agentdiff_test_support::remote_engine::{start_remote_engine, RemoteEngine, REMOTE_IMAGE};
use serde_json::Value;

use super::{assert_exit, json_of, text};

/// What the test needs here, or why it cannot run.
fn missing() -> Option<String> {
    let works = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("podman", &["info", "--format", "{{.Host.OCIRuntime.Name}}"]) {
        return Some("podman (with `podman info` working; see ENVIRONMENT.md)".into());
    }
    if !works("docker", &["--version"]) {
        return Some("the docker client".into());
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox (busybox-static)".into());
    }
    if !works("unshare", &["-m", "true"]) {
        return Some("a private mount namespace (unshare -m, root) for the engine".into());
    }
    None
}

/// `agentdiff ARGS` in `root` with the docker client pointed at `url`.
fn with_engine(root: &Path, url: &str, args: &[&str]) -> std::process::Output {
    super::cmd(root, args)
        .env("DOCKER_HOST", url)
        .env_remove("CONTAINER_HOST")
        .env_remove("DOCKER_CONTEXT")
        .output()
        .unwrap()
}

/// A project under `/tmp` (which the engine's namespace replaces with its own tmpfs, so the
/// engine cannot see it) and a remote engine started beside it; `None`, a printed skip, when
/// the engine cannot run here.
fn remote_project() -> Option<(tempfile::TempDir, RemoteEngine, std::path::PathBuf)> {
    if let Some(reason) = missing() {
        agentdiff_test_support::skip(&reason);
        return None;
    }
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let root = dir.path().join("project");
    fs::create_dir_all(&root).unwrap();
    Some((dir, engine, root))
}

#[test]
fn an_engine_elsewhere_is_refused_unless_named_and_then_runs_on_the_shipped_workspace() {
    let Some((_dir, engine, root)) = remote_project() else {
        return;
    };
    fs::write(root.join("a.txt"), "a before\n").unwrap();
    fs::write(root.join("del.txt"), "delete me\n").unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--format",
            "json",
            "--fail-on",
            "never",
            "--runtime",
            "container",
            "--engine",
            "docker",
            "--image",
            REMOTE_IMAGE,
        ];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[
            "--",
            "sh",
            "-c",
            "cat a.txt > seen.txt && rm del.txt && echo new > new.txt",
        ]);
        with_engine(&root, &engine.url, &args)
    };

    // The reproduction: an engine reached through DOCKER_HOST without `engine-host` is refused
    // before anything runs, naming the variable and the remedy.
    let refused = run(&[]);
    assert_exit(&refused, 64);
    let stderr = text(&refused.stderr);
    assert!(
        stderr.contains("DOCKER_HOST") && stderr.contains("engine-host=env"),
        "{stderr}"
    );
    let listed = with_engine(&root, &engine.url, &["runs", "--format", "json"]);
    assert_exit(&listed, 0);
    assert_eq!(
        json_of(&listed),
        serde_json::json!([]),
        "no run was recorded"
    );

    // Named: the command saw the project (a.txt was shipped in), and its changes came back.
    let out = run(&["--backend-option", "engine-host=env"]);
    assert_exit(&out, 0);
    let result = json_of(&out);
    assert_eq!(result["exit_code"], 0, "{result:#}");
    let mut changed = super::changed_paths(&result);
    changed.sort();
    assert_eq!(changed, ["del.txt", "new.txt", "seen.txt"], "{result:#}");
    // A private workspace: the project itself is untouched until promote.
    assert!(!root.join("seen.txt").exists() && root.join("del.txt").exists());
    let id = result["run_id"].as_str().unwrap();
    let runtime = runtime_json(&root, id);
    assert_eq!(runtime["capabilities"]["host_repository"], "enforced");
    assert_eq!(
        runtime["wrapper"]["remote"]["engine"]["endpoint"],
        engine.url
    );
    assert_exit(&with_engine(&root, &engine.url, &["verify", id]), 0);

    // Rollback has nothing to undo in the project; promote applies the shipped-back changes.
    let rollback = with_engine(&root, &engine.url, &["rollback", id, "--all"]);
    assert_exit(&rollback, 64);
    assert!(
        text(&rollback.stderr).contains("promote"),
        "{}",
        text(&rollback.stderr)
    );
    let promoted = with_engine(&root, &engine.url, &["promote", id, "--all"]);
    assert_exit(&promoted, 0);
    assert_eq!(
        fs::read_to_string(root.join("seen.txt")).unwrap(),
        "a before\n"
    );
    assert_eq!(fs::read_to_string(root.join("new.txt")).unwrap(), "new\n");
    assert!(!root.join("del.txt").exists());

    // Nothing is left on the engine.
    let left = Command::new("podman")
        .args(["--url", &engine.url, "ps", "-a", "-q"])
        .output()
        .unwrap();
    assert_eq!(text(&left.stdout).trim(), "");
    drop(engine);
}

/// The run's sealed `runtime.json`.
fn runtime_json(root: &Path, id: &str) -> Value {
    let path = root.join(".agentdiff/runs").join(id).join("runtime.json");
    serde_json::from_slice(&fs::read(&path).unwrap()).unwrap()
}

/// A remote run whose agentdiff is killed mid-command leaves its container on the engine it ran
/// on. `agentdiff cleanup RUN`, with no engine address in its own environment, reaches that
/// engine from the run's authenticated `launched` event, removes the container and checks it is
/// gone.
#[test]
fn cleanup_of_a_killed_remote_run_removes_its_container_on_the_recorded_engine() {
    let Some((_dir, engine, root)) = remote_project() else {
        return;
    };
    fs::write(root.join("a.txt"), "a\n").unwrap();
    let endpoint = format!("engine-host={}", engine.url);
    let mut run = super::cmd(
        &root,
        &[
            "run",
            "--runtime",
            "container",
            "--engine",
            "docker",
            "--image",
            REMOTE_IMAGE,
            "--backend-option",
            &endpoint,
            "--",
            "sleep",
            "300",
        ],
    )
    .env_remove("DOCKER_HOST")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap();
    let listed = || {
        let out = Command::new("podman")
            .args(["--url", &engine.url, "ps", "-a", "-q", "--no-trunc"])
            .output()
            .unwrap();
        text(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Not a timing assertion: how long this test waits for the container to start at all.
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let running = loop {
        let out = Command::new("podman")
            .args(["--url", &engine.url, "ps", "-q", "--no-trunc"])
            .output()
            .unwrap();
        let ids = text(&out.stdout);
        if let Some(id) = ids.lines().next() {
            break id.to_string();
        }
        assert!(
            std::time::Instant::now() < give_up && run.try_wait().unwrap().is_none(),
            "the remote container never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    run.kill().unwrap();
    run.wait().unwrap();
    assert_eq!(
        listed(),
        std::slice::from_ref(&running),
        "the killed run left its container"
    );

    let id = fs::read_dir(root.join(".agentdiff/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| !n.starts_with('.'))
        .expect("the killed run's capsule");
    let out = super::cmd(
        &root,
        &["cleanup", &id, "--format", "json", "--grace-period", "1"],
    )
    .env_remove("DOCKER_HOST")
    .env_remove("CONTAINER_HOST")
    .output()
    .unwrap();
    assert_exit(&out, 0);
    let result = json_of(&out);
    let removed = result["cleanup"]["resources_removed"].to_string();
    assert!(
        removed.contains(&running) && removed.contains(&engine.url),
        "{result:#}"
    );
    assert_eq!(listed(), Vec::<String>::new(), "{result:#}");
    drop(engine);
}

/// Certificates for a TLS engine: a CA, a server certificate for 127.0.0.1 and a client
/// certificate, laid out as the docker client reads them (`ca.pem`, `cert.pem`, `key.pem` in
/// `client/`), the server's in `server/`. A second, unrelated CA goes to `stranger/ca.pem`.
fn make_certificates(dir: &Path) {
    let script = r#"
set -e
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:prime256v1 -out "$1" 2>/dev/null; }
mkdir -p ca client server stranger
key ca/key.pem
openssl req -x509 -new -key ca/key.pem -days 2 -subj /CN=agentdiff-test-ca -out ca/ca.pem
key stranger/key.pem
openssl req -x509 -new -key stranger/key.pem -days 2 -subj /CN=agentdiff-test-ca -out stranger/ca.pem
sign() {
  openssl req -new -key "$1" -subj "/CN=$2" -out req.csr
  printf '%s\n' "$3" > ext.cnf
  openssl x509 -req -in req.csr -CA ca/ca.pem -CAkey ca/key.pem -CAcreateserial -days 2 \
    -extfile ext.cnf -out "$4" 2>/dev/null
}
key server/key.pem
sign server/key.pem 127.0.0.1 'subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth' server/cert.pem
key client/key.pem
sign client/key.pem client 'extendedKeyUsage=clientAuth' client/cert.pem
cp ca/ca.pem client/ca.pem
cp client/cert.pem client/key.pem stranger/
"#;
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// A TLS front (socat) for the engine at `url`, verifying client certificates; killed on drop.
struct TlsFront {
    child: std::process::Child,
    url: String,
}

impl TlsFront {
    fn start(certs: &Path, url: &str) -> TlsFront {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = certs.join("server");
        let listen = format!(
            "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={},key={},cafile={},verify=1",
            server.join("cert.pem").display(),
            server.join("key.pem").display(),
            certs.join("ca/ca.pem").display()
        );
        let target = format!("TCP:{}", url.trim_start_matches("tcp://"));
        let child = Command::new("socat")
            .args([listen.as_str(), target.as_str()])
            .stdin(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Not a timing assertion: how long this test waits for socat to listen at all.
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        TlsFront {
            child,
            url: format!("tcp://127.0.0.1:{port}"),
        }
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A remote engine behind TLS with client certificates: with the right CA the run works and the
/// capsule names the TLS material by digest, with no plain-TCP warning; a client that trusts
/// another CA is refused before anything is created, and nothing runs.
#[test]
fn a_tls_engine_is_reached_with_verified_certificates_and_recorded() {
    if let Some(reason) = missing() {
        agentdiff_test_support::skip(&reason);
        return;
    }
    let works = |program: &str, arg: &str| {
        Command::new(program)
            .arg(arg)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works("socat", "-V") || !works("openssl", "version") {
        agentdiff_test_support::skip("socat and openssl (a TLS front for the engine)");
        return;
    }
    let dir = tempfile::Builder::new().tempdir_in("/tmp").unwrap();
    let engine = start_remote_engine(dir.path());
    let certs = dir.path().join("certs");
    fs::create_dir_all(&certs).unwrap();
    make_certificates(&certs);
    let front = TlsFront::start(&certs, &engine.url);
    let root = dir.path().join("project");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("a.txt"), "a\n").unwrap();
    let run = |cert_path: &Path| {
        super::cmd(
            &root,
            &[
                "run",
                "--format",
                "json",
                "--fail-on",
                "never",
                "--runtime",
                "container",
                "--engine",
                "docker",
                "--image",
                REMOTE_IMAGE,
                "--backend-option",
                "engine-host=env",
                "--",
                "sh",
                "-c",
                "cat a.txt > seen.txt",
            ],
        )
        .env("DOCKER_HOST", &front.url)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", cert_path)
        .output()
        .unwrap()
    };

    // A client that trusts another authority: refused with what to check, nothing created.
    let refused = run(&certs.join("stranger"));
    assert_exit(&refused, 69);
    let said = format!("{}{}", text(&refused.stdout), text(&refused.stderr));
    assert!(
        said.contains(&format!("cannot reach the engine at {}", front.url))
            && said.contains("certificate")
            && said.contains("DOCKER_CERT_PATH"),
        "{said}"
    );
    let left = Command::new("podman")
        .args(["--url", &engine.url, "ps", "-a", "-q"])
        .output()
        .unwrap();
    assert_eq!(text(&left.stdout).trim(), "");

    // The right authority: the run works over TLS and the capsule says so.
    let client = certs.join("client");
    let out = run(&client);
    assert_exit(&out, 0);
    let result = json_of(&out);
    assert_eq!(super::changed_paths(&result), ["seen.txt"], "{result:#}");
    let runtime = runtime_json(&root, result["run_id"].as_str().unwrap());
    let tls = &runtime["wrapper"]["remote"]["engine"]["tls"];
    assert_eq!(tls["verify"], true, "{runtime:#}");
    let sha = |path: &Path| {
        let out = Command::new("sha256sum").arg(path).output().unwrap();
        text(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(tls["ca_sha256"], sha(&client.join("ca.pem")).as_str());
    assert_eq!(
        tls["client_cert_sha256"],
        sha(&client.join("cert.pem")).as_str()
    );
    assert!(
        !runtime
            .to_string()
            .contains("plain TCP without verified TLS"),
        "{runtime:#}"
    );
    drop(front);
    drop(engine);
}

/// A project's policy file alone cannot send the project to another engine: a cloned
/// repository's `agentdiff.yaml` naming `engine-host` is refused before anything runs (no engine
/// is contacted, nothing is recorded); the same address given on the command line is the user's
/// choice and goes past that check.
#[test]
fn a_policy_file_alone_cannot_choose_a_remote_engine() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    fs::write(root.join(".env"), "SECRET=hunter2\n").unwrap();
    fs::write(
        root.join("agentdiff.yaml"),
        "version: 2\nruntime:\n  backend: container\n  options:\n    image: localhost/x:1\n    \
         engine-host: tcp://127.0.0.1:9\n",
    )
    .unwrap();
    let out = super::agentdiff(root, &["run", "--", "true"]);
    assert_exit(&out, 64);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("`engine-host`") && stderr.contains("--backend-option engine-host="),
        "{stderr}"
    );
    assert!(!root.join(".agentdiff/runs").exists(), "a run was recorded");
    let args = [
        "run",
        "--backend-option",
        "engine-host=tcp://127.0.0.1:9",
        "--",
        "true",
    ];
    let out = super::agentdiff(root, &args);
    assert!(
        !text(&out.stderr).contains("a policy file alone"),
        "{}",
        text(&out.stderr)
    );
}

/// `agentdiff run` against the engine in the background, its output discarded.
fn spawn_remote_run(root: &Path, url: &str, script: &str) -> std::process::Child {
    let endpoint = format!("engine-host={url}");
    super::cmd(
        root,
        &[
            "run",
            "--runtime",
            "container",
            "--engine",
            "docker",
            "--image",
            REMOTE_IMAGE,
            "--backend-option",
            &endpoint,
            "--",
            "sh",
            "-c",
            script,
        ],
    )
    .env_remove("DOCKER_HOST")
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .unwrap()
}

/// Lines `podman --url URL ARGS` prints.
fn engine_lines(url: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new("podman")
        .arg("--url")
        .arg(url)
        .args(args)
        .output()
        .unwrap();
    text(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Poll (every 10 ms, up to 120 s: not a timing assertion) until `ready`, failing if the run ended.
fn wait_for(run: &mut std::process::Child, what: &str, mut ready: impl FnMut() -> bool) {
    let give_up = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !ready() {
        assert!(
            std::time::Instant::now() < give_up && run.try_wait().unwrap().is_none(),
            "{what} never happened"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// The only capsule in `root`.
fn only_run(root: &Path) -> String {
    fs::read_dir(root.join(".agentdiff/runs"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| !n.starts_with('.'))
        .expect("the killed run's capsule")
}

/// A remote run killed while its workspace is shipped in (its container created, no `launched`
/// event yet) has no record of its engine. `agentdiff cleanup`, given the engine through its own
/// environment, removes the container by the run's label together with its workspace volume (a
/// copy of the project), and the engine lists neither afterwards.
#[test]
fn cleanup_of_a_remote_run_killed_before_its_launch_removes_its_container_and_volume() {
    let Some((_dir, engine, root)) = remote_project() else {
        return;
    };
    // Enough to ship that the run can be caught between `create` and the start.
    for i in 0..60 {
        fs::write(root.join(format!("f{i}.bin")), vec![i as u8; 1 << 20]).unwrap();
    }
    let mut run = spawn_remote_run(&root, &engine.url, "true");
    wait_for(&mut run, "the container's creation", || {
        !engine_lines(&engine.url, &["ps", "-a", "-q"]).is_empty()
    });
    // SAFETY: kill(2) on the child this test spawned and has not reaped.
    unsafe {
        libc::kill(run.id() as i32, libc::SIGSTOP);
    }
    let id = only_run(&root);
    let events = fs::read_to_string(root.join(".agentdiff/runs").join(&id).join("events.jsonl"))
        .unwrap_or_default();
    let before_launch = !events.contains("\"launched\"");
    // Which cleanup path this exercised (the engine's timing decides; both must leave nothing).
    eprintln!("killed before its launched event: {before_launch}");
    run.kill().unwrap();
    run.wait().unwrap();
    let volumes = engine_lines(&engine.url, &["volume", "ls", "-q"]);
    assert!(!volumes.is_empty(), "the killed run left no volume");

    let out = super::cmd(
        &root,
        &["cleanup", &id, "--format", "json", "--grace-period", "1"],
    )
    .env("DOCKER_HOST", &engine.url)
    .env_remove("CONTAINER_HOST")
    .output()
    .unwrap();
    let result = json_of(&out);
    assert_eq!(
        engine_lines(&engine.url, &["ps", "-a", "-q"]),
        Vec::<String>::new(),
        "{result:#}"
    );
    assert_eq!(
        engine_lines(&engine.url, &["volume", "ls", "-q"]),
        Vec::<String>::new(),
        "the workspace volume is left (killed before launch: {before_launch}): {result:#}"
    );
    let removed = result["cleanup"]["resources_removed"].to_string();
    assert!(removed.contains(&volumes[0]), "{result:#}");
    assert_exit(&out, 0);
    drop(engine);
}

/// A remote run killed while the workspace is shipped back leaves a partial copy next to its
/// private workspace; `agentdiff cleanup` removes it and says so.
#[test]
fn cleanup_of_a_remote_run_killed_during_ship_out_removes_its_staging_directory() {
    let Some((_dir, engine, root)) = remote_project() else {
        return;
    };
    fs::write(root.join("a.txt"), "a\n").unwrap();
    let mut run = spawn_remote_run(
        &root,
        &engine.url,
        "for i in 1 2 3 4 5 6; do dd if=/dev/zero of=big$i bs=1M count=30 2>/dev/null; done",
    );
    let workspaces = root.join(".agentdiff/workspaces");
    let staging = || {
        fs::read_dir(&workspaces)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .find(|p| p.to_string_lossy().contains(".shipped-"))
    };
    wait_for(&mut run, "the ship-out", || {
        staging().is_some_and(|p| fs::read_dir(p).is_ok_and(|mut d| d.next().is_some()))
    });
    run.kill().unwrap();
    run.wait().unwrap();
    let left = staging().expect("the killed run left its staging directory");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::symlink_metadata(&left).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let id = only_run(&root);
    let out = super::cmd(
        &root,
        &["cleanup", &id, "--format", "json", "--grace-period", "1"],
    )
    .env_remove("DOCKER_HOST")
    .env_remove("CONTAINER_HOST")
    .output()
    .unwrap();
    let result = json_of(&out);
    assert_exit(&out, 0);
    assert!(!left.exists(), "{result:#}");
    let name = left.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        result["cleanup"]["resources_removed"]
            .to_string()
            .contains(&name),
        "{result:#}"
    );
    let mut rest: Vec<_> = fs::read_dir(&workspaces)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    rest.retain(|n| n.to_string_lossy().contains(&id));
    assert!(rest.is_empty(), "{rest:?}");
    assert_eq!(
        engine_lines(&engine.url, &["ps", "-a", "-q"]),
        Vec::<String>::new()
    );
    drop(engine);
}
