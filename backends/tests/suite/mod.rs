mod policy_cli;
