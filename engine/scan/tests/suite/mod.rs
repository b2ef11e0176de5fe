mod scanner;
pub use agentdiff_test_support::skip;
mod programs;
