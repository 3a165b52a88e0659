//! Exit statuses of `dlock` itself (besides the command's own, which `dlock run` passes on).

/// `dlock run`: the lock was not had within `--wait` (or at once with `--no-wait`), and
/// the command was not run. Change it with `-E`, as with flock(1).
pub const NOT_ACQUIRED: u8 = 75;
/// `dlock run`: the lock was lost, or was about to end, while the command ran (the
/// command was terminated), or the release found it lost after the command exited.
pub const LOST: u8 = 76;
/// The store could not be reached or did not answer (never taken for "held").
pub const UNAVAILABLE: u8 = 69;
/// A bad URL, lock name, duration or option.
pub const CONFIG: u8 = 78;
/// Any other failure of the store or of dlock.
pub const SOFTWARE: u8 = 70;
/// The command could not be executed (found but not executable).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const NOT_FOUND: u8 = 127;
/// Standard output was closed by its reader (`dlock bench | head -1`): the status a Unix
/// tool killed by `SIGPIPE` gives (128 + 13).
pub const BROKEN_PIPE: u8 = 141;
