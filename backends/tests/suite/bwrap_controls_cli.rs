//! Each control of the bwrap sandbox retried by other routes than the obvious one: the key
//! directory wherever agentdiff keeps it, writes outside the root through symlinks and renames,
//! credentials through symlinks, host listeners on every address family, the policy's deny
//! paths, the `hide` and `writable` options, and the fail-closed paths (user namespaces refused,
//! as bwrap reports it and as the kernel switches say it).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::process::Output;

use agentdiff_test_support::fake_podman;
use serde_json::Value;

use super::bwrap_cli::{no_bwrap, Fixture, Listener};

/// Outcome of each attempt, by name: `true` when the shell command succeeded in the sandbox.
pub(super) type Outcomes = BTreeMap<String, bool>;

/// Runs every attempt (name, shell command) inside the sandbox as `sh attempts.sh`; each one
/// appends `name=ok` or `name=fail` to report.txt in the root.
pub(super) fn attempt(
    f: &Fixture,
    extra: &[&str],
    env: &[(&str, &str)],
    tries: &[(&str, String)],
) -> (Outcomes, Value, Output) {
    let mut script = String::from(
        "r=report.txt\n: > $r\ntry() { if sh -c \"$2\" >/dev/null 2>&1; then echo \"$1=ok\" >> $r; \
         else echo \"$1=fail\" >> $r; fi; }\n",
    );
    for (name, cmd) in tries {
        script.push_str(&format!("try {name} '{}'\n", cmd.replace('\'', r"'\''")));
    }
    fs::write(f.root().join("attempts.sh"), script).unwrap();
    let mut args = vec!["--fail-on", "never"];
    args.extend_from_slice(extra);
    let (code, result, out) = f.run(&args, &["sh", "attempts.sh"], env);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(code, 0, "the run failed: {stderr}");
    let report = fs::read_to_string(f.root().join("report.txt"))
        .unwrap_or_else(|e| panic!("no report ({e}); stderr {stderr}"));
    let outcomes: Outcomes = report
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v == "ok"))
        .collect();
    assert_eq!(outcomes.len(), tries.len(), "{report}; stderr {stderr}");
    (outcomes, result, out)
}

/// Asserts every attempt named in `expected` had that outcome.
pub(super) fn expect(outcomes: &Outcomes, expected: &[(&str, bool)]) {
    for (name, ok) in expected {
        assert_eq!(
            outcomes.get(*name),
            Some(ok),
            "{name} should have {}: {outcomes:?}",
            if *ok { "succeeded" } else { "failed" }
        );
    }
}

/// A scratch directory outside the project, `$TMPDIR` and the fixture's home.
pub(super) fn var_tmp(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .unwrap()
}

pub(super) fn hidden_paths(rt: &Value) -> Vec<String> {
    rt["wrapper"]["controls"]["credentials"]["hidden"]
        .as_array()
        .unwrap_or_else(|| panic!("no hidden list: {rt:#}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

pub(super) fn mounts(rt: &Value) -> Vec<(String, String)> {
    rt["runtime_config"]["mounts"]
        .as_array()
        .unwrap_or_else(|| panic!("no mounts: {rt:#}"))
        .iter()
        .map(|m| {
            (
                m["kind"].as_str().unwrap().to_string(),
                m["path"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

pub(super) fn canonical(p: &Path) -> String {
    p.canonicalize().unwrap().to_string_lossy().into_owned()
}

/// The attempts on a key directory: its key and ledger unreadable, nothing listed, nothing
/// written.
fn key_dir_attempts(tag: &str, dir: &Path) -> Vec<(String, String)> {
    let d = dir.display();
    vec![
        (format!("{tag}_key"), format!("cat {d}/seal.key")),
        (format!("{tag}_ledger"), format!("cat {d}/ledger.jsonl")),
        (format!("{tag}_list"), format!("[ -n \"$(ls -A {d})\" ]")),
        (format!("{tag}_write"), format!("echo x > {d}/planted")),
    ]
}

/// A custom AGENTDIFF_STATE_DIR (created by this very run), one below a symlinked directory, and
/// the XDG_STATE_HOME location: the key directory is an empty, read-only directory inside the
/// sandbox, by its own path and by its target's.
#[test]
fn the_key_directory_is_hidden_wherever_agentdiff_keeps_it() {
    if no_bwrap() {
        return;
    }
    let base = var_tmp("agentdiff-bwrap-state-");
    let fresh = base.path().join("fresh/state");
    // agentdiff refuses a key directory that is itself a symlink; one below a symlinked
    // directory is reached by two paths.
    let real_parent = base.path().join("real");
    fs::create_dir(&real_parent).unwrap();
    let link_parent = base.path().join("link");
    std::os::unix::fs::symlink(&real_parent, &link_parent).unwrap();
    let link = link_parent.join("state");
    let real = real_parent.join("state");
    let xdg = base.path().join("xdg");
    // (tag, agentdiff's variable, its value, the key directory, the paths tried inside)
    let cases = [
        (
            "fresh",
            "AGENTDIFF_STATE_DIR",
            fresh.clone(),
            fresh.clone(),
            vec![fresh.clone()],
        ),
        (
            "symlinked",
            "AGENTDIFF_STATE_DIR",
            link.clone(),
            real.clone(),
            vec![link.clone(), real.clone()],
        ),
        (
            "xdg",
            "XDG_STATE_HOME",
            xdg.clone(),
            xdg.join("agentdiff"),
            vec![xdg.join("agentdiff")],
        ),
    ];
    for (tag, var, value, key_dir, routes) in cases {
        let f = Fixture::new();
        let env_str = vec![(var, value.to_str().unwrap())];
        let mut cmd = super::cmd(
            f.root(),
            &["run", "--runtime", "bwrap", "--fail-on", "never"],
        );
        cmd.env("HOME", f.home.path());
        if tag == "xdg" {
            cmd.env_remove("AGENTDIFF_STATE_DIR");
        }
        for (k, v) in &env_str {
            cmd.env(k, v);
        }
        if tag != "fresh" {
            // The key exists before the run that tries to read it.
            let out = cmd.arg("--").arg("true").output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{tag}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let tries: Vec<(String, String)> = routes
            .iter()
            .enumerate()
            .flat_map(|(i, r)| key_dir_attempts(&format!("{tag}{i}"), r))
            .collect();
        let tries: Vec<(&str, String)> =
            tries.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
        let mut run_env = env_str.clone();
        if tag == "xdg" {
            // An empty value counts as unset for the store: the XDG location decides.
            run_env.push(("AGENTDIFF_STATE_DIR", ""));
        }
        let (outcomes, result, _) = attempt(&f, &[], &run_env, &tries);
        for (name, _) in &tries {
            expect(&outcomes, &[(name, false)]);
        }
        assert!(
            key_dir.join("seal.key").is_file(),
            "{tag}: the run sealed with {key_dir:?}"
        );
        assert!(!key_dir.join("planted").exists(), "{tag}");
        let rt = f.runtime_json(&result);
        assert!(
            hidden_paths(&rt).contains(&canonical(&key_dir)),
            "{tag}: {key_dir:?} not hidden: {rt:#}"
        );
    }
}

/// Writes outside the root fail by every route; the private /tmp takes writes that vanish.
#[test]
fn writes_outside_the_root_fail_by_every_route() {
    if no_bwrap() {
        return;
    }
    // The project outside $TMPDIR, so that the directory next to it is on the host (next to a
    // root in /tmp it would be in the sandbox's private /tmp).
    let parent = var_tmp("agentdiff-bwrap-parent-");
    let f = Fixture::new_in(parent.path());
    let outside = var_tmp("agentdiff-bwrap-outside-");
    let home = f.home.path().display().to_string();
    fs::write(f.home.path().join(".profile"), "# profile\n").unwrap();
    let sibling = f.root().parent().unwrap().join(format!(
        "{}-sibling",
        f.root().file_name().unwrap().to_string_lossy()
    ));
    let o = outside.path().display();
    let s = sibling.display();
    let private = format!("/tmp/agentdiff-private-{}", std::process::id());
    let tries = [
        ("var_tmp", format!("echo x > {o}/direct")),
        (
            "var_tmp_symlink",
            format!("ln -s {o} vt && echo x > vt/via-link"),
        ),
        ("var_tmp_mkdir", format!("mkdir {o}/newdir")),
        ("home_new", format!("echo x > {home}/new-file")),
        ("home_append", format!("echo x >> {home}/.profile")),
        ("home_mkdir", format!("mkdir -p {home}/.config/autostart")),
        ("sibling", format!("mkdir {s}")),
        ("git_config", "echo x >> .git/config".into()),
        (
            "git_hook",
            "mkdir -p .git/hooks && echo x > .git/hooks/post-commit".into(),
        ),
        ("git_head", "echo ref: refs/heads/evil > .git/HEAD".into()),
        ("git_rename", "mv .git .git-old".into()),
        ("git_remove", "rm -rf .git".into()),
        ("store_new", "echo x > .agentdiff/planted".into()),
        ("store_remove", "rm -rf .agentdiff/runs".into()),
        ("store_rename", "mv .agentdiff .agentdiff-old".into()),
        ("tmp_private", format!("echo x > {private}")),
        ("inside", "echo x > inside.txt".into()),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    for (name, _) in &tries {
        let ok = matches!(*name, "tmp_private" | "inside");
        expect(&outcomes, &[(name, ok)]);
    }
    assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
    assert!(!sibling.exists());
    assert!(
        !Path::new(&private).exists(),
        "the sandbox's /tmp is its own"
    );
    assert_eq!(
        fs::read_to_string(f.home.path().join(".profile")).unwrap(),
        "# profile\n"
    );
    assert_eq!(
        fs::read_to_string(f.root().join(".git/HEAD")).unwrap(),
        "ref: refs/heads/main\n"
    );
    assert!(!f.root().join(".git/hooks").exists());
    assert!(!f.root().join(".agentdiff/planted").exists());
    // The symlink the command left in the root is a recorded change.
    let changes = result["changes"].as_array().unwrap();
    assert!(changes.iter().any(|c| c["path"] == "vt"), "{result:#}");
}

/// Credential locations cannot be read by path, through a symlink the command plants, or at a
/// symlinked location's target; a hidden file reads as empty.
#[test]
fn credentials_stay_unreadable_by_every_route() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let h = f.home.path();
    fs::create_dir_all(h.join(".aws")).unwrap();
    fs::write(h.join(".aws/credentials"), "AWS-CANARY\n").unwrap();
    fs::write(h.join(".netrc"), "machine x password NETRC-CANARY\n").unwrap();
    // ~/.kube is a symlink to a directory elsewhere: hidden at its target.
    let kube_target = var_tmp("agentdiff-bwrap-kube-");
    fs::write(kube_target.path().join("config"), "KUBE-CANARY\n").unwrap();
    std::os::unix::fs::symlink(kube_target.path(), h.join(".kube")).unwrap();
    let home = h.display();
    let kt = kube_target.path().display();
    let tries = [
        ("ssh_direct", format!("grep -q CANARY {home}/.ssh/id_test")),
        ("ssh_list", format!("ls {home}/.ssh | grep -q id_test")),
        (
            "ssh_symlink",
            format!("ln -s {home}/.ssh/id_test key && grep -q CANARY key"),
        ),
        ("ssh_tilde", "grep -q CANARY ~/.ssh/id_test".into()),
        ("aws", format!("grep -q CANARY {home}/.aws/credentials")),
        ("netrc", format!("grep -q CANARY {home}/.netrc")),
        ("kube_link", format!("grep -q CANARY {home}/.kube/config")),
        ("kube_target", format!("grep -q CANARY {kt}/config")),
        ("ssh_plant", format!("echo x > {home}/.ssh/authorized_keys")),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    for (name, _) in &tries {
        expect(&outcomes, &[(name, false)]);
    }
    assert!(!h.join(".ssh/authorized_keys").exists());
    let hidden = hidden_paths(&f.runtime_json(&result));
    for p in [
        h.join(".ssh"),
        h.join(".aws"),
        h.join(".netrc"),
        kube_target.path().to_path_buf(),
    ] {
        assert!(hidden.contains(&canonical(&p)), "{p:?} not in {hidden:?}");
    }
}

/// The first non-loopback IPv4 address of this host, if it has one.
fn host_address() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // No packet is sent: connecting a UDP socket only picks the route and the source address.
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// No listener of the host is reachable: IPv4 and IPv6 loopback, the host's own address, and an
/// abstract Unix socket (which lives in the network namespace, not the filesystem).
#[test]
fn no_host_listener_is_reachable_from_the_sandbox() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let v4 = Listener::new();
    let v6 = std::net::TcpListener::bind("[::1]:0").ok();
    let own = host_address().and_then(|ip| std::net::TcpListener::bind((ip, 0)).ok());
    let abstract_name = format!("agentdiff-bwrap-test-{}", std::process::id());
    let abs = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(&abstract_name).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    for l in v6.iter().chain(own.iter()) {
        l.set_nonblocking(true).unwrap();
    }
    abs.set_nonblocking(true).unwrap();
    let mut tries = vec![(
        "loopback_v4",
        format!("exec 3<>/dev/tcp/127.0.0.1/{}", v4.port()),
    )];
    if let Some(l) = &v6 {
        let port = l.local_addr().unwrap().port();
        tries.push(("loopback_v6", format!("exec 3<>/dev/tcp/::1/{port}")));
    }
    if let Some(l) = &own {
        let a = l.local_addr().unwrap();
        tries.push((
            "host_address",
            format!("exec 3<>/dev/tcp/{}/{}", a.ip(), a.port()),
        ));
    }
    tries.push((
        "abstract_unix",
        format!(
            "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); \
             s.connect(chr(0) + '{abstract_name}')\""
        ),
    ));
    // bash for /dev/tcp: run every attempt under bash.
    let tries: Vec<(&str, String)> = tries
        .into_iter()
        .map(|(n, c)| (n, format!("bash -c {}", shell_quote(&c))))
        .collect();
    let (outcomes, _, _) = attempt(&f, &[], &[], &tries);
    for (name, _) in &tries {
        expect(&outcomes, &[(name, false)]);
    }
    assert!(!v4.was_connected());
    for l in v6.iter().chain(own.iter()) {
        assert!(l.accept().is_err(), "{:?} was reached", l.local_addr());
    }
    assert!(abs.accept().is_err(), "the abstract socket was reached");
    // The same attempts reach every listener from the host: each one can fail the test.
    for (name, c) in &tries {
        let out = std::process::Command::new("sh")
            .args(["-c", c])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name} does not connect even from the host: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(v4.was_connected());
    for l in v6.iter().chain(own.iter()) {
        assert!(
            l.accept().is_ok(),
            "{:?} was not reached from the host",
            l.local_addr()
        );
    }
    assert!(abs.accept().is_ok());
}

fn shell_quote(s: &str) -> String {
    format!(
        "\"{}\"",
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('$', "\\$")
    )
}

/// The policy's literal deny paths are re-bound read-only (directories, files, nested ones);
/// a sibling stays writable; a wildcard pattern is listed as not applied and decided after the
/// run.
#[test]
fn policy_deny_paths_are_read_only_in_the_sandbox() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let r = f.root();
    fs::create_dir_all(r.join("secrets")).unwrap();
    fs::write(r.join("secrets/a"), "a\n").unwrap();
    fs::write(r.join(".env"), "TOKEN=1\n").unwrap();
    fs::create_dir_all(r.join("config/prod")).unwrap();
    fs::create_dir_all(r.join("config/dev")).unwrap();
    fs::write(r.join("config/prod/db.yaml"), "db\n").unwrap();
    fs::write(
        r.join("agentdiff.yaml"),
        "version: 2\nfilesystem:\n  deny: [\"secrets/**\", .env, \"config/prod/**\", \"**/*.pem\"]\n",
    )
    .unwrap();
    let tries = [
        ("secrets_new", "echo x > secrets/new"),
        ("secrets_edit", "echo x >> secrets/a"),
        ("secrets_remove", "rm -rf secrets"),
        ("env_edit", "echo x >> .env"),
        ("env_remove", "rm -f .env"),
        ("env_replace", "echo x > e2 && mv e2 .env"),
        ("prod_new", "echo x > config/prod/new"),
        ("prod_rename", "mv config/prod config/prod-old"),
        ("dev_new", "echo x > config/dev/new"),
        ("pem_new", "echo x > key.pem"),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.to_string())).collect();
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    for (name, _) in &tries {
        let ok = matches!(*name, "dev_new" | "pem_new");
        expect(&outcomes, &[(name, ok)]);
    }
    assert_eq!(fs::read_to_string(r.join(".env")).unwrap(), "TOKEN=1\n");
    assert_eq!(fs::read_to_string(r.join("secrets/a")).unwrap(), "a\n");
    assert!(r.join("config/prod/db.yaml").exists());
    let rt = f.runtime_json(&result);
    let m = mounts(&rt);
    for p in ["secrets", ".env", "config/prod"] {
        let want = ("read_only".to_string(), canonical(&r.join(p)));
        assert!(m.contains(&want), "{want:?} not in {m:?}");
    }
    let not_applied = rt["runtime_config"]["not_applied"].to_string();
    assert!(not_applied.contains("**/*.pem"), "{not_applied}");
    // The wildcard is decided after the run: the new .pem is a denied change.
    let pem = result["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "key.pem")
        .unwrap_or_else(|| panic!("{result:#}"));
    assert_eq!(pem["decision"], "deny", "{pem:#}");
}

/// `runtime.bwrap.hide` hides extra files and directories (in the home, by `~/`, and absolute);
/// `runtime.bwrap.writable` opens extra paths, but not what is hidden or protected inside them.
#[test]
fn hide_and_writable_options_extend_the_sandbox() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let h = f.home.path();
    let extra = var_tmp("agentdiff-bwrap-extra-");
    let e = extra.path();
    fs::create_dir_all(h.join(".config/my-tool")).unwrap();
    fs::write(h.join(".config/my-tool/token"), "TOOL-CANARY\n").unwrap();
    fs::create_dir_all(e.join("secret-dir")).unwrap();
    fs::write(e.join("secret-dir/s"), "DIR-CANARY\n").unwrap();
    fs::write(e.join("secret-file"), "FILE-CANARY\n").unwrap();
    fs::create_dir_all(e.join("cache")).unwrap();
    fs::create_dir_all(e.join("other")).unwrap();
    let ed = e.display();
    f.write_policy(format!(
        "version: 2\nruntime:\n  bwrap:\n    hide: [~/.config/my-tool, {ed}/secret-dir, \
             {ed}/secret-file, {ed}/not-there]\n    writable: [{ed}/cache, \"~/\"]\n"
    ));
    let home = h.display();
    let tries = [
        (
            "tool",
            format!("grep -q CANARY {home}/.config/my-tool/token"),
        ),
        ("secret_dir", format!("grep -q CANARY {ed}/secret-dir/s")),
        ("secret_file", format!("grep -q CANARY {ed}/secret-file")),
        ("cache", format!("echo x > {ed}/cache/c")),
        ("other", format!("echo x > {ed}/other/o")),
        ("home_writable", format!("echo x > {home}/notes")),
        // Writable home: its credential locations stay hidden and read-only.
        ("ssh_read", format!("grep -q CANARY {home}/.ssh/id_test")),
        ("ssh_write", format!("echo x > {home}/.ssh/planted")),
        (
            "tool_write",
            format!("echo x > {home}/.config/my-tool/planted"),
        ),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    for (name, _) in &tries {
        let ok = matches!(*name, "cache" | "home_writable");
        expect(&outcomes, &[(name, ok)]);
    }
    assert!(e.join("cache/c").is_file());
    assert!(h.join("notes").is_file());
    assert!(!e.join("other/o").exists());
    assert!(!h.join(".ssh/planted").exists());
    let rt = f.runtime_json(&result);
    let not_applied = rt["runtime_config"]["not_applied"].to_string();
    assert!(not_applied.contains("not-there"), "{not_applied}");

    // A writable path that does not exist is refused before anything runs.
    f.write_policy(format!(
        "version: 2\nruntime:\n  bwrap:\n    writable: [{ed}/missing]\n"
    ));
    let (code, _, out) = f.run(&[], &["sh", "-c", "echo ran > ran.txt"], &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, 64, "{stderr}");
    assert!(stderr.contains("missing"), "{stderr}");
    assert!(!f.root().join("ran.txt").exists());
}

/// bwrap refusing its namespaces (a fake bwrap first on PATH, as the kernel's refusal shows
/// in bwrap's message): the command does not run, exit 69, and agentdiff's own message names
/// the sysctl to change.
#[test]
fn a_namespace_refusal_fails_closed_and_names_the_sysctl() {
    use agentdiff_conformance::fake_wrapper::{Behaviour, FakeWrapper};
    let f = Fixture::new();
    let bin = tempfile::tempdir().unwrap();
    let fake = FakeWrapper::install(bin.path(), "bwrap", Behaviour::NamespacesRefused).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (code, result, out) = f.run(&[], &["sh", "-c", "echo ran > ran.txt"], &[("PATH", &path)]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code, 69, "{stderr}");
    assert!(!f.root().join("ran.txt").exists());
    // The fake was asked for the planned sandbox, then once more for the diagnosis.
    let calls = fake.invocations().unwrap();
    assert!(!calls.is_empty());
    assert!(
        calls[0].argv.iter().any(|a| a == "--unshare-net"),
        "{calls:?}"
    );
    let rt = f.runtime_json(&result);
    let failure = rt["failure"].to_string();
    assert!(failure.contains("uid map: Permission denied"), "{failure}");
    assert!(
        failure.contains("sysctl -w kernel.unprivileged_userns_clone=1"),
        "{failure}"
    );
    assert_eq!(rt["capabilities"]["sandboxed"], false);
}

/// The kernel switch off (`user.max_user_namespaces = 0`, shown to agentdiff in a private mount
/// namespace): refused before the launch, exit 69, with the sysctl to change.
#[test]
fn disabled_user_namespaces_refuse_the_run_with_the_sysctl() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let zero = tempfile::NamedTempFile::new().unwrap();
    fs::write(zero.path(), "0\n").unwrap();
    let setup = format!(
        "mount --bind {} /proc/sys/user/max_user_namespaces",
        zero.path().display()
    );
    let out = super::in_mount_namespace(
        f.root(),
        &setup,
        &[
            "run",
            "--runtime",
            "bwrap",
            "--",
            "sh",
            "-c",
            "echo ran > ran.txt",
        ],
    )
    .env("HOME", f.home.path())
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("mount:") || stderr.contains("unshare:") {
        agentdiff_conformance::skip_unless_required(&format!(
            "cannot change the view of /proc/sys here: {stderr}"
        ));
        return;
    }
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(stderr.contains("user.max_user_namespaces"), "{stderr}");
    assert!(
        stderr.contains("sysctl -w user.max_user_namespaces="),
        "{stderr}"
    );
    assert!(!f.root().join("ran.txt").exists());
}

/// A container engine socket (here one named by `DOCKER_HOST`, served by the test) cannot be
/// connected to from the sandbox: a container started through it could write any host path.
#[test]
fn container_engine_sockets_are_unreachable_from_the_sandbox() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let dir = var_tmp("agentdiff-bwrap-engine-");
    let sock = dir.path().join("docker.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let reached = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&reached);
    // Answers every request with 404 (agentdiff's own engine discovery then finds no engine)
    // and notes whether a request carried the command's marker.
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut c) = conn else { break };
            let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
            let mut buf = [0u8; 1024];
            let n = c.read(&mut buf).unwrap_or(0);
            if String::from_utf8_lossy(&buf[..n]).contains("FROM-SANDBOX") {
                seen.store(true, Ordering::SeqCst);
            }
            let _ = c.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let connect = format!(
        "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); \
         s.sendall(b'GET /FROM-SANDBOX HTTP/1.0\\r\\n\\r\\n'); s.recv(64)\"",
        sock.display()
    );
    let docker_host = format!("unix://{}", sock.display());
    let tries = vec![("engine", connect.clone())];
    let (outcomes, result, _) = attempt(
        &f,
        &["--pass-env", "DOCKER_HOST"],
        &[("DOCKER_HOST", &docker_host)],
        &tries,
    );
    expect(&outcomes, &[("engine", false)]);
    assert!(
        !reached.load(Ordering::SeqCst),
        "the sandbox reached the engine socket"
    );
    let hidden = hidden_paths(&f.runtime_json(&result));
    assert!(hidden.contains(&canonical(&sock)), "{hidden:?}");
    // From the host the same connection works: the test can fail.
    let out = std::process::Command::new("sh")
        .args(["-c", &connect])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(reached.load(Ordering::SeqCst));
}

fn engine_sockets(rt: &Value) -> Vec<String> {
    rt["containers"]["engines"]
        .as_array()
        .unwrap_or_else(|| panic!("no engines: {rt:#}"))
        .iter()
        .map(|e| e["socket"].as_str().unwrap().to_string())
        .collect()
}

/// With its network unshared and every engine socket covered, the command cannot reach an engine:
/// the engines are not queried, and the evidence says so and why. With the host network, or
/// under the local backend, the same engine is queried.
#[test]
fn engines_are_queried_only_when_the_command_could_reach_one() {
    use std::sync::atomic::Ordering;
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let dir = var_tmp("agentdiff-bwrap-engine-");
    let sock = dir.path().join("podman.sock");
    let asked = fake_podman(&sock);
    let docker_host = format!("unix://{}", sock.display());
    let env = [("DOCKER_HOST", docker_host.as_str())];

    let (code, result, out) = f.run(&["--fail-on", "never"], &["true"], &env);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let rt = f.runtime_json(&result);
    let containers = &rt["containers"];
    assert_eq!(containers["observation"], "not_applicable", "{rt:#}");
    let note = containers["note"].as_str().unwrap();
    assert!(note.contains(&canonical(&sock)), "{note}");
    assert!(note.contains("network namespace"), "{note}");
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "the hidden engine was asked"
    );
    assert!(hidden_paths(&rt).contains(&canonical(&sock)), "{rt:#}");

    // The host network: the command could reach an engine over TCP, so the engines are asked.
    let (code, result, out) = f.run(
        &["--fail-on", "never", "--backend-option", "network=host"],
        &["true"],
        &env,
    );
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let rt = f.runtime_json(&result);
    assert_eq!(rt["containers"]["observation"], "queried", "{rt:#}");
    assert!(
        engine_sockets(&rt).contains(&sock.display().to_string()),
        "{rt:#}"
    );
    let after_host = asked.load(Ordering::SeqCst);
    assert!(after_host >= 2, "ping and events: {after_host}");

    // The local backend hides nothing: queried.
    let out = super::cmd(
        f.root(),
        &[
            "run",
            "--runtime",
            "local",
            "--format",
            "json",
            "--fail-on",
            "never",
            "--",
            "true",
        ],
    )
    .env("DOCKER_HOST", &docker_host)
    .output()
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rt = f.runtime_json(&serde_json::from_slice(&out.stdout).unwrap());
    assert_eq!(rt["containers"]["observation"], "queried", "{rt:#}");
    assert!(
        engine_sockets(&rt).contains(&sock.display().to_string()),
        "{rt:#}"
    );
    assert!(asked.load(Ordering::SeqCst) > after_host);
}

/// An engine socket that appears while the sandboxed command runs is not covered by a mount (the
/// sandbox was built before it existed): the engines are queried, and the note says why.
#[test]
fn an_engine_socket_appearing_during_a_bwrap_run_is_queried() {
    use std::sync::atomic::Ordering;
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let dir = var_tmp("agentdiff-bwrap-engine-");
    let sock = dir.path().join("late.sock");
    let docker_host = format!("unix://{}", sock.display());
    let late = sock.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    // Appears once the command is running (the command creates the marker first).
    let marker = f.root().join("running");
    let waiter = std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !marker.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        tx.send(fake_podman(&late)).unwrap();
    });
    let (code, result, out) = f.run(
        &["--fail-on", "never"],
        &["sh", "-c", "touch running; sleep 1"],
        &[("DOCKER_HOST", &docker_host)],
    );
    waiter.join().unwrap();
    let asked = rx.recv().unwrap();
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    let rt = f.runtime_json(&result);
    assert_eq!(rt["containers"]["observation"], "queried", "{rt:#}");
    let note = rt["containers"]["note"].as_str().unwrap();
    assert!(note.contains("was not hidden"), "{note}");
    assert!(
        engine_sockets(&rt).contains(&sock.display().to_string()),
        "{rt:#}"
    );
    assert!(asked.load(Ordering::SeqCst) >= 2);
}

/// `agentdiff doctor --probe --runtime bwrap` proves each enforced label on this host and
/// the `filtered` network mode, and recommends bwrap as verified, not merely declared.
#[test]
fn doctor_probes_verify_every_enforced_bwrap_label() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let out = super::cmd(
        f.root(),
        &[
            "doctor",
            "--probe",
            "--runtime",
            "bwrap",
            "--format",
            "json",
        ],
    )
    .output()
    .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let verified = &doc["backends"][0]["probe"]["verified"];
    for b in [
        "filesystem_writes",
        "network",
        "processes",
        "privileges",
        "environment",
    ] {
        assert_eq!(verified[b], "verified", "{b}: {doc:#}");
    }
    assert_eq!(doc["recommended"]["id"], "bwrap", "{doc:#}");
    assert_eq!(doc["recommended"]["verified"], true, "{doc:#}");
    // The home allowlist: a file planted in a temporary HOME outside the list is unreadable.
    let home_read = doc["backends"][0]["probe"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["probe"] == "home_read")
        .unwrap_or_else(|| panic!("no home_read probe: {doc:#}"));
    assert_eq!(home_read["verdict"], "verified", "{home_read:#}");
    assert_eq!(
        home_read["evidence"]["allowlisted_read"], true,
        "{home_read:#}"
    );
    // Handed the egress proxy, bwrap labels its network `filtered`, and the probe shows the
    // proxy is the only route out: listed host through it, the rest refused and recorded.
    let egress = doc["backends"][0]["probe"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["probe"] == "egress_filtered")
        .unwrap_or_else(|| panic!("no egress_filtered probe: {doc:#}"));
    assert_eq!(egress["verdict"], "verified", "{egress:#}");
    assert_eq!(egress["evidence"]["label"], "filtered", "{egress:#}");
    assert_eq!(egress["evidence"]["proxy_log"]["denied"], 2, "{egress:#}");
}
