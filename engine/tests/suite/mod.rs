mod hook_resolve;
mod policy;
mod rollback;
mod scanner;
mod store;

pub use agentdiff_test_support::skip;
