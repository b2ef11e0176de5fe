//! Root filesystems for container tests, built from the host's own programs (no image pull):
//! busybox alone, or busybox plus the host's Python.
#![allow(clippy::unwrap_used)]

/// A busybox root filesystem in a fresh 0755 temp dir: bin/busybox and one link per applet.
pub fn busybox_rootfs() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = d.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    crate::copy_executable(
        std::path::Path::new("/bin/busybox"),
        &bin.join("busybox"),
        0o755,
    );
    let list = std::process::Command::new("/bin/busybox")
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let applet = applet.trim();
        // `busybox --list` names busybox itself: linking it would replace the binary.
        if applet.is_empty() || applet == "busybox" {
            continue;
        }
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    d
}

/// The host's Python interpreter (Debian's, with its shared libraries).
pub const HOST_PYTHON: &str = "/usr/bin/python3.11";

/// A busybox root filesystem plus the host's Python with the shared libraries it links and the
/// standard-library modules `import os, socket, sys` and the idna codec load: enough for the conformance probes
/// that need `python3` (the egress probe), small enough to digest at every launch.
pub fn python_rootfs() -> Result<tempfile::TempDir, String> {
    let d = busybox_rootfs();
    let run = |program: &str, args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let modules = run(
        HOST_PYTHON,
        &[
            "-c",
            // `socket` encodes host names with the idna codec.
            "import os, socket, sys\n'a'.encode('idna')\nfor m in list(sys.modules.values()):\n    f = getattr(m, '__file__', None)\n    f and print(f)",
        ],
    )?;
    // `ldd` lines: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux… (0x…)`.
    let libs = run("ldd", &[HOST_PYTHON])?;
    let mut files: Vec<String> = libs
        .lines()
        .filter_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .map(str::to_string)
        .collect();
    files.push(HOST_PYTHON.to_string());
    files.extend(modules.lines().map(str::to_string));
    for file in files {
        let target = d.path().join(file.trim_start_matches('/'));
        std::fs::create_dir_all(target.parent().unwrap()).map_err(|e| e.to_string())?;
        std::fs::copy(&file, &target).map_err(|e| format!("copying {file}: {e}"))?;
    }
    std::os::unix::fs::symlink("python3.11", d.path().join("usr/bin/python3"))
        .map_err(|e| e.to_string())?;
    // Python looks for its extension-module directory at startup (empty: none is needed).
    std::fs::create_dir_all(d.path().join("usr/lib/python3.11/lib-dynload"))
        .map_err(|e| e.to_string())?;
    Ok(d)
}

/// Why [`python_rootfs`] cannot be built here.
pub fn host_python_missing() -> Option<String> {
    let works = std::process::Command::new(HOST_PYTHON)
        .args(["-c", "import socket"])
        .status()
        .is_ok_and(|s| s.success());
    let ldd = std::process::Command::new("ldd")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    (!works || !ldd).then(|| format!("{HOST_PYTHON} with its socket module, and ldd"))
}

/// Python (for [`python_rootfs`]) that tries a socket of each family a sandbox must refuse or
/// keep — `vsock` (`AF_VSOCK`), `audit` (netlink, `NETLINK_AUDIT`), `inet`, `unix` — and prints
/// `SOCKET NAME created` or `SOCKET NAME ERRNO` for each on stderr (under `--format json` the
/// command's stdout is agentdiff's).
pub const SOCKET_FAMILIES_PY: &str = r#"
import socket, sys
for name, family, kind, protocol in (("vsock", 40, 1, 0), ("audit", 16, 3, 9), ("inet", 2, 1, 0), ("unix", 1, 1, 0)):
    try:
        socket.socket(family, kind, protocol).close()
        r = "created"
    except OSError as e:
        r = str(e.errno)
    print("SOCKET", name, r, file=sys.stderr)
"#;
