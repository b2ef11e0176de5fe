//! Every byte agentdiff itself prints goes through here (`outln!`, `out!`, `errln!`, `errout!`).
//!
//! `println!` panics when the reader has gone (`agentdiff runs | head`). Here a closed pipe ends
//! that stream quietly: later writes to it are dropped and the command finishes its work (a run
//! still seals its capsule, a rollback still completes) and exits with its own code. Any other
//! write failure (a full disk behind a redirect, EIO) is remembered and turns the exit code into
//! an internal error, because output the user asked for was lost.
//!
//! Not defended: a reader that stalls without closing the pipe blocks agentdiff like any writer.

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);
static FAILURE: Mutex<Option<String>> = Mutex::new(None);

/// Writes to standard output; a closed pipe silences it (see the module docs).
pub fn stdout(args: fmt::Arguments<'_>) {
    write_to(
        &mut io::stdout().lock(),
        &STDOUT_CLOSED,
        "standard output",
        args,
    );
}

/// Writes to standard error; a closed pipe silences it (see the module docs).
pub fn stderr(args: fmt::Arguments<'_>) {
    write_to(
        &mut io::stderr().lock(),
        &STDERR_CLOSED,
        "standard error",
        args,
    );
}

/// Writes `bytes` to standard output as they are (e.g. the starter policy).
pub fn stdout_bytes(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    if STDOUT_CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let result = out.write_all(bytes).and_then(|()| out.flush());
    settle(result, &STDOUT_CLOSED, "standard output");
}

fn write_to(w: &mut dyn Write, closed: &AtomicBool, name: &str, args: fmt::Arguments<'_>) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    let result = w.write_fmt(args).and_then(|()| w.flush());
    settle(result, closed, name);
}

fn settle(result: io::Result<()>, closed: &AtomicBool, name: &str) {
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => closed.store(true, Ordering::Relaxed),
        Err(e) => {
            closed.store(true, Ordering::Relaxed);
            if let Ok(mut failure) = FAILURE.lock() {
                failure.get_or_insert_with(|| format!("could not write to {name}: {e}"));
            }
        }
    }
}

/// A write failure other than a closed pipe, if one happened.
pub fn failure() -> Option<String> {
    FAILURE.lock().ok().and_then(|f| f.clone())
}

/// `println!` that never panics (see the module docs).
macro_rules! outln {
    () => { $crate::common::out::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::common::out::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `print!` that never panics.
macro_rules! out {
    ($($arg:tt)*) => { $crate::common::out::stdout(format_args!($($arg)*)) };
}

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => { $crate::common::out::stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

/// `eprint!` that never panics.
macro_rules! errout {
    ($($arg:tt)*) => { $crate::common::out::stderr(format_args!($($arg)*)) };
}
