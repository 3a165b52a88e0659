//! `dlock run`: a command under a lock.

use std::ffi::OsString;
use std::process::Stdio;
use std::time::Duration;

use std::io::IsTerminal;

use clap::Args;
use dlock::backend::{Deadline, later};
use dlock::{Lease, LockOptions, Member};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::{Pid, getpgrp};
use tokio::signal::unix::{SignalKind, signal};

use crate::{StoreOpts, exit, fail, parse_duration};

mod job;

pub(crate) use self::job::reap;
use self::job::{Foreground, Reaper, Suspension, is_stopped, kill_and_reap, stopped, suspend};

/// What `dlock run` and `dlock elect` share: the store, how long to wait, the lease, and how
/// the command is stopped when the hold ends.
#[derive(Debug, Args)]
pub struct HoldOpts {
    #[command(flatten)]
    store: StoreOpts,

    /// Wait at most this long for the lock (default: as long as it takes); `-w 10` is 10
    /// seconds, as flock's.
    #[arg(long, short = 'w', value_name = "DURATION", value_parser = parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,

    /// Do not wait: give up at once if the lock is held.
    #[arg(long, short = 'n')]
    no_wait: bool,

    /// The lease, renewed while the command runs (a dlock that dies frees the lock this long
    /// after its last renewal).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    lease: Duration,

    /// The signal that tells the command to stop, --kill-after before the lock ends (a name,
    /// with or without SIG, or a number).
    #[arg(long, value_name = "SIGNAL", value_parser = parse_signal, default_value = "TERM")]
    signal: Signal,

    /// The command's grace period: it gets the --signal (SIGTERM) this long before the lock
    /// ends unless renewed, and SIGKILL (its whole process group) when it ends, so the grace
    /// period is spent while the lock is still this dlock's, before anyone else can hold it.
    ///
    /// The lock "ends" when dlock stops vouching for it unless a renewal comes first: the
    /// lease's end (ZooKeeper, etcd: the session's horizon, the last answer plus the session
    /// timeout) less a clock-drift allowance. A renewal moves it, so a healthy run is never
    /// signalled. ZooKeeper and etcd holds are vouched for only a few seconds ahead (about 5 to
    /// 7 s with their default 10 s session), hence the short default; a --kill-after that is
    /// not shorter than what the hold has left right after the grant is refused (exit 78)
    /// before the command runs.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    kill_after: Duration,

    /// Chubby's lock-delay: if this dlock is cut off from the store, its command is stopped
    /// at least this long before anyone else can hold the name (a release frees it at once),
    /// so writes the command sent just before get this long to land. It comes off every
    /// renewal's reach: with the drift allowance, at most half the lease (ZooKeeper, etcd:
    /// half the session timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "0s")]
    lock_delay: Duration,

    /// Exit status when the lock is not had in time.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "CODE", default_value_t = exit::NOT_ACQUIRED)]
    conflict_exit_code: u8,
}

/// Options of `dlock run`.
#[derive(Debug, Args)]
pub struct RunOpts {
    #[command(flatten)]
    hold: HoldOpts,

    /// Wait in line: waiters get the lock in the order they asked (backends that can).
    #[arg(long)]
    fair: bool,

    /// Share the lock with other --shared runs (a read hold, as `flock -s`); an exclusive run
    /// waits for them all, and they for it. Backends without read-write locks refuse it.
    #[arg(long, short = 's', conflicts_with = "permits")]
    shared: bool,

    /// Let up to N runs hold the name at once (a semaphore of N permits, as `consul lock -n`).
    /// Every run of the name must give the same N. Backends without semaphores refuse it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    permits: Option<u32>,

    /// Keep the lock at least this long from the grant, even when the command ends sooner
    /// (ShedLock's lockAtLeastFor): dlock holds it, renewed, until then and exits after the
    /// release, with the command's status. With --no-wait, a job that a fleet of schedulers
    /// starts seconds apart runs once: the first takes the lock, the others find it held. A
    /// signal (SIGINT, SIGTERM, SIGHUP) ends the wait and releases at once; a command that
    /// did not run keeps nothing.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    hold_at_least: Option<Duration>,

    /// The lock's name.
    name: String,

    /// The command and its arguments: `NAME COMMAND [ARGS...]`, as flock(1) takes them, or
    /// after `--` (`NAME -- COMMAND [ARGS...]`), which also lets a command begin with `-`.
    /// Everything from the command on is the command's, options included.
    #[arg(required = true, trailing_var_arg = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

impl HoldOpts {
    /// The store to use.
    pub(crate) fn store(&self) -> &StoreOpts {
        &self.store
    }
}

impl RunOpts {
    /// The run of `dlock elect`: an exclusive hold (the leadership) with `hold`'s settings.
    pub(crate) fn campaign(hold: HoldOpts, name: String, command: Vec<OsString>) -> Self {
        Self {
            hold,
            fair: false,
            shared: false,
            permits: None,
            hold_at_least: None,
            name,
            command,
        }
    }
}

pub(crate) async fn run(opts: RunOpts) -> u8 {
    run_as(opts, None).await
}

/// `dlock run`, or with `proposal`, `dlock elect`: the command runs while this process leads
/// the election of that name, campaigning with the proposal.
pub(crate) async fn run_as(opts: RunOpts, proposal: Option<Vec<u8>>) -> u8 {
    let url = match opts.hold.store.url_or_status() {
        Ok(u) => u,
        Err(code) => return code,
    };
    let locks = match dlock::connect(&url).await {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot use {}", dlock::redact(&url)), &e),
    };
    let code = run_on(&locks, opts, proposal.as_deref()).await;
    // Every way out: what the run left to background tasks (a release, the undo of a wait
    // a signal ended) is finished before the runtime that runs them ends with `main`. A
    // signal meanwhile (a second Ctrl-C) ends the wait: the store's leases end the rest.
    let closed = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut interrupt), Ok(mut terminate)) => tokio::select! {
            closed = locks.close() => closed,
            _ = interrupt.recv() => return code,
            _ = terminate.recv() => return code,
        },
        _ => locks.close().await,
    };
    if !closed.is_clean() {
        eprintln!(
            "dlock: {} hold(s) and {} clean-up(s) were not finished within {}; their leases \
             end them",
            closed.unreleased,
            closed.cleanups_left,
            humantime::format_duration(dlock::CLOSE_WITHIN)
        );
    }
    code
}

/// `dlock run` on the store `locks` talks to: the exit status.
async fn run_on(locks: &dlock::Locks, opts: RunOpts, proposal: Option<&[u8]>) -> u8 {
    let options = LockOptions::new()
        .with_lease(Lease::watchdog(opts.hold.lease))
        .with_fair(opts.fair)
        .with_lock_delay(opts.hold.lock_delay);
    let contender = match proposal {
        Some(p) => locks
            .election_with(&opts.name, options)
            .map(|e| Contender::Campaign(e, p)),
        None => member(locks, &opts, options).map(Contender::Lock),
    };
    let contender = match contender {
        Ok(c) => c,
        Err(e) => return fail(&format!("cannot lock {:?}", opts.name), &e),
    };
    let (mut interrupt, mut terminate, mut hangup) = match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) {
        (Ok(i), Ok(t), Ok(h)) => (i, t, h),
        _ => {
            eprintln!("dlock: cannot install signal handlers");
            return exit::SOFTWARE;
        }
    };
    let wait = if opts.hold.no_wait {
        Some(Duration::ZERO)
    } else {
        opts.hold.wait
    };
    let acquiring = contender.hold(wait);
    let guard = tokio::select! {
        r = acquiring => match r {
            Ok(Some(g)) => g,
            Ok(None) => {
                eprintln!("dlock: {:?} is held by someone else{}", opts.name, match wait {
                    Some(w) if !w.is_zero() => format!(" (waited {})", humantime::format_duration(w)),
                    _ => String::new(),
                });
                return opts.hold.conflict_exit_code;
            }
            Err(e) => {
                let code = fail(&format!("cannot acquire {:?}", opts.name), &e);
                if matches!(e, dlock::Error::Connection { .. }) {
                    eprintln!(
                        "dlock: the store did not answer: whether {:?} is held is not known",
                        opts.name
                    );
                }
                return code;
            }
        },
        _ = interrupt.recv() => return 128 + 2,
        _ = terminate.recv() => return 128 + 15,
        _ = hangup.recv() => return 128 + 1,
    };
    let token = guard.fencing_token();
    let granted = tokio::time::Instant::now();
    let Some((program, args)) = opts.command.split_first() else {
        return exit::CONFIG;
    };
    // The SIGTERM comes --kill-after before the hold's end: a hold that has no more than
    // that left at the grant would be signalled as soon as the command starts.
    let left = guard.remaining();
    if opts.hold.kill_after >= left {
        eprintln!(
            "dlock: --kill-after {} is not shorter than what the hold on {:?} has left: the \
             hold is vouched for only {} ahead on this backend (unless renewed); use a shorter \
             --kill-after or a longer --lease",
            humantime::format_duration(opts.hold.kill_after),
            opts.name,
            humantime::format_duration(whole_ms(left)),
        );
        if let Err(e) = guard.release().await {
            eprintln!("dlock: releasing {:?}: {e}", opts.name);
        }
        return exit::CONFIG;
    }
    // The command runs in a process group of its own: signals and the loss reach everything
    // it starts, and a Ctrl-C meant for it is not delivered twice (once by the terminal, once
    // by dlock). The group is the reaper's, started first, so the reaper knows it before the
    // command runs: a dlock killed at any moment after that takes the command along.
    // The reaper kills the group when the hold ends unless dlock tells it a later end: a dlock
    // that is stopped (a SIGSTOP to it alone cannot be caught) cannot. dlock tells it again a
    // sixth of what the hold has left later (10 ms to 1 s): always before the end it last
    // told, so a renewal reaches the reaper before the end it moved.
    let mut reaper = Reaper::start(guard.remaining()).await;
    let mut report_at = tokio::time::Instant::now();
    // The terminal goes to that group before the command runs: a command that reads from it
    // at once must not be stopped as a background job (SIGTTIN) before it is handed over.
    let mut terminal = reaper
        .as_ref()
        .and_then(|r| Foreground::hand_to(Pid::from_raw(r.group())));
    // Job control. A command stopped by the terminal (Ctrl-Z, a read from the background)
    // stops dlock and its job with it, where dlock runs in a terminal (its stdin is one); a
    // SIGTSTP to dlock itself (Ctrl-Z while dlock's group has the terminal, or sent to it)
    // stops the command first, wherever dlock runs. Registered before the command starts,
    // so that no early stop goes unseen.
    let mut child_events = if std::io::stdin().is_terminal() {
        signal(SignalKind::child()).ok()
    } else {
        None
    };
    let Ok(mut suspend_requests) = signal(SignalKind::from_raw(nix::libc::SIGTSTP)) else {
        eprintln!("dlock: cannot install signal handlers");
        Reaper::done(reaper).await;
        let _ = guard.release().await;
        return exit::SOFTWARE;
    };
    // A dlock stopped after the reaper started, past the hold's end, finds the reaper gone
    // (it killed its own group at that end): the command would run unlocked in a group
    // nobody watches. Checked last before the command starts.
    if !guard.is_held() || reaper.as_mut().is_some_and(Reaper::exited) {
        drop(terminal);
        eprintln!(
            "dlock: the lock {:?} (token {token}) ended before the command could start",
            opts.name
        );
        Reaper::done(reaper).await;
        let _ = guard.release().await;
        return exit::LOST;
    }
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env("DLOCK_FENCING_TOKEN", token.to_string())
        .env("DLOCK_NAME", &opts.name)
        // The store's URL may carry a password: the command does not inherit it.
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_URL_FILE")
        .stdin(Stdio::inherit())
        .process_group(reaper.as_ref().map_or(0, Reaper::group));
    let mut child = match command.spawn() {
        Ok(c) => c,
        Err(e) => {
            drop(terminal);
            eprintln!("dlock: cannot run {}: {e}", program.to_string_lossy());
            Reaper::done(reaper).await;
            let _ = guard.release().await;
            return if e.kind() == std::io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
        }
    };
    let group = match &reaper {
        Some(r) => Some(Pid::from_raw(r.group())),
        None => child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw),
    };
    let command = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw);
    // To the group, and to the command's own group if it left the reaper's (a shell with job
    // control does: it leads a group of its own), so that signals and the loss still reach
    // it. (A dlock killed with SIGKILL then leaves such a command running: its reaper only
    // knows its own group.)
    // Read while the command is not yet waited for (its pid cannot be another's then).
    let targets = || {
        let mut groups: Vec<Pid> = group.into_iter().collect();
        if let Some(own) = command.and_then(|c| nix::unistd::getpgid(Some(c)).ok())
            && !groups.contains(&own)
            && own != getpgrp()
        {
            groups.push(own);
        }
        groups
    };
    let send_to = |groups: &[Pid], sig: Signal| {
        for g in groups {
            let _ = killpg(*g, sig);
        }
    };
    let send = |sig: Signal| send_to(&targets(), sig);
    // Without a reaper the group is the command's own, known only now.
    if terminal.is_none() {
        terminal = group.and_then(Foreground::hand_to);
    }
    // The command is told to stop (SIGTERM) --kill-after before the guard stops vouching for
    // the hold unless renewed (`expiring`), and killed (SIGKILL) when it stops (`lost`, which
    // resolves at `held_until` at the latest, before the store can give the lock to anyone
    // else, and follows every renewal), or at once when the hold is found gone. Its grace
    // period is so spent while the lock is still this dlock's.
    let lost = guard.lost();
    let expiring = guard.expiring(opts.hold.kill_after);
    tokio::pin!(lost, expiring);
    // Whether the command was told to stop because the lock was ending. It stays told if a
    // renewal then moves the end: it is killed at the new end unless it exits first.
    let mut told = false;
    // Whether a stop signal reached dlock (and was passed on to the command): the command's
    // end is then no time to keep the lock for --hold-at-least.
    let mut stopping = false;
    // What `suspend` works with, borrowed anew at each stop.
    macro_rules! suspension {
        () => {
            Suspension {
                guard: &guard,
                opts: &opts,
                token,
                terminal: &mut terminal,
                reaper: &mut reaper,
                group,
                targets: &targets,
            }
        };
    }
    // A stop that came before the command was being watched.
    let mut stop_pending = child_events.is_some() && command.is_some_and(stopped);
    loop {
        tokio::select! {
            // A command that exited is handled first: its status and the release decide.
            biased;
            status = child.wait() => {
                drop(terminal);
                Reaper::done(reaper).await;
                let code = match status {
                    Ok(s) => status_code(s),
                    Err(e) => {
                        eprintln!("dlock: waiting for the command failed: {e}");
                        exit::SOFTWARE
                    }
                };
                // --hold-at-least: the lock stays this run's, renewed, until then; a signal
                // ends the wait (the release comes at once), and a loss meanwhile is no
                // failure of the command, which has ended.
                let waited = opts.hold_at_least.is_some() && !told && !stopping;
                if let Some(least) = opts.hold_at_least.filter(|_| waited) {
                    tokio::select! {
                        () = tokio::time::sleep_until(later(granted, least)) => {}
                        () = &mut lost => {
                            eprintln!(
                                "dlock: the lock {:?} (token {token}) was lost after the command \
                                 ended (status {code}), before --hold-at-least was up",
                                opts.name
                            );
                            return code;
                        }
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                        _ = hangup.recv() => {}
                    }
                }
                return match guard.release().await {
                    Ok(()) if told => {
                        eprintln!(
                            "dlock: the command exited after {} (status {code}); {:?} \
                             released",
                            opts.hold.signal, opts.name
                        );
                        exit::LOST
                    }
                    Ok(()) => code,
                    // The command had ended well before: the loss came while dlock kept the
                    // lock for --hold-at-least.
                    Err(dlock::Error::LockLost { .. }) if waited => {
                        eprintln!(
                            "dlock: the lock {:?} (token {token}) was lost after the command \
                             ended (status {code}), before --hold-at-least was up",
                            opts.name
                        );
                        code
                    }
                    Err(dlock::Error::LockLost { .. }) => {
                        eprintln!(
                            "dlock: lost the lock {:?} (token {token}) while the command ran: \
                             the store no longer had the hold when the command ended (status \
                             {code})",
                            opts.name
                        );
                        exit::LOST
                    }
                    Err(e) => {
                        eprintln!("dlock: releasing {:?}: {e}", opts.name);
                        if told { exit::LOST } else { code }
                    }
                };
            }
            () = &mut lost => {
                let why = guard
                    .loss_reason()
                    .map_or_else(|| "no reason given".to_string(), |r| r.to_string());
                eprintln!(
                    "dlock: lost the lock {:?} (token {token}) while the command ran: {why}; \
                     killing it (SIGKILL to its process group)",
                    opts.name
                );
                drop(terminal);
                kill_and_reap(&targets(), &mut child, reaper).await;
                return exit::LOST;
            }
            () = &mut expiring, if !told => {
                told = true;
                match guard.held_until() {
                    Some(_) => eprintln!(
                        "dlock: the lock {:?} (token {token}) ends in {} ms unless renewed; \
                         terminating the command ({}), SIGKILL when the lock ends",
                        opts.name,
                        guard.remaining().as_millis(),
                        opts.hold.signal
                    ),
                    None => eprintln!(
                        "dlock: the lock {:?} (token {token}) has ended; terminating the command",
                        opts.name
                    ),
                }
                let groups = targets();
                send_to(&groups, opts.hold.signal);
                send_to(&groups, Signal::SIGCONT);
            }
            Some(()) = async {
                if stop_pending {
                    return Some(());
                }
                child_events.as_mut()?.recv().await
            }, if child_events.is_some() || stop_pending => {
                stop_pending = false;
                if !command.is_some_and(stopped) {
                    continue;
                }
                if let Some(code) = suspend(&mut suspension!()).await {
                    kill_and_reap(&targets(), &mut child, reaper).await;
                    return code;
                }
            }
            () = tokio::time::sleep_until(report_at) => {
                let left = guard.remaining();
                if let Some(r) = &reaper {
                    r.vouched_for(left);
                }
                report_at = later(
                    tokio::time::Instant::now(),
                    (left / 6).clamp(Duration::from_millis(10), Duration::from_secs(1)),
                );
            }
            Some(()) = suspend_requests.recv() => {
                // The command is asked to stop first (SIGTSTP: the reaper ignores it; a
                // command that catches it, as an editor does, stops itself), and dlock waits
                // for that a second at most, then stops as above. A command that does not
                // stop, or is continued meanwhile, runs on: the reaper kills it when the
                // hold ends.
                send(Signal::SIGTSTP);
                if let Some(pid) = command {
                    let _ = Deadline::after(Duration::from_secs(1))
                        .run(async {
                            while !is_stopped(pid) {
                                tokio::time::sleep(Duration::from_millis(5)).await;
                            }
                        })
                        .await;
                }
                if let Some(code) = suspend(&mut suspension!()).await {
                    kill_and_reap(&targets(), &mut child, reaper).await;
                    return code;
                }
            }
            _ = interrupt.recv() => {
                stopping = true;
                send(Signal::SIGINT);
                // A stopped command acts on it only once continued.
                send(Signal::SIGCONT);
            }
            _ = terminate.recv() => {
                stopping = true;
                send(Signal::SIGTERM);
                // A stopped command acts on it only once continued.
                send(Signal::SIGCONT);
            }
            _ = hangup.recv() => {
                stopping = true;
                send(Signal::SIGHUP);
                // A stopped command acts on it only once continued.
                send(Signal::SIGCONT);
            }
        }
    }
}

/// What `dlock run` holds the name by: the mutex, a read hold of the read-write lock
/// (`--shared`), or a permit of the semaphore (`--permits`).
/// What a run waits for: a lock (of any kind), or the lead of an election with a proposal.
enum Contender<'a> {
    Lock(Member),
    Campaign(dlock::DynElection, &'a [u8]),
}

impl Contender<'_> {
    /// The hold, waiting `wait` (`None`: as long as it takes); `Ok(None)` if another holds or
    /// leads then.
    async fn hold(&self, wait: Option<Duration>) -> dlock::Result<Option<dlock::LockGuard>> {
        match (self, wait) {
            (Self::Lock(lock), Some(w)) => lock.try_acquire(w).await,
            (Self::Lock(lock), None) => lock.acquire().await.map(Some),
            (Self::Campaign(e, proposal), Some(w)) => Ok(e
                .try_campaign(proposal, w)
                .await?
                .map(dlock::Leadership::into_guard)),
            (Self::Campaign(e, proposal), None) => {
                Ok(Some(e.campaign(proposal).await?.into_guard()))
            }
        }
    }
}

fn member(locks: &dlock::Locks, opts: &RunOpts, options: LockOptions) -> dlock::Result<Member> {
    Ok(match (opts.shared, opts.permits) {
        (true, _) => Member::read(locks.read_write_lock_with(&opts.name, options)?),
        (false, Some(n)) => Member::permit(locks.semaphore_with(&opts.name, n, options)?),
        (false, None) => Member::Lock(locks.lock_with(&opts.name, options)?),
    })
}

/// A signal by name (`TERM`, `SIGTERM`, any case) or number (`15`).
fn parse_signal(text: &str) -> Result<Signal, String> {
    let text = text.trim();
    let parsed = match text.parse::<i32>() {
        Ok(n) => Signal::try_from(n).ok(),
        Err(_) => {
            let upper = text.to_ascii_uppercase();
            let name = if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            };
            name.parse::<Signal>().ok()
        }
    };
    match parsed {
        Some(Signal::SIGKILL | Signal::SIGSTOP) => Err(format!(
            "{text}: the stop signal must be one the command can catch (SIGKILL comes anyway \
             when the lock ends)"
        )),
        Some(s) => Ok(s),
        None => Err(format!(
            "{text:?} is not a signal (e.g. TERM, INT, HUP, USR1, 15)"
        )),
    }
}

/// `d` cut to whole milliseconds, for messages.
fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The shell's convention: the exit code, or 128 + the signal that ended the process.
fn status_code(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::SOFTWARE),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(exit::SOFTWARE),
        (None, None) => exit::SOFTWARE,
    }
}
