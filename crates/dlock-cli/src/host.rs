//! What the processes of one host share, for the commands that run several (`dlock torture`,
//! `dlock bench`'s workloads across processes): a clock they can compare, and a child's tie to
//! the process that started it.

/// Nanoseconds on the host's monotonic clock (`CLOCK_MONOTONIC`), comparable across the
/// processes of one host, unlike `Instant`.
pub(crate) fn now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .ok()
        .and_then(|t| {
            let secs = u64::try_from(t.tv_sec()).ok()?;
            let nanos = u64::try_from(t.tv_nsec()).ok()?;
            secs.checked_mul(1_000_000_000)?.checked_add(nanos)
        })
        .unwrap_or(0)
}

/// Asks the kernel to SIGKILL this process when the thread that started it ends (its parent's
/// runtime threads live as long as the parent does), so that a parent killed outright leaves
/// no child behind, a stopped one included (SIGKILL ends a stopped process too). Linux only;
/// elsewhere a child stops when its standard input closes.
pub(crate) fn die_with_parent() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("PR_SET_PDEATHSIG: {e}"))?;
    Ok(())
}
