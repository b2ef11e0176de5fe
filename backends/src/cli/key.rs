//! `agentdiff key show`: this user's signing public key, to hand to whoever verifies capsules and
//! attestations made here (`agentdiff verify --trusted-keys FILE`, or any DSSE verifier).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::ValueEnum;

#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the public key of the key that signs seals and attestations (created on first use).
    Show(ShowArgs),
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    /// Output form: PEM (SubjectPublicKeyInfo), an OpenSSH `ssh-ed25519` line, the raw key in
    /// base64, or JSON with the key id and each form (and the securesystemslib key dict).
    #[arg(long, value_enum, default_value = "pem")]
    format: KeyFormat,
    /// Project root (a signing key file named by $AGENTDIFF_SIGNING_KEY_FILE must lie outside it).
    #[arg(long)]
    root: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum KeyFormat {
    Pem,
    Ssh,
    Base64,
    Json,
}

pub fn run(cmd: Command) -> anyhow::Result<ExitCode> {
    let Command::Show(args) = cmd;
    let root = match &args.root {
        Some(r) => r.clone(),
        None => std::env::current_dir().context("cannot determine the current directory")?,
    };
    let key = super::attest::signing_key(&root)?;
    let public = key.public();
    match args.format {
        KeyFormat::Pem => out!("{}", public.to_pem()),
        KeyFormat::Ssh => outln!(
            "{}",
            public.to_ssh(&format!("agentdiff-{}", &key.id()[..16]))
        ),
        KeyFormat::Base64 => outln!("{}", public.to_base64()),
        KeyFormat::Json => {
            let doc = serde_json::json!({
                "key_id": key.id(),
                "algorithm": agentdiff_store::seal::SIGNATURE_ALGORITHM,
                "source": key.source().display().to_string(),
                "pem": public.to_pem(),
                "ssh": public.to_ssh("agentdiff"),
                "base64": public.to_base64(),
                "securesystemslib": public.to_sslib(),
            });
            outln!(
                "{}",
                serde_json::to_string_pretty(&doc).context("serialising the key")?
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
