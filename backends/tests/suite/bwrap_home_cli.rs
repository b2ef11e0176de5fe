//! The home by allowlist, with the real bubblewrap: secrets on no list are unreadable, the agent
//! sockets and the runtime directory are gone, the allowlist and a project under `$HOME` work,
//! and the `credentials` label says which mode ran.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs;
use std::os::unix::net::UnixListener;

use serde_json::Value;

use super::bwrap_cli::{no_bwrap, Fixture};
use super::bwrap_controls_cli::{attempt, expect, hidden_paths, var_tmp};

/// Secret files a denylist never named (issue 40's list), relative to the home.
const UNLISTED_SECRETS: [&str; 10] = [
    ".claude/.credentials.json",
    ".codex/auth.json",
    ".pgpass",
    ".password-store/bank.gpg",
    ".cache/huggingface/token",
    ".local/share/keyrings/login.keyring",
    ".bash_history",
    ".config/anthropic/api_key",
    ".config/op/config",
    ".mozilla/firefox/logins.json",
];

fn plant_secrets(home: &std::path::Path) {
    for rel in UNLISTED_SECRETS {
        let p = home.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, "SECRET-CANARY\n").unwrap();
    }
}

fn read_tries(home: &std::path::Path) -> Vec<(String, String)> {
    UNLISTED_SECRETS
        .iter()
        .enumerate()
        .map(|(i, rel)| {
            (
                format!("secret{i}"),
                format!("grep -q CANARY {}/{rel}", home.display()),
            )
        })
        .collect()
}

fn credentials_label(f: &Fixture, result: &Value) -> (String, String) {
    let rt = f.runtime_json(result);
    let c = &rt["wrapper"]["controls"]["credentials"];
    (
        c["level"]
            .as_str()
            .unwrap_or_else(|| panic!("{rt:#}"))
            .to_string(),
        rt["runtime_config"]["home"].as_str().unwrap().to_string(),
    )
}

/// Under the default allowlist: every unlisted secret unreadable, the home not writable, the
/// SSH agent socket (under `$XDG_RUNTIME_DIR`) gone with its variable, the allowlisted toolchain
/// and `~/.gitconfig` readable, a credential file inside the toolchain still hidden, and the
/// label `enforced` naming the allowlist.
#[test]
fn the_home_is_hidden_except_the_allowlist_and_agent_sockets_are_gone() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    let h = f.home.path();
    plant_secrets(h);
    fs::create_dir_all(h.join(".cargo/bin")).unwrap();
    fs::write(h.join(".cargo/config.toml"), "TOOLCHAIN-OK\n").unwrap();
    fs::write(h.join(".cargo/credentials.toml"), "CARGO-CANARY\n").unwrap();
    fs::write(h.join(".gitconfig"), "[user]\n\tname = GITCONFIG-OK\n").unwrap();
    let runtime = var_tmp("agentdiff-bwrap-runtime-");
    let sock = runtime.path().join("ssh-agent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let s = sock.display().to_string();
    let r = runtime.path().display().to_string();
    let mut tries = read_tries(h);
    tries.extend([
        (
            "home_write".to_string(),
            format!("echo x > {}/planted", h.display()),
        ),
        ("sock_var".into(), "[ -n \"$SSH_AUTH_SOCK\" ]".into()),
        ("runtime_var".into(), "[ -n \"$XDG_RUNTIME_DIR\" ]".into()),
        ("sock_exists".into(), format!("[ -S {s} ]")),
        ("runtime_list".into(), format!("[ -n \"$(ls -A {r})\" ]")),
        (
            "sock_connect".into(),
            format!("python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{s}')\""),
        ),
        (
            "cargo_creds".into(),
            format!("grep -q CANARY {}/.cargo/credentials.toml", h.display()),
        ),
        (
            "toolchain".into(),
            format!("grep -q TOOLCHAIN-OK {}/.cargo/config.toml", h.display()),
        ),
        (
            "gitconfig".into(),
            "grep -q GITCONFIG-OK ~/.gitconfig".into(),
        ),
    ]);
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
    let env = [
        ("SSH_AUTH_SOCK", s.as_str()),
        ("XDG_RUNTIME_DIR", r.as_str()),
    ];
    let (outcomes, result, _) = attempt(&f, &["--pass-env", "SSH_AUTH_SOCK"], &env, &tries);
    for (name, _) in &tries {
        let ok = matches!(*name, "toolchain" | "gitconfig");
        expect(&outcomes, &[(name, ok)]);
    }
    assert!(
        listener.accept().is_err(),
        "the agent socket was connected to"
    );
    assert!(!h.join("planted").exists());
    assert_eq!(
        credentials_label(&f, &result),
        ("enforced".into(), "allowlist".into())
    );
}

/// A per-user runtime directory made for the test under `/run/user`, removed (with `/run/user`
/// when the test made that too) when dropped.
struct RuntimeDir {
    dir: std::path::PathBuf,
    made_parent: bool,
}

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
        if self.made_parent {
            let _ = fs::remove_dir(RUN_USER);
        }
    }
}

const RUN_USER: &str = "/run/user";

/// Under `su`, `runuser`, `sudo`, cron and CI runners `$XDG_RUNTIME_DIR` is often unset while
/// gpg-agent and the session bus keep their sockets in `/run/user/UID`: the directory is hidden
/// all the same, and the label lists it.
#[test]
fn the_runtime_directories_are_hidden_when_no_variable_names_them() {
    if no_bwrap() {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        agentdiff_test_support::skip("making a directory under /run/user needs root");
        return;
    }
    let made_parent = !std::path::Path::new(RUN_USER).exists();
    fs::create_dir_all(RUN_USER).unwrap();
    let guard = RuntimeDir {
        dir: std::path::Path::new(RUN_USER).join(format!("42{}", std::process::id())),
        made_parent,
    };
    fs::create_dir(&guard.dir).unwrap();
    let sock = guard.dir.join("bus");
    let listener = UnixListener::bind(&sock).unwrap();
    listener.set_nonblocking(true).unwrap();
    let (s, r) = (sock.display().to_string(), guard.dir.display().to_string());
    let f = Fixture::new();
    let tries = [
        ("sock_exists", format!("[ -S {s} ]")),
        ("runtime_list", format!("[ -n \"$(ls -A {r})\" ]")),
        (
            "sock_connect",
            format!("python3 -c \"import socket; socket.socket(socket.AF_UNIX).connect('{s}')\""),
        ),
    ];
    // An empty value is no value: nothing names the runtime directory.
    let env = [("XDG_RUNTIME_DIR", ""), ("DBUS_SESSION_BUS_ADDRESS", "")];
    let (outcomes, result, _) = attempt(&f, &[], &env, &tries);
    for (name, _) in &tries {
        expect(&outcomes, &[(name, false)]);
    }
    assert!(
        listener.accept().is_err(),
        "the bus socket was connected to"
    );
    let rt = f.runtime_json(&result);
    let hidden = hidden_paths(&rt);
    assert!(hidden.iter().any(|h| h == RUN_USER), "{hidden:?}");
}

/// A project below `$HOME` stays reachable and writable while the rest of the home is hidden.
#[test]
fn a_project_under_home_still_works() {
    if no_bwrap() {
        return;
    }
    let home = var_tmp("agentdiff-bwrap-home-");
    fs::create_dir_all(home.path().join(".ssh")).unwrap();
    plant_secrets(home.path());
    let project = tempfile::tempdir_in(home.path()).unwrap();
    fs::write(project.path().join("a.txt"), "PROJECT-OK\n").unwrap();
    fs::create_dir_all(project.path().join(".git")).unwrap();
    fs::write(project.path().join(".git/HEAD"), "ref: refs/heads/main\n").unwrap();
    let f = Fixture { project, home };
    let mut tries = read_tries(f.home.path());
    tries.extend([
        (
            "read_root".to_string(),
            "grep -q PROJECT-OK a.txt".to_string(),
        ),
        ("write_root".into(), "echo x > new.txt".into()),
        ("git".into(), "echo x > .git/injected".into()),
    ]);
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (n.as_str(), c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    for (name, _) in &tries {
        let ok = matches!(*name, "read_root" | "write_root");
        expect(&outcomes, &[(name, ok)]);
    }
    assert_eq!(fs::read_to_string(f.root().join("new.txt")).unwrap(), "x\n");
    let changes = result["changes"].as_array().unwrap();
    assert!(changes.iter().any(|c| c["path"] == "new.txt"), "{result:#}");
}

/// `home: denylist` (the old mode, kept as an explicit option) reads unlisted secrets and says
/// so: the label is not `enforced`. The policy's `home.read` shows an extra entry,
/// `home.sockets: allow` leaves the agent socket and is not labelled `enforced` either, and a
/// path outside the home is refused before anything runs.
#[test]
fn the_denylist_and_allowed_sockets_are_labelled_for_what_they_are_and_policy_extends_the_list() {
    if no_bwrap() {
        return;
    }
    let f = Fixture::new();
    plant_secrets(f.home.path());
    let tries = [
        (
            "pgpass",
            format!("grep -q CANARY {}/.pgpass", f.home.path().display()),
        ),
        (
            "ssh",
            format!("grep -q CANARY {}/.ssh/id_test", f.home.path().display()),
        ),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let (outcomes, result, _) = attempt(&f, &["--backend-option", "home=denylist"], &[], &tries);
    expect(&outcomes, &[("pgpass", true), ("ssh", false)]);
    assert_eq!(
        credentials_label(&f, &result),
        ("uncontrolled".into(), "denylist".into())
    );

    f.write_policy("version: 2\nruntime:\n  bwrap:\n    home:\n      read: [\"~/.pgpass\"]\n");
    let (outcomes, result, _) = attempt(&f, &[], &[], &tries);
    expect(&outcomes, &[("pgpass", true), ("ssh", false)]);
    assert_eq!(credentials_label(&f, &result).0, "enforced");

    // `home.sockets: allow` leaves the agent socket and its variable, and says so.
    let runtime = var_tmp("agentdiff-bwrap-runtime-");
    let sock = runtime.path().join("ssh-agent.sock");
    let _listener = UnixListener::bind(&sock).unwrap();
    let s = sock.display().to_string();
    f.write_policy("version: 2\nruntime:\n  bwrap:\n    home:\n      sockets: allow\n");
    let tries = [
        ("sock_var", "[ -n \"$SSH_AUTH_SOCK\" ]".to_string()),
        ("sock_exists", format!("[ -S {s} ]")),
    ];
    let tries: Vec<(&str, String)> = tries.iter().map(|(n, c)| (*n, c.clone())).collect();
    let env = [("SSH_AUTH_SOCK", s.as_str())];
    let (outcomes, result, _) = attempt(&f, &["--pass-env", "SSH_AUTH_SOCK"], &env, &tries);
    expect(&outcomes, &[("sock_var", true), ("sock_exists", true)]);
    assert_eq!(credentials_label(&f, &result).0, "uncontrolled");

    f.write_policy("version: 2\nruntime:\n  bwrap:\n    home:\n      read: [\"~/../etc\"]\n");
    let (code, _, out) = f.run(&[], &["true"], &[]);
    assert_ne!(code, 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("runtime.bwrap.home.read"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
