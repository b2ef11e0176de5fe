//! `agentdiff verify [RUN | --all] [--trusted-keys FILE] [--attestation FILE]`: check capsules
//! against their seal, this user's seal key and ledger, and (for capsules and attestations from
//! other machines) the signatures of trusted public keys.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde::Serialize;

use agentdiff_host::redact::escape_terminal;
use agentdiff_store::seal::VerifyContext;
use agentdiff_store::{ObjectsChecked, Store, StoreError, Verdict, VerifyReport};

use crate::common::exit;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Verdicts: authenticated (intact, and the seal's HMAC checks under this \
user's key); intact_not_authenticated (everything matches the seal, but it cannot be \
authenticated here: no key for this user, another key, or an older format — anyone able to \
rewrite the whole capsule could have made it); forged (an artifact, object, the seal, its MAC or \
this user's ledger disagrees; each problem is named); unsealed.\n\n\
The key and ledger are read from $AGENTDIFF_STATE_DIR, else $XDG_STATE_HOME/agentdiff, else the \
XDG default state directory below $HOME. A command that ran unconfined as you could read the key: \
see docs/security-model.md for what each backend hides.\n\n\
With --all, an entry of the store's runs directory that cannot be checked as a capsule (a planted \
file or symlink) is named as CANNOT VERIFY and the pass goes on with the other runs.\n\n\
With --trusted-keys FILE (public keys as `agentdiff key show` prints them: PEM, ssh-ed25519 or \
base64, one per line or block), a seal this user's key cannot authenticate (another machine or \
user) authenticates when it carries a signature by one of those keys; --attestation FILE checks \
an attestation from `agentdiff attest` the same way, and with RUN also that it attests that run's \
capsule.\n\n\
Exit codes: 0 authenticated; 77 intact but not authenticated; 67 forged or unsealed (or, with \
--all, a run the ledger records is missing, or an entry cannot be verified); 66 no such run."
)]
pub struct Args {
    /// The run id (see `agentdiff runs`).
    #[arg(required_unless_present_any = ["all", "attestation"], conflicts_with = "all")]
    run: Option<String>,
    /// Verify every run in the store, and report runs this user's ledger records under this root
    /// that are missing from it.
    #[arg(long)]
    all: bool,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Public keys whose signatures authenticate capsules and attestations sealed elsewhere.
    #[arg(long, value_name = "FILE")]
    trusted_keys: Option<PathBuf>,
    /// An attestation (DSSE envelope) to verify; with RUN, it must attest that run's capsule.
    #[arg(long, value_name = "FILE", conflicts_with = "all")]
    attestation: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value = "summary")]
    format: super::inspect::Format,
}

/// `verify --all` as JSON.
#[derive(Debug, Serialize)]
struct AllReport {
    runs: Vec<VerifyReport>,
    /// Runs the ledger records for this root whose directory is gone.
    missing_from_store: Vec<String>,
    /// Entries of `runs/` that could not be opened or checked as a capsule (a planted file or
    /// symlink, an unreadable directory): each is a failure, and the pass goes on without it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    unverifiable: Vec<Unverifiable>,
    /// Why the key or ledger could not be used, if so.
    #[serde(skip_serializing_if = "Option::is_none")]
    context_problem: Option<String>,
}

/// A run entry `verify --all` could not check.
#[derive(Debug, Serialize)]
struct Unverifiable {
    run_id: String,
    problem: String,
}

fn open_code(e: &StoreError) -> u8 {
    match e {
        StoreError::NoStore { .. }
        | StoreError::InvalidRunId { .. }
        | StoreError::RunNotFound { .. } => exit::NO_SUCH_RUN,
        _ => exit::INVALID_CAPSULE,
    }
}

fn code_for(verdict: Verdict) -> u8 {
    match verdict {
        Verdict::Authenticated => 0,
        Verdict::IntactNotAuthenticated => exit::UNAUTHENTICATED,
        Verdict::Forged | Verdict::Unsealed => exit::INVALID_CAPSULE,
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let trusted = match &args.trusted_keys {
        Some(path) => super::attest::read_trusted_keys(path)?,
        None => Vec::new(),
    };
    let known = match &args.attestation {
        Some(_) => own_public_keys(args.root.as_deref()),
        None => Vec::new(),
    };
    if let (Some(file), None) = (&args.attestation, &args.run) {
        let check = AttestationCheck::of(file, &trusted, &known, None)?;
        check.print(args.format)?;
        return Ok(ExitCode::from(check.code()));
    }
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(open_code(&e), e))?;
    let (mut ctx, context_problem) = crate::common::context::verify_context(&root);
    ctx.trusted = trusted;
    if let Some(p) = &context_problem {
        eprintln!(
            "agentdiff: the seal key could not be used, so nothing can be authenticated: {}",
            escape_terminal(p)
        );
    }
    let Some(run) = &args.run else {
        return verify_all(&store, &ctx, context_problem, args.format);
    };
    let capsule = store
        .open_run(run)
        .map_err(|e| exit::with_code(open_code(&e), e))?;
    let report = capsule
        .verify_with(store.objects(), &ctx)
        .map_err(|e| exit::with_code(exit::INVALID_CAPSULE, e))?;
    let attestation = match &args.attestation {
        Some(file) => Some(AttestationCheck::of(
            file,
            &ctx.trusted,
            &known,
            Some(&report),
        )?),
        None => None,
    };
    match args.format {
        super::inspect::Format::Json => outln!(
            "{}",
            serde_json::to_string_pretty(&report).context("serialising the report")?
        ),
        super::inspect::Format::Summary => print_report(&report),
    }
    let mut code = code_for(report.verdict);
    if let Some(check) = attestation {
        check.print(args.format)?;
        code = worst_code(code, check.code());
    }
    Ok(ExitCode::from(code))
}

/// The more serious of two exit codes: forged or unsealed over not authenticated over 0.
fn worst_code(a: u8, b: u8) -> u8 {
    let rank = |c: u8| match c {
        0 => 0,
        exit::UNAUTHENTICATED => 1,
        _ => 2,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// One attestation's verdict, as `verify` prints it.
#[derive(Debug, Serialize)]
struct AttestationCheck {
    attestation: String,
    verdict: Verdict,
    detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    signed_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seal_digest: Option<String>,
}

impl AttestationCheck {
    /// Checks the envelope in `file` against `trusted` (and the signatures of `known` keys,
    /// trusted or not); with `run`, also that it attests that run's sealed capsule (its capsule
    /// subject names the run and the seal's digest). Only a well-formed statement whose known
    /// signatures verify, and that names `run`'s capsule when given, can be short of forged.
    fn of(
        file: &std::path::Path,
        trusted: &[agentdiff_store::seal::PublicKey],
        known: &[agentdiff_store::seal::PublicKey],
        run: Option<&VerifyReport>,
    ) -> anyhow::Result<AttestationCheck> {
        use agentdiff_store::attest::EnvelopeCheck;
        let envelope = super::attest::read_envelope(file)?;
        let mut check = AttestationCheck {
            attestation: file.display().to_string(),
            verdict: Verdict::Forged,
            detail: String::new(),
            signed_by: None,
            run_id: None,
            seal_digest: None,
        };
        let (statement, signer) = match envelope.check_with(trusted, known) {
            EnvelopeCheck::Bad { reason } => {
                check.detail = reason;
                return Ok(check);
            }
            EnvelopeCheck::Untrusted {
                key_ids,
                statement,
                known_signer,
            } => (statement, Err((key_ids, known_signer))),
            EnvelopeCheck::Verified { key_id, statement } => (statement, Ok(key_id)),
        };
        let subject = statement
            .capsule()
            .map(|(r, d)| (r.to_string(), d.to_string()));
        check.run_id = subject.as_ref().map(|(r, _)| r.clone());
        check.seal_digest = subject.as_ref().map(|(_, d)| d.clone());
        let Some((run_id, digest)) = subject else {
            check.detail = "the statement names no agentdiff capsule".into();
            return Ok(check);
        };
        if let Some(problem) = other_capsule(&run_id, &digest, run) {
            check.detail = problem;
            return Ok(check);
        }
        match signer {
            Ok(key) => {
                check.verdict = Verdict::Authenticated;
                check.detail =
                    format!("signed by trusted key {key}, attesting run {run_id} (seal {digest})");
                check.signed_by = Some(key);
            }
            Err((key_ids, known_signer)) => {
                check.verdict = Verdict::IntactNotAuthenticated;
                check.detail = untrusted_detail(&key_ids, known_signer.as_deref(), trusted);
            }
        }
        Ok(check)
    }

    fn code(&self) -> u8 {
        code_for(self.verdict)
    }

    fn print(&self, format: super::inspect::Format) -> anyhow::Result<()> {
        let word = match self.verdict {
            Verdict::Authenticated => "authenticated",
            Verdict::IntactNotAuthenticated => "NOT authenticated",
            Verdict::Forged | Verdict::Unsealed => "FORGED",
        };
        match format {
            super::inspect::Format::Json => outln!(
                "{}",
                serde_json::to_string_pretty(self).context("serialising the report")?
            ),
            super::inspect::Format::Summary => outln!(
                "attestation {}: {word}: {}",
                escape_terminal(&self.attestation),
                escape_terminal(&self.detail)
            ),
        }
        Ok(())
    }
}

/// Why an attestation of `run_id` (seal `digest`) is not one of `run`'s sealed capsule.
fn other_capsule(run_id: &str, digest: &str, run: Option<&VerifyReport>) -> Option<String> {
    let report = run?;
    let sealed = report.authentication.seal_digest.as_deref();
    (run_id != report.run_id.as_str() || sealed != Some(digest)).then(|| {
        format!(
            "it attests run {run_id} (seal {digest}), not run {} (seal {})",
            report.run_id.as_str(),
            sealed.unwrap_or("unknown")
        )
    })
}

fn untrusted_detail(
    key_ids: &[String],
    known_signer: Option<&str>,
    trusted: &[agentdiff_store::seal::PublicKey],
) -> String {
    let signers = if key_ids.is_empty() {
        "no key".to_string()
    } else {
        key_ids.join(", ")
    };
    let mut detail = format!("signed by {signers}, none of them a trusted key");
    if trusted.is_empty() {
        detail.push_str(" (no --trusted-keys given)");
    }
    if let Some(own) = known_signer {
        detail.push_str(&format!(
            "; the signature by this user's own key {own} matches the payload"
        ));
    }
    detail
}

/// This user's own signing public key, when one exists here (verify never creates one): the
/// signatures it made are checked even when it is not trusted, so a payload changed after
/// `agentdiff attest` is forged rather than merely not authenticated.
fn own_public_keys(root: Option<&std::path::Path>) -> Vec<agentdiff_store::seal::PublicKey> {
    use agentdiff_store::seal::{
        SigningKey, StateDir, SIGNING_KEY_FILE_ENV, SIGNING_KEY_FILE_NAME,
    };
    let cwd = std::env::current_dir().ok();
    let Some(root) = root.or(cwd.as_deref()) else {
        return Vec::new();
    };
    let key = if let Some(path) = std::env::var_os(SIGNING_KEY_FILE_ENV).filter(|v| !v.is_empty()) {
        SigningKey::from_file(std::path::Path::new(&path), root).ok()
    } else {
        StateDir::from_env()
            .ok()
            .filter(|state| state.path().join(SIGNING_KEY_FILE_NAME).is_file())
            .and_then(|state| SigningKey::load_or_create(&state, root).ok())
    };
    key.map(|k| vec![k.public().clone()]).unwrap_or_default()
}

fn verify_all(
    store: &Store,
    ctx: &VerifyContext,
    context_problem: Option<String>,
    format: super::inspect::Format,
) -> anyhow::Result<ExitCode> {
    let mut reports = Vec::new();
    let mut present = BTreeSet::new();
    let checked = ObjectsChecked::default();
    let mut unverifiable = Vec::new();
    for listing in store.list_runs().context("listing runs")? {
        present.insert(listing.id.to_string());
        // One entry that cannot be checked must not blind the pass to every other run.
        let verified = store
            .open_run(listing.id.as_str())
            .and_then(|capsule| capsule.verify_in_pass(store.objects(), ctx, &checked));
        match verified {
            Ok(report) => reports.push(report),
            Err(e) => unverifiable.push(Unverifiable {
                run_id: listing.id.to_string(),
                problem: exit::chain_text(&anyhow::Error::new(e)),
            }),
        }
    }
    let missing: Vec<String> = ctx
        .ledgered_runs()
        .into_iter()
        .filter(|r| !present.contains(r))
        .collect();
    let worst = reports
        .iter()
        .map(|r| code_for(r.verdict))
        .chain((!missing.is_empty() || !unverifiable.is_empty()).then_some(exit::INVALID_CAPSULE))
        .max_by_key(|c| match *c {
            0 => 0,
            exit::UNAUTHENTICATED => 1,
            _ => 2,
        })
        .unwrap_or(0);
    match format {
        super::inspect::Format::Json => {
            let all = AllReport {
                runs: reports,
                missing_from_store: missing,
                unverifiable,
                context_problem,
            };
            outln!(
                "{}",
                serde_json::to_string_pretty(&all).context("serialising the report")?
            );
        }
        super::inspect::Format::Summary => {
            for r in &reports {
                print_report(r);
            }
            for m in &missing {
                outln!(
                    "MISSING: run {} is recorded in this user's ledger for this root but its \
                     capsule is gone from the store",
                    escape_terminal(m)
                );
            }
            for u in &unverifiable {
                outln!(
                    "CANNOT VERIFY: run {}: {}",
                    escape_terminal(&u.run_id),
                    escape_terminal(&u.problem)
                );
            }
            if reports.is_empty() && missing.is_empty() && unverifiable.is_empty() {
                outln!("no runs in the store");
            }
        }
    }
    Ok(ExitCode::from(worst))
}

fn print_report(report: &VerifyReport) {
    let id = escape_terminal(report.run_id.as_str());
    match report.verdict {
        Verdict::Authenticated => outln!(
            "authenticated: run {id} is sealed, every artifact and object matches the seal, and \
             {}",
            escape_terminal(&report.authentication.detail)
        ),
        Verdict::IntactNotAuthenticated => outln!(
            "intact, NOT authenticated: run {id} matches its seal, but {}",
            escape_terminal(&report.authentication.detail)
        ),
        Verdict::Forged => outln!(
            "FORGED: run {id} does not match what agentdiff sealed ({} problem(s)):",
            report.problems.len() + usize::from(report.authentication.is_forged())
        ),
        Verdict::Unsealed => outln!("UNSEALED: run {id} has no seal:"),
    }
    if report.authentication.is_forged() {
        outln!("  seal: {}", escape_terminal(&report.authentication.detail));
    }
    if let Some(key) = &report.authentication.signed_by {
        outln!("  signed by: Ed25519 key {}", escape_terminal(key));
    }
    for p in &report.problems {
        outln!(
            "  {}: {}",
            escape_terminal(&p.subject),
            escape_terminal(&p.problem)
        );
    }
    for n in &report.notes {
        outln!("  note: {}", escape_terminal(n));
    }
}
