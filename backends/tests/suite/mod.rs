mod policy_cli;
mod rollback_cli;
