//! Shared fixtures: a project root with a capsule directory, a bin directory whose `srt` is the
//! fake (or the real one), and a way to run one command through the backend.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agentdiff_backend_api::{
    BackendOptions, LaunchContext, LaunchSpec, PreparedLaunch, RunEvidence, RuntimeBackend,
    StdioMode,
};
use agentdiff_backend_srt::{SrtBackend, OPT_EXEC_SHIM};
use agentdiff_conformance::testing::launch_spec;

pub const FAKE_SRT: &str = env!("CARGO_BIN_EXE_agentdiff-fake-srt");
pub const SHIM: &str = env!("CARGO_BIN_EXE_agentdiff-srt-exec-shim");

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub capsule: PathBuf,
    pub bin: PathBuf,
    pub home: PathBuf,
    pub record: PathBuf,
    pub options: BackendOptions,
    pub extra_env: Vec<(OsString, OsString)>,
}

pub fn write_exec(path: &Path, text: &str) {
    agentdiff_test_support::write_executable(path, text, 0o755);
}

impl Fixture {
    /// A fixture whose PATH holds the fake srt and stub prerequisites.
    pub fn fake() -> Fixture {
        let f = Fixture::bare();
        // A copy, not a link: each fixture's srt is a binary of its own identity, so a version
        // cached for another fixture's srt never answers for this one.
        agentdiff_test_support::copy_executable(Path::new(FAKE_SRT), &f.bin.join("srt"), 0o755);
        for p in ["bwrap", "socat", "rg"] {
            write_exec(&f.bin.join(p), "#!/bin/sh\nexit 0\n");
        }
        f
    }

    /// A fixture with an empty bin directory (for the real srt, PATH continues with the host's).
    pub fn bare() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("project");
        let capsule = root.join(".agentdiff/runs/r1");
        std::fs::create_dir_all(&capsule).unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let home = dir.path().join("home");
        std::fs::create_dir_all(&home).unwrap();
        let record = dir.path().join("record.jsonl");
        let mut options = BackendOptions::new();
        options.push(OPT_EXEC_SHIM, SHIM);
        Fixture {
            root: root.canonicalize().unwrap(),
            capsule: capsule.canonicalize().unwrap(),
            bin,
            home,
            record,
            options,
            extra_env: Vec::new(),
            dir,
        }
    }

    pub fn env(&self, host_path: bool) -> Vec<(OsString, OsString)> {
        let mut path = self.bin.as_os_str().to_os_string();
        path.push(":/usr/local/bin:/usr/bin:/bin");
        if host_path {
            if let Some(p) = std::env::var_os("PATH") {
                path.push(":");
                path.push(p);
            }
        }
        let mut env = vec![
            (OsString::from("PATH"), path),
            (OsString::from("HOME"), self.home.clone().into_os_string()),
            (
                OsString::from("FAKE_SRT_RECORD"),
                self.record.clone().into_os_string(),
            ),
        ];
        env.extend(self.extra_env.iter().cloned());
        env
    }

    pub fn spec(&self, argv: &[&str]) -> LaunchSpec {
        self.spec_os(argv.iter().map(OsString::from).collect(), false)
    }

    /// A direct launch with the built-in policy's deny patterns, as a transaction without a
    /// project policy hands them over.
    pub fn spec_os(&self, argv: Vec<OsString>, host_path: bool) -> LaunchSpec {
        let mut spec = launch_spec(&self.root, argv)
            .run_id("r1")
            .capsule_dir(&self.capsule)
            .env(self.env(host_path))
            .timeout(Duration::from_secs(60))
            .grace(Duration::from_millis(500))
            .options(self.options.clone())
            .build();
        spec.deny_patterns = agentdiff_policy::Policy::builtin().deny_patterns();
        spec
    }

    /// Every invocation of the fake srt, in order.
    pub fn records(&self) -> Vec<serde_json::Value> {
        match std::fs::read_to_string(&self.record) {
            Ok(t) => t
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The settings content the fake srt read, if it was given a file.
    pub fn settings_record(&self) -> Option<String> {
        self.records()
            .into_iter()
            .find_map(|r| r["settings_content"].as_str().map(str::to_string))
    }

    /// The fake srt's record of the wrapped run (not `--version`).
    pub fn run_record(&self) -> serde_json::Value {
        self.records()
            .into_iter()
            .find(|r| {
                r["argv"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|a| a == "--"))
            })
            .expect("the fake srt recorded the run")
    }
}

pub fn run_prepared(prepared: PreparedLaunch, out_dir: &Path) -> RunEvidence {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ctx = LaunchContext::new(StdioMode::Files {
            stdin: None,
            stdout: out_dir.join("stdout"),
            stderr: out_dir.join("stderr"),
        });
        let backend = SrtBackend::new();
        let running = backend.launch(prepared, ctx).await.unwrap();
        running.wait().await.unwrap()
    })
}

pub fn run(f: &Fixture, spec: LaunchSpec) -> RunEvidence {
    let prepared = SrtBackend::new().prepare(&spec).unwrap();
    run_prepared(prepared, f.dir.path())
}

pub fn stderr_of(f: &Fixture) -> String {
    std::fs::read_to_string(f.dir.path().join("stderr")).unwrap_or_default()
}

pub fn sha256_file(path: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}
