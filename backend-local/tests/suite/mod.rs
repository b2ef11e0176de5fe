mod common;
mod conformance;
mod daemons;
mod environment;
mod ports;
mod supervise;
