//! `agentdiff serve`: a read-only dashboard of every run and agent session in the store, and a
//! live feed of runs in progress, on loopback only, guarded by a fresh token printed once as a URL.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use agentdiff_store::Store;

use crate::common::exit;
use crate::serve::{self, auth::Token, Server};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Listens on 127.0.0.1 and [::1] only. Every start makes a new 128-bit \
token and prints the URL holding it once; every page needs ?token=, the event stream the token \
as a bearer header or ?token=. Requests whose Host header is not a loopback name are refused. \
There is no way to turn the token off. Stop with Ctrl-C."
)]
pub struct Args {
    /// TCP port (0: an ephemeral port chosen by the system).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Project root (default: the nearest directory holding .agentdiff/ or agentdiff.yaml, else
    /// the nearest VCS root, else the current directory).
    #[arg(long)]
    root: Option<PathBuf>,
    /// Most connections open at once (never more than half the descriptor limit); a connection
    /// beyond it replaces the oldest one not in a request.
    #[arg(long, value_name = "N", default_value_t = serve::conns::MAX_CONNECTIONS,
          value_parser = clap::value_parser!(usize))]
    max_connections: usize,
    /// Longest wait for a request's header, on connect and between keep-alive requests
    /// (`10s`, `500ms`, or seconds).
    #[arg(long, value_name = "D", default_value = "10s", value_parser = super::run::parse_duration)]
    header_timeout: Duration,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.max_connections == 0 || args.header_timeout.is_zero() {
        return Err(exit::with_code(
            exit::USAGE,
            anyhow::anyhow!("--max-connections and --header-timeout must be greater than zero"),
        ));
    }
    let limits = serve::conns::Limits {
        max_connections: args.max_connections,
        header_timeout: args.header_timeout,
    }
    .within_descriptor_limit();
    let root = crate::common::context::project_root(args.root.as_deref())?.path;
    let store = Store::open_existing(&root).map_err(|e| exit::with_code(exit::NO_SUCH_RUN, e))?;
    let token = Token::generate()
        .map_err(|e| anyhow::anyhow!("{e}"))
        .context("cannot read the OS random source for the access token")?;
    // Two workers: the event streams poll the store on a blocking section of a worker.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    rt.block_on(async move {
        let (listeners, port) = serve::listen(args.port)
            .await
            .with_context(|| format!("cannot listen on 127.0.0.1:{}", args.port))
            .map_err(|e| exit::with_code(exit::USAGE, e))?;
        let url = format!("http://127.0.0.1:{port}/?token={}", token.as_str());
        let server = Arc::new(Server { store, token, port });
        let conns = Arc::new(serve::conns::Connections::new(limits));
        let tasks: Vec<_> = listeners
            .into_iter()
            .map(|l| {
                tokio::spawn(serve::accept_loop(
                    Arc::clone(&server),
                    l,
                    Arc::clone(&conns),
                ))
            })
            .collect();
        outln!("{url}");
        errln!(
            "agentdiff: serving the runs of {} read-only; the URL above is the only way in \
             (anyone holding it can read every run). Ctrl-C stops.",
            agentdiff_host::redact::escape_terminal(&root.display().to_string())
        );
        let _ = tokio::signal::ctrl_c().await;
        for t in tasks {
            t.abort();
        }
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
