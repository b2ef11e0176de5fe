mod fake_wrapper;
mod local;
mod self_validation;
