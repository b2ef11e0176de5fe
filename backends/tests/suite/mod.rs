mod bwrap_cli;
mod cleanup_cli;
mod hook_cli;
mod policy_cli;
mod rollback_cli;
mod run_cli;
mod safe_defaults_cli;
mod terminal_cli;
