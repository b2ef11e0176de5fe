//! The sandbox an agent's shell calls run in: the probe record `hook install` keeps for it, the
//! check the hook makes on every call, and the command a shell call (`Bash`, `Monitor`) is rewritten to.
//!
//! Invariants: a shell call is rewritten only into a built-in runtime that declares itself a
//! sandbox (a forged probe record cannot make an unsandboxed runtime one), and only while a
//! probe record made on this host and boot,
//! for this backend and its default settings, no older than [`MAX_AGE`], shows filesystem
//! writes held (the record `agentdiff run --probe-records` cites, so the run's evidence says
//! the same); the record lives in the per-user state directory, which every sandbox hides from
//! the command. The original command reaches the shell inside the sandbox as one argument,
//! byte for byte: it is single-quoted ([`quote`]) and never interpreted on the way.
//!
//! Not defended: what the command does inside the sandbox is the sandbox's and the policy's
//! business (the run records it); a shell's state (`cd`, variables) does not carry from one
//! call to the next, because each call is its own process tree.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{BackendOptions, Boundary};
use agentdiff_conformance::probes::{self, ProbeRecord};
use anyhow::Context;

/// The file, in the state directory, holding the probe records `hook install` made.
pub const RECORDS_FILE: &str = "claude-hook-probes.json";

/// How old a probe record may be for shell calls to be sandboxed on its word (a reboot ends it
/// sooner: a record names the boot it was made in).
pub const MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where the records are kept.
pub fn records_path() -> anyhow::Result<PathBuf> {
    let dir = agentdiff_host::state_dir::locate()
        .context("cannot locate the state directory that keeps the sandbox's probe record")?;
    Ok(dir.join(RECORDS_FILE))
}

/// Keeps `record`, replacing an older one of the same backend; the file is private (0600) and
/// replaced atomically.
pub fn save_record(record: &ProbeRecord) -> anyhow::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let path = records_path()?;
    let dir = path.parent().context("the records file has no directory")?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let mut records = match probes::read_records(&path) {
        Ok(records) => records,
        Err(probes::RecordError::Read { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Vec::new()
        }
        // A damaged file is replaced: it holds nothing but earlier probe results.
        Err(_) => Vec::new(),
    };
    records.retain(|r| r.backend != record.backend);
    records.push(record.clone());
    let text = serde_json::to_vec_pretty(&records).context("serialising the probe records")?;
    let tmp = dir.join(format!(".{RECORDS_FILE}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(&text).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    Ok(path)
}

/// Whether shell calls may run sandboxed in `runtime` now.
pub enum Verified {
    Yes { records: PathBuf },
    No { reason: String },
}

/// The hook's check on every shell call.
pub fn verified(runtime: &str) -> Verified {
    let options = BackendOptions::new();
    // Built-in backends only: external plugins are not looked up (no PATH search here).
    let sandbox = agentdiff_plugins::Registry::from_inventory()
        .ok()
        .and_then(|registry| registry.create(runtime).ok())
        .is_some_and(|backend| backend.capabilities(&options).sandboxed);
    if !sandbox {
        return Verified::No {
            reason: format!("`{runtime}` is not a built-in runtime that sandboxes a command"),
        };
    }
    let path = match records_path() {
        Ok(path) => path,
        Err(e) => {
            return Verified::No {
                reason: format!("{e:#}"),
            }
        }
    };
    let records = match probes::read_records(&path) {
        Ok(records) => records,
        Err(e) => {
            return Verified::No {
                reason: format!("no probe record of the sandboxed runtime `{runtime}` ({e})"),
            }
        }
    };
    match probes::cite(
        &records,
        runtime,
        &options,
        Boundary::FilesystemWrites,
        MAX_AGE,
    ) {
        Some(_) => Verified::Yes { records: path },
        None => Verified::No {
            reason: format!(
                "no probe on this host since its last boot, in the last {}, showed the runtime \
                 `{runtime}` holding filesystem writes",
                humantime::format_duration(MAX_AGE)
            ),
        },
    }
}

/// `word` as one shell word: single-quoted, each `'` written as `'\''`. Exact for every string
/// without NUL (which no argument can hold).
pub fn quote(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('\'');
    for c in word.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// The most a rewritten command may take as Claude Code hands it to its shell. Linux refuses an
/// `exec` with any single argument over `MAX_ARG_STRLEN` (128 KiB), and Claude Code passes the
/// command inside one argument, single-quoted again (each `'` becomes 4 bytes) within its own
/// wrapper; 16 KiB are left for that wrapper.
pub const MAX_REWRITTEN_BYTES: usize = 112 * 1024;

/// The length of `command` once single-quoted again, as Claude Code quotes it for its shell.
pub fn requoted_len(command: &str) -> usize {
    command.len() + 3 * command.matches('\'').count()
}

/// What a shell call is rewritten from.
pub struct ShellCall<'a> {
    /// The agentdiff program to run.
    pub program: &'a Path,
    pub root: &'a Path,
    pub runtime: &'a str,
    pub records: &'a Path,
    pub task: &'a str,
    /// The call's working directory, relative to the root (`.` for the root).
    pub workdir: &'a Path,
    /// The agent's command, as it wrote it.
    pub command: &'a str,
}

/// The shell command that runs `call.command` as its own `agentdiff run` transaction: the
/// command reaches `bash -c` inside the sandbox as one argument, in `call.workdir`.
/// An error when a part is not UTF-8 or holds a NUL byte (no argument can carry one).
pub fn rewrite(call: &ShellCall<'_>) -> anyhow::Result<String> {
    let utf8 = |p: &Path, what: &str| {
        p.to_str().map(quote).with_context(|| {
            format!("the {what} is not valid UTF-8, so it cannot be written into the command")
        })
    };
    anyhow::ensure!(
        !call.command.contains('\0') && !call.task.contains('\0'),
        "the command holds a NUL byte, which no shell argument can carry"
    );
    let rewritten = format!(
        "{program} run --root {root} --runtime {runtime} --probe-records {records} \
         --probe-max-age {max_age}s --format brief --fail-on never --wait --revert-denied \
         --task {task} -- \
         sh -c 'cd -- \"$1\" && shift && exec \"$@\"' sh {workdir} bash -c {command}",
        program = utf8(call.program, "path of agentdiff")?,
        root = utf8(call.root, "project root")?,
        runtime = quote(call.runtime),
        records = utf8(call.records, "path of the probe records")?,
        max_age = MAX_AGE.as_secs(),
        task = quote(call.task),
        workdir = utf8(call.workdir, "working directory")?,
        command = quote(call.command),
    );
    // Each `'` of the command costs 13 bytes by then (4 here, each of those quotes 4 again).
    let len = requoted_len(&rewritten);
    anyhow::ensure!(
        len <= MAX_REWRITTEN_BYTES,
        "the command is too long to be carried into the sandbox: rewritten, Claude Code would hand \
         its shell {} KiB in one argument, over the {} KiB this hook leaves below the kernel's \
         limit of 128 KiB for one argument (each `'` in the command costs 13 bytes); write long \
         content with a file tool, or split the command",
        len.div_ceil(1024),
        MAX_REWRITTEN_BYTES / 1024
    );
    Ok(rewritten)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Runs `rewritten` the way Claude Code runs a Bash command (`eval` in bash) with a stand-in
    /// for agentdiff that prints its arguments, NUL-separated.
    fn arguments_received(rewritten: &str) -> Vec<Vec<u8>> {
        let out = std::process::Command::new("bash")
            .args(["-c", "eval \"$1\"", "bash", rewritten])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        out.stdout.split(|b| *b == 0).map(<[u8]>::to_vec).collect()
    }

    fn call<'a>(command: &'a str, workdir: &'a Path, program: &'a Path) -> ShellCall<'a> {
        ShellCall {
            program,
            root: Path::new("/tmp/a 'root'"),
            runtime: "sandbox",
            records: Path::new("/state/records.json"),
            task: "Bash call toolu_1 in session s'1",
            workdir,
            command,
        }
    }

    fn stand_in() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let program = dir.path().join("agentdiff");
        agentdiff_test_support::write_executable(
            &program,
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n",
            0o755,
        );
        (dir, program)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        /// The command and the working directory arrive as the last arguments, byte for byte,
        /// after the `sh -c` trampoline's own words.
        #[test]
        fn the_command_arrives_byte_identical(
            command in "[^\u{0}]{0,200}",
            workdir in "[^\u{0}]{1,40}",
        ) {
            let (_dir, program) = stand_in();
            let rewritten = rewrite(&call(&command, Path::new(&workdir), &program)).unwrap();
            let args = arguments_received(&rewritten);
            // Printed arguments end with a NUL, so the split leaves an empty tail.
            let n = args.len();
            prop_assert!(n >= 6);
            prop_assert_eq!(&args[n - 2], &command.as_bytes().to_vec());
            prop_assert_eq!(&args[n - 3], &b"-c".to_vec());
            prop_assert_eq!(&args[n - 4], &b"bash".to_vec());
            prop_assert_eq!(&args[n - 5], &workdir.as_bytes().to_vec());
        }
    }

    #[test]
    fn shell_syntax_in_the_command_stays_text() {
        let (_dir, program) = stand_in();
        for command in [
            "echo 'a' \"b\" $HOME `id` $(id) \\ \n; && || > x",
            "'",
            "'\\''",
            "\"",
            "$'\\x27'",
            "",
            "-c",
            "ü 中 \u{7f}\u{1b}[31m",
        ] {
            let rewritten = rewrite(&call(command, Path::new("."), &program)).unwrap();
            let args = arguments_received(&rewritten);
            assert_eq!(args[args.len() - 2], command.as_bytes(), "{rewritten}");
        }
    }

    /// A command with many `'` grows 13-fold on its way to Claude Code's shell: below the limit
    /// it still runs when wrapped as Claude Code wraps it (one argument, quoted again); above it
    /// the rewrite is refused instead of failing with E2BIG.
    #[test]
    fn a_rewrite_past_the_argument_limit_is_refused_and_one_below_runs() {
        let (_dir, program) = stand_in();
        let quotes = |n: usize| format!("cat > /dev/null <<'EOF'\n{}\nEOF\n", "'".repeat(n));
        let big = quotes(10_000);
        let err = rewrite(&call(&big, Path::new("."), &program)).unwrap_err();
        assert!(format!("{err:#}").contains("too long"), "{err:#}");
        let fits = quotes(8_500);
        let rewritten = rewrite(&call(&fits, Path::new("."), &program)).unwrap();
        let as_claude_runs_it = format!("eval {}", quote(&rewritten));
        assert!(as_claude_runs_it.len() > 100 * 1024);
        let out = std::process::Command::new("bash")
            .args(["-c", &as_claude_runs_it])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{:?}",
            String::from_utf8_lossy(&out.stderr)
        );
        let args: Vec<&[u8]> = out.stdout.split(|b| *b == 0).collect();
        assert_eq!(args[args.len() - 2], fits.as_bytes());
    }

    #[test]
    fn nul_is_refused() {
        let program = Path::new("/bin/agentdiff");
        assert!(rewrite(&call("a\0b", Path::new("."), program)).is_err());
    }
}
