//! The command's process group under `dlock run`: its reaper (`dlock reap`), the terminal
//! handed to it, and job control (a stopped command stops dlock's job too).

use std::io::IsTerminal;
use std::process::Stdio;
use std::time::Duration;

use dlock::backend::{Deadline, later};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use tokio::io::AsyncWriteExt;
use tokio::signal::unix::{SignalKind, signal};

use super::RunOpts;
use crate::exit;

/// A process of dlock's own (`dlock reap`) that kills the command's process group if this
/// dlock dies before saying it is done, even by SIGKILL, or when the hold's end that dlock
/// last told it passes (a dlock that is stopped cannot act): nothing keeps running unlocked. It
/// leads that group (the command joins it), so it knows the group before the command runs. It
/// reads its stdin (a pipe from this process) until EOF; "done" before EOF means leave the
/// group alone. Signals sent to the group (a Ctrl-C, dlock's own) do not end it.
pub(super) struct Reaper {
    child: tokio::process::Child,
    group: i32,
    /// What the reaper is to hear next; a task of its own writes it to the pipe, so that a
    /// reaper that does not read (stopped with the command's group) never holds up dlock.
    said: tokio::sync::watch::Sender<Said>,
    writer: tokio::task::JoinHandle<()>,
}

/// What dlock tells its reaper: the hold's end (on the host's monotonic clock, in ns), or
/// that it is done. Only the latest is written: a reaper that reads late learns the latest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Said {
    Nothing,
    Until(u64),
    Done,
}

/// Writes what dlock says to the reaper's stdin, the latest each time, until `done` (then the
/// pipe closes) or until dlock drops its reaper (the pipe closes without it: the reaper kills
/// the group).
async fn tell(
    mut stdin: tokio::process::ChildStdin,
    mut heard: tokio::sync::watch::Receiver<Said>,
) {
    while heard.changed().await.is_ok() {
        let said = *heard.borrow_and_update();
        let line = match said {
            Said::Nothing => continue,
            Said::Until(ns) => format!("until {ns}\n"),
            Said::Done => "done\n".to_owned(),
        };
        if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
            return;
        }
        if said == Said::Done {
            return;
        }
    }
}

/// `within` from now on the host's monotonic clock, in ns (what the reaper reads).
fn end_in(within: Duration) -> u64 {
    let within = u64::try_from(within.as_nanos()).unwrap_or(u64::MAX);
    crate::host::now_ns().saturating_add(within)
}

/// How long `dlock run` waits for its reaper to be ready before it runs the command without.
const REAPER_READY_WITHIN: Duration = Duration::from_secs(5);

impl Reaper {
    /// Starts the reaper, told that the hold is vouched for `within` from now, and waits until
    /// it is ready (its signal handlers are in place), at most [`REAPER_READY_WITHIN`]; `None`
    /// (the command then leads a group of its own) if it cannot start or is not ready in time.
    /// The first end goes on its command line, not down the pipe: a dlock stopped before its
    /// writer task ran would otherwise leave the reaper with no end at all.
    pub(super) async fn start(within: Duration) -> Option<Self> {
        use tokio::io::AsyncReadExt;
        let cannot = |why: &dyn std::fmt::Display| {
            eprintln!(
                "dlock: cannot start the reaper ({why}); if dlock is killed, the command may \
                 outlive it"
            );
        };
        let exe = std::env::current_exe().ok()?;
        let mut child = tokio::process::Command::new(exe)
            .arg("reap")
            .arg(format!("--until={}", end_in(within)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| cannot(&e))
            .ok()?;
        let group = child.id().and_then(|id| i32::try_from(id).ok())?;
        let mut ready = [0u8; 6];
        let said = match child.stdout.take() {
            Some(mut out) => {
                Deadline::after(REAPER_READY_WITHIN)
                    .run(out.read_exact(&mut ready))
                    .await
            }
            None => None,
        };
        if !matches!(said, Some(Ok(_))) || &ready != b"ready\n" {
            cannot(&"it did not say it was ready");
            return None;
        }
        let stdin = child.stdin.take()?;
        let (said, heard) = tokio::sync::watch::channel(Said::Nothing);
        let writer = tokio::spawn(tell(stdin, heard));
        Some(Self {
            child,
            group,
            said,
            writer,
        })
    }

    /// Whether the reaper has exited: it killed its group when the hold's end passed (or
    /// its pipe closed), so a command must not join that group.
    pub(super) fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// The process group the command joins: the reaper's own.
    pub(super) fn group(&self) -> i32 {
        self.group
    }

    /// The hold is vouched for `within` from now: unless told a later end first, the reaper
    /// kills the command's group then. dlock says so again and again while the command runs
    /// and before it stops, so a dlock that cannot act (stopped by Ctrl-Z, or by a SIGSTOP to
    /// it alone, which it cannot catch) still has its command killed when the hold ends. The
    /// end is absolute (the host's monotonic clock, which both processes read) and only ever
    /// moves later: a line the reaper reads late cannot cut a hold short.
    pub(super) fn vouched_for(&self, within: Duration) {
        let until = end_in(within);
        self.said.send_if_modified(|said| match *said {
            Said::Until(old) if old >= until => false,
            Said::Done => false,
            _ => {
                *said = Said::Until(until);
                true
            }
        });
    }

    /// The command's group is gone or being handled: the reaper leaves it alone and exits.
    /// It may have been stopped with the group (SIGSTOP cannot be caught): it is continued,
    /// and waited for at most [`REAPER_READY_WITHIN`], then killed.
    pub(super) async fn done(reaper: Option<Self>) {
        let Some(mut reaper) = reaper else { return };
        reaper.said.send_replace(Said::Done);
        // Continued first: a reaper stopped with the group reads nothing, and its pipe may be
        // full.
        let _ = nix::sys::signal::kill(Pid::from_raw(reaper.group), Signal::SIGCONT);
        if Deadline::after(REAPER_READY_WITHIN)
            .run(&mut reaper.writer)
            .await
            .is_none()
        {
            reaper.writer.abort();
        }
        if Deadline::after(REAPER_READY_WITHIN)
            .run(reaper.child.wait())
            .await
            .is_none()
        {
            let _ = reaper.child.kill().await;
        }
    }
}

/// `dlock reap`: leads a process group of its own, which the command of the `dlock run` that
/// started it joins; waits for its stdin to close, and kills the group (itself last) unless
/// "done" came first, or when the hold's end passes (`until`, then what dlock says).
pub(crate) async fn reap(until: Option<u64>) -> u8 {
    use tokio::io::AsyncBufReadExt;
    // The signals the group gets (a Ctrl-C at the terminal, those dlock passes on to the
    // command) are caught and dropped: the reaper must outlive the command's interruption.
    // So are the others whose default would end or stop it (an operator's `kill -USR1` to
    // the group, job control); SIGKILL and SIGSTOP cannot be caught.
    let _caught: Vec<_> = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
        SignalKind::quit(),
        SignalKind::user_defined1(),
        SignalKind::user_defined2(),
        SignalKind::alarm(),
        SignalKind::io(),
        SignalKind::from_raw(nix::libc::SIGTSTP),
        SignalKind::from_raw(nix::libc::SIGTTIN),
        SignalKind::from_raw(nix::libc::SIGTTOU),
        SignalKind::from_raw(nix::libc::SIGVTALRM),
        SignalKind::from_raw(nix::libc::SIGPROF),
        SignalKind::from_raw(nix::libc::SIGXCPU),
        SignalKind::from_raw(nix::libc::SIGXFSZ),
        SignalKind::from_raw(nix::libc::SIGPWR),
    ]
    .into_iter()
    .filter_map(|kind| signal(kind).ok())
    .collect();
    {
        use tokio::io::AsyncWriteExt;
        let mut out = tokio::io::stdout();
        if out.write_all(b"ready\n").await.is_err() || out.flush().await.is_err() {
            return 0;
        }
    }
    // dlock's lines: `done` (leave the group alone), `until NS` (the hold is vouched for
    // until NS on the host's monotonic clock: kill the group then unless a later end comes
    // first, for a dlock that is stopped or frozen cannot act; an earlier one changes
    // nothing). The end of input without `done` kills the group. A line waiting to be read
    // goes before the end: the reader may have been stopped past an end a later line moved.
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut until = until;
    let done = loop {
        let line = match until {
            Some(ns) => {
                let left = Duration::from_nanos(ns.saturating_sub(crate::host::now_ns()));
                tokio::select! {
                    biased;
                    line = lines.next_line() => line,
                    () = tokio::time::sleep_until(later(tokio::time::Instant::now(), left)) => break false,
                }
            }
            None => lines.next_line().await,
        };
        match line {
            Ok(Some(line)) if line == "done" => break true,
            Ok(Some(line)) => {
                if let Some(ns) = line
                    .strip_prefix("until ")
                    .and_then(|ns| ns.parse::<u64>().ok())
                {
                    until = Some(until.map_or(ns, |old| old.max(ns)));
                }
            }
            _ => break false,
        }
    };
    let me = nix::unistd::getpid();
    // Only a group this process leads (never dlock's own, if it was started otherwise).
    if !done && getpgrp() == me && me.as_raw() > 1 {
        let _ = killpg(me, Signal::SIGKILL);
    }
    0
}

/// The terminal handed to the command's process group while it runs, when dlock runs in the
/// foreground of a terminal: the command may read from it, and the terminal's Ctrl-C goes to
/// the command (once). Given back when dropped.
pub(super) struct Foreground {
    ours: Pid,
}

impl Foreground {
    pub(super) fn hand_to(group: Pid) -> Option<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let ours = getpgrp();
        if tcgetpgrp(&stdin).ok()? != ours {
            return None;
        }
        with_sigttou_blocked(|| tcsetpgrp(&stdin, group)).ok()?;
        Some(Self { ours })
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        let stdin = std::io::stdin();
        let _ = with_sigttou_blocked(|| tcsetpgrp(&stdin, self.ours));
    }
}

/// What [`suspend`] works with.
pub(super) struct Suspension<'a> {
    pub(super) guard: &'a dlock::LockGuard,
    pub(super) opts: &'a RunOpts,
    pub(super) token: dlock::FencingToken,
    pub(super) terminal: &'a mut Option<Foreground>,
    pub(super) reaper: &'a mut Option<Reaper>,
    /// The command's process group (the reaper's), to hand the terminal to.
    pub(super) group: Option<Pid>,
    /// The groups to continue the command in.
    pub(super) targets: &'a (dyn Fn() -> Vec<Pid> + Sync),
}

/// The command has stopped (or was just told to): dlock stops its own job too (its whole
/// process group, so that a pipeline it is part of stops with it), and the shell that waits
/// for that job gets its prompt back. Stopped, dlock renews nothing; the reaper, which never
/// stops, kills the command's group when the hold ends, should anyone continue the command
/// meanwhile. Continued (`fg`, `bg`), dlock lets the renewal a long stop made due run first
/// and continues the command only if the hold is still this run's, vouched for past
/// `--kill-after`: `Some(76)` if not, and the caller kills the command, still stopped.
pub(super) async fn suspend(s: &mut Suspension<'_>) -> Option<u8> {
    drop(s.terminal.take());
    if let Some(reaper) = s.reaper.as_mut() {
        reaper.vouched_for(s.guard.remaining());
    }
    let _ = killpg(getpgrp(), Signal::SIGSTOP);
    let guard = s.guard;
    let kill_after = s.opts.hold.kill_after;
    let _ = Deadline::after(guard.remaining())
        .run(async {
            while guard.is_held() && guard.remaining() <= kill_after {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    if let Some(reaper) = s.reaper.as_mut() {
        reaper.vouched_for(guard.remaining());
    }
    if !guard.is_held() {
        eprintln!(
            "dlock: the lock {:?} (token {}) ended while dlock was stopped; killing the \
             command (SIGKILL to its process group)",
            s.opts.name, s.token
        );
        return Some(exit::LOST);
    }
    if in_foreground() {
        *s.terminal = s.group.and_then(Foreground::hand_to);
    }
    for g in (s.targets)() {
        let _ = killpg(g, Signal::SIGCONT);
    }
    None
}

/// Kills the command's process `groups`, waits for the command `child`, and kills the groups
/// again (what the command started in them goes too); then lets the reaper go.
pub(super) async fn kill_and_reap(
    groups: &[Pid],
    child: &mut tokio::process::Child,
    reaper: Option<Reaper>,
) {
    for g in groups {
        let _ = killpg(*g, Signal::SIGKILL);
    }
    let _ = child.wait().await;
    for g in groups {
        let _ = killpg(*g, Signal::SIGKILL);
    }
    Reaper::done(reaper).await;
}

/// Whether the command `pid` (a child of this process) has stopped since last asked: the
/// stop is taken, never its exit, which is tokio's to reap.
pub(super) fn stopped(pid: Pid) -> bool {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    matches!(
        waitid(Id::Pid(pid), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG),
        Ok(WaitStatus::Stopped(..))
    )
}

/// Whether process `pid` is stopped now, as `/proc` says (its state `T`): set once the
/// process has stopped, not when its stop is only under way. Linux; elsewhere, never.
pub(super) fn is_stopped(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('T'))
    })
}

/// Whether this process's group is the foreground of the terminal on its stdin.
pub(super) fn in_foreground() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(&stdin).is_ok_and(|g| g == getpgrp())
}

/// Runs `f` with SIGTTOU blocked on this thread, so that a process not in the terminal's
/// foreground may change the foreground group.
fn with_sigttou_blocked<T>(f: impl FnOnce() -> T) -> T {
    let mut block = SigSet::empty();
    block.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    let blocked = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&block), Some(&mut old)).is_ok();
    let result = f();
    if blocked {
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    result
}
