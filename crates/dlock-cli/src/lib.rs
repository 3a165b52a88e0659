#![doc = include_str!("../README.md")]
#![cfg_attr(
    not(test),
    deny(clippy::panic, clippy::unwrap_used, clippy::expect_used)
)]

/// Prints a line to standard output like `println!`, except that a reader that went away
/// (`dlock bench | head -1`) ends the program quietly with [`exit::BROKEN_PIPE`], as a Unix
/// tool killed by `SIGPIPE` would, instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::say_line(format_args!($($arg)*))
    };
}

mod bench;
mod cli;
mod elect;
pub mod exit;
mod host;
mod output;
mod run;
mod status;
mod torture;

pub use crate::bench::{BenchOpts, BenchWorkerOpts, Row, Workload};
pub use crate::cli::{Cli, Command, CompletionsOpts, ManOpts, StoreOpts, parse_duration, run};
pub use crate::elect::ElectOpts;
pub(crate) use crate::output::fail;
pub use crate::run::{HoldOpts, RunOpts};
pub use crate::status::StatusOpts;
pub use crate::torture::{FaultKind, Primitive, Sabotage, TortureOpts, TortureWorkerOpts};
