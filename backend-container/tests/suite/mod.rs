mod conformance;
mod fake_engine;
mod helpers;
mod real_docker;
mod real_podman;
mod real_remote;
mod remote_fake;
mod transaction;
