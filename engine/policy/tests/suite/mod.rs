mod hook_resolve;
mod policy;
