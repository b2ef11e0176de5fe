//! `agentdiff attest RUN [--out FILE]`: a signed in-toto attestation of a sealed run — a DSSE
//! envelope that agentdiff (`verify --attestation`) or any DSSE verifier checks with the signer's
//! public key (`agentdiff key show`). Also the readers `verify` uses for trusted keys and
//! envelopes.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;

use agentdiff_host::redact::escape_terminal;
use agentdiff_store::attest::{self, AttestError, Envelope};
use agentdiff_store::seal::{PublicKey, SigningKey, StateDir};
use agentdiff_store::{Capsule, Store, Verdict};

use crate::common::{exit, outfile};

/// Largest attestation or trusted-keys file read.
const MAX_INPUT: u64 = 64 << 20;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "The run must verify as authenticated here (its seal checks under this \
user's key): an attestation never signs more than the seal proves. The envelope is signed with \
this user's Ed25519 signing key ($AGENTDIFF_SIGNING_KEY_FILE, else signing.key in the state \
directory, created on first use). Its subjects are the files the run left changed (path and \
SHA-256) and the capsule (agentdiff-capsule:RUN, the seal's digest).\n\n\
Exit codes: 0 written; 64 the --out file cannot be opened or is not a regular file (a symlink \
is never followed); 76 it could not be written; 77 the run is intact but not authenticated \
here; 67 forged or unsealed; 66 no such run."
)]
pub struct Args {
    /// The run id (see `agentdiff runs`).
    run: String,
    /// Write the envelope to this file (default: standard output).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let capsule = store
        .open_run(&args.run)
        .map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let bytes = attestation(&store, &capsule, &root)?;
    match &args.out {
        Some(path) => {
            let mut file = open_out(path)?;
            write_attestation(path, &mut file, &bytes)
                .map_err(|e| exit::with_code(exit::SUMMARY_NOT_WRITTEN, e))?;
        }
        None => out!("{}", String::from_utf8_lossy(&bytes)),
    }
    Ok(ExitCode::SUCCESS)
}

/// The signed attestation of `capsule` (pretty JSON with a final newline).
pub fn attestation(store: &Store, capsule: &Capsule, root: &Path) -> anyhow::Result<Vec<u8>> {
    let (ctx, _) = crate::common::context::verify_context(root);
    let key = signing_key(root)?;
    let statement = attest::statement(
        capsule,
        store.objects(),
        &ctx,
        env!("CARGO_PKG_VERSION"),
        key.id(),
    )
    .map_err(|e| match e {
        AttestError::NotAuthenticated {
            run_id,
            verdict,
            detail,
        } => not_attested(&run_id, verdict, &detail, capsule, store, &ctx),
        e => exit::with_code(exit::INVALID_CAPSULE, e),
    })?;
    let envelope =
        attest::sign(&statement, &key).map_err(|e| exit::with_code(exit::INTERNAL, e))?;
    let mut bytes = serde_json::to_vec_pretty(&envelope).context("serialising the envelope")?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Why a run that does not verify as authenticated is not attested, named as `verify` names it
/// (the seal's own detail alone can read as a success: "the HMAC checks under this key").
fn not_attested(
    run_id: &str,
    verdict: Verdict,
    detail: &str,
    capsule: &Capsule,
    store: &Store,
    ctx: &agentdiff_store::seal::VerifyContext,
) -> anyhow::Error {
    let id = escape_terminal(run_id);
    let (code, why) = match verdict {
        Verdict::IntactNotAuthenticated => (
            exit::UNAUTHENTICATED,
            format!(
                "it matches its seal, but the seal is NOT authenticated here: {}",
                escape_terminal(detail)
            ),
        ),
        Verdict::Unsealed => (
            exit::INVALID_CAPSULE,
            "it is UNSEALED: the run never finished".to_string(),
        ),
        Verdict::Forged | Verdict::Authenticated => {
            let problems = capsule
                .verify_with(store.objects(), ctx)
                .map(|r| {
                    r.problems
                        .iter()
                        .map(|p| format!("{}: {}", p.subject, p.problem))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            let listed = match problems.as_slice() {
                [] => String::new(),
                some => format!(" ({})", escape_terminal(&some.join("; "))),
            };
            (
                exit::INVALID_CAPSULE,
                format!("it is FORGED: it does not match what agentdiff sealed{listed}"),
            )
        }
    };
    exit::with_code(
        code,
        anyhow::anyhow!(
            "cannot attest run '{id}': {why}; an attestation never signs more than the seal \
             proves (`agentdiff verify {id}` shows the details)"
        ),
    )
}

/// This user's signing key (created on first use), or the one $AGENTDIFF_SIGNING_KEY_FILE names.
pub fn signing_key(root: &Path) -> anyhow::Result<SigningKey> {
    let state = StateDir::from_env().map_err(|e| exit::with_code(exit::INVALID_CONFIG, e))?;
    SigningKey::load_or_create(&state, root).map_err(|e| exit::with_code(exit::INVALID_CONFIG, e))
}

/// Opens the attestation's output file (`--out`, `run --attest`): a path that cannot be opened,
/// a symlink or anything but a regular file is a usage error. `run` opens it before the command
/// runs and writes through this descriptor after the seal, so nothing the command plants at the
/// path is written through or blocked on.
pub fn open_out(path: &Path) -> anyhow::Result<File> {
    outfile::open(path, outfile::Mode::Replace).map_err(|e| {
        exit::with_code(
            exit::USAGE,
            anyhow::anyhow!(
                "cannot open {} for the attestation: {e}",
                escape_terminal(&path.display().to_string())
            ),
        )
    })
}

/// Replaces the content of the output file opened by [`open_out`] with the attestation.
pub fn write_attestation(path: &Path, file: &mut File, bytes: &[u8]) -> anyhow::Result<()> {
    outfile::write(file, outfile::Mode::Replace, bytes).with_context(|| {
        format!(
            "cannot write the attestation to {}",
            escape_terminal(&path.display().to_string())
        )
    })
}

/// The public keys in a trusted-keys file; a file that cannot be read or holds anything that is
/// not a key is a usage error (a key silently skipped would read as "not signed").
pub fn read_trusted_keys(path: &Path) -> anyhow::Result<Vec<PublicKey>> {
    let text = read_bounded_text(path, "trusted keys")?;
    let keys = PublicKey::parse_all(&text)
        .with_context(|| format!("reading trusted keys from {}", path.display()))
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    if keys.is_empty() {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!("{} holds no public key", path.display()),
        ));
    }
    Ok(keys)
}

/// The DSSE envelope in `path`; a file that is not one is an invalid capsule (67).
pub fn read_envelope(path: &Path) -> anyhow::Result<Envelope> {
    let text = read_bounded_text(path, "attestation")?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not a DSSE envelope", path.display()))
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))
}

fn read_bounded_text(path: &Path, what: &str) -> anyhow::Result<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open the {what} file {}", path.display()))
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    let mut text = String::new();
    file.take(MAX_INPUT + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the {what} file {} as text", path.display()))
        .map_err(|e| exit::with_code(exit::USAGE, e))?;
    if text.len() as u64 > MAX_INPUT {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!(
                "the {what} file {} is over {MAX_INPUT} bytes",
                path.display()
            ),
        ));
    }
    Ok(text)
}
