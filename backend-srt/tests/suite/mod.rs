mod common;
mod fake;
mod real;
