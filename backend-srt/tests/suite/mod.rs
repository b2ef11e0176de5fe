mod common;
mod fake;
mod real;
mod transaction;
