mod bwrap_cli;
mod policy_cli;
mod rollback_cli;
mod run_cli;
mod terminal_cli;
