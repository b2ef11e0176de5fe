mod common;
mod conformance;
mod fake;
mod real;
mod transaction;
