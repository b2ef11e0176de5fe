mod policy_cli;
mod run_cli;
