//! What every subcommand shares, and only that: output (`out`, with its macros), exit codes
//! (`exit`), the project context (`context`: the root, the runtime, backend resolution, the
//! project lock, verified run views), the doctor's report and the files written after a run
//! (`outfile`). Files under `cli/` use it; nothing here names a subcommand.

#[macro_use]
pub mod out;
pub mod context;
pub mod doctor_report;
pub mod exit;
pub mod outfile;
