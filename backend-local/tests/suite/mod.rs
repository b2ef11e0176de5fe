mod common;
mod daemons;
mod environment;
mod ports;
mod supervise;
mod terminal;
