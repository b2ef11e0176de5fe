mod fake_wrapper;
mod local;
mod schemas;
mod self_validation;
