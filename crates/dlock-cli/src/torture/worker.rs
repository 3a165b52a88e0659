//! One torture worker: a process of its own with its own connections, contending for a few
//! names with every primitive, writing to the shared resource while it holds, and reporting
//! every grant, loss, write and release on stdout (one JSON object per line). It stops when
//! its stdin closes.

use std::io::Write as _;
use std::time::Duration;

use clap::Args;
use dlock::backend::from_now;
use dlock::{DynLockProvider, Lease, LockGuard, LockOptions, Member, MultiLock};
use futures::future::select_all;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use tokio::time::Instant;

use super::history::{HoldKind, WorkerEvent, now_ns};
use super::plan::Rng;
use super::resource::Client;
use super::{Primitive, Sabotage};
use crate::{exit, parse_duration};

/// Options of the hidden `dlock torture-worker` (started by `dlock torture`).
#[derive(Debug, Args)]
pub struct TortureWorkerOpts {
    /// This worker's id.
    #[arg(long)]
    id: u32,
    /// The store (through this worker's proxies).
    #[arg(long)]
    url: String,
    /// The shared resource's address.
    #[arg(long)]
    resource: String,
    /// The run's seed (mixed with the id).
    #[arg(long)]
    seed: u64,
    /// The run's name prefix.
    #[arg(long)]
    prefix: String,
    /// How many names of each primitive.
    #[arg(long)]
    names: u64,
    /// The primitives to use.
    #[arg(long, value_delimiter = ',')]
    primitives: Vec<Primitive>,
    /// The watchdog lease.
    #[arg(long, value_parser = parse_duration)]
    lease: Duration,
    /// The longest critical section.
    #[arg(long, value_parser = parse_duration)]
    hold: Duration,
    /// Take holds with the library's default options (the lease above is then its default).
    #[arg(long)]
    defaults: bool,
    /// Break the lock on purpose (to test the checker).
    #[arg(long)]
    sabotage: Option<Sabotage>,
}

/// The lease of the [`Sabotage::Leak`] holds: longer than any run.
const LEAKED_LEASE: Duration = Duration::from_secs(3600);

/// Semaphores of the run count this many permits.
pub(crate) const PERMITS: u32 = 2;

fn emit(event: &WorkerEvent) {
    if let Ok(line) = serde_json::to_string(event) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

/// Reports an error of this worker, stamped now.
fn emit_error(what: String) {
    emit(&WorkerEvent::Error { t: now_ns(), what });
}

/// Asks the kernel to SIGKILL this worker when the coordinator dies, so that a coordinator
/// killed outright (SIGKILL, a stopped stress run) leaves no worker behind. A running worker
/// would stop anyway when its stdin closes; this is for the one the coordinator had SIGSTOPped,
/// which reads nothing until it is continued (SIGKILL ends a stopped process too). Had the
/// coordinator died before this call, the worker's stdin is already closed and it stops at its
/// first read. The coordinator spawns workers from its runtime's threads, which live as long as
/// it does (the signal follows the thread that spawned the worker).
fn die_with_the_coordinator() {
    if let Err(e) = crate::host::die_with_parent() {
        emit_error(e);
    }
}

/// What one acquisition got.
struct Held {
    guards: Vec<(u64, String, HoldKind, LockGuard)>,
}

pub(crate) async fn worker(opts: TortureWorkerOpts) -> u8 {
    die_with_the_coordinator();
    emit(&WorkerEvent::Start {
        t: now_ns(),
        pid: std::process::id(),
    });
    let locks = match dlock::connect(&opts.url).await {
        Ok(l) => l,
        Err(e) => {
            emit_error(format!("connect: {e}"));
            return exit::UNAVAILABLE;
        }
    };
    let mut resource = match Client::connect(&opts.resource).await {
        Ok(c) => c,
        Err(e) => {
            emit_error(format!("resource: {e}"));
            return exit::SOFTWARE;
        }
    };
    // The coordinator stops a worker by closing its stdin.
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        let mut sink = [0u8; 64];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
        let _ = stop_tx.send(true);
    });
    let mut rng = Rng::new(opts.seed ^ u64::from(opts.id).wrapping_mul(0x9E37_79B9));
    let provider = std::sync::Arc::clone(locks.provider());
    let mut holds = 0u64;
    let mut attempts = 0u64;
    while !*stop.borrow() {
        let held = match acquire(&provider, &opts, &mut rng, &mut attempts).await {
            Ok(Some(h)) => h,
            Ok(None) => continue,
            Err(e) => {
                emit_error(e.to_string());
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // The critical section begins at `t` only if every hold is still held after it was
        // taken (as its end is the last check that found them held): a hold can end between
        // the grant and here (the process starved past its lease while its renewals waited).
        // A careful holder does not use such a hold, and the checker must not count it as a
        // critical section, so it is reported apart and given back.
        let t = now_ns();
        if opts.sabotage != Some(Sabotage::NoLoss)
            && held.guards.iter().any(|(_, _, _, g)| !g.is_held())
        {
            for (_, name, _, guard) in held.guards.into_iter().rev() {
                // Members of a set still held are given back with it, unreported.
                if !guard.is_held() {
                    emit(&WorkerEvent::LostBeforeUse {
                        t,
                        name,
                        token: guard.fencing_token().get(),
                        reason: loss_reason(&guard),
                    });
                }
                let _ = guard.release().await;
            }
            continue;
        }
        let mut guards = Vec::new();
        for (name, kind, guard) in held.guards.into_iter().map(|(_, n, k, g)| (n, k, g)) {
            holds += 1;
            let mut token = guard.fencing_token().get();
            if opts.sabotage == Some(Sabotage::RepeatTokens) {
                token = 1 + token % 2;
            }
            emit(&WorkerEvent::Grant {
                t,
                hold: holds,
                name: name.clone(),
                kind,
                token,
            });
            guards.push((holds, name, kind, guard, token));
        }
        let end = critical_section(&opts, &mut rng, &mut resource, &guards).await;
        for (hold, ..) in &guards {
            emit(&WorkerEvent::Exit {
                t: end,
                hold: *hold,
            });
        }
        for (hold, _, _, guard, _) in guards.into_iter().rev() {
            let ok = guard.release().await.is_ok();
            emit(&WorkerEvent::Release {
                t: now_ns(),
                hold,
                ok,
            });
        }
        let pause = rng.below(20);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    emit(&WorkerEvent::Stop { t: now_ns() });
    0
}

/// One acquisition of a primitive drawn from `rng`, waiting up to twice the lease. One of a
/// single name is recorded as it begins (an `Enqueue` with a new id from `attempts`) and, if
/// it returns without a hold, as it gives up (a `Timeout`): the checker tells from them who
/// waited before whom on a fair lock, and which free name a store refused.
async fn acquire(
    provider: &DynLockProvider,
    opts: &TortureWorkerOpts,
    rng: &mut Rng,
    attempts: &mut u64,
) -> dlock::Result<Option<Held>> {
    let Some(&primitive) = opts
        .primitives
        .get(rng.below(opts.primitives.len() as u64) as usize)
    else {
        return Ok(None);
    };
    let i = rng.below(opts.names.max(1));
    let p = &opts.prefix;
    let options = match opts.sabotage {
        Some(Sabotage::ShortLease) => {
            LockOptions::new().with_lease(Lease::watchdog(opts.lease / 4))
        }
        Some(Sabotage::Leak) => LockOptions::new().with_lease(Lease::Fixed(LEAKED_LEASE)),
        _ if opts.defaults => LockOptions::new(),
        _ => LockOptions::new().with_lease(Lease::watchdog(opts.lease)),
    };
    let wait = opts.lease * 2;
    let (name, kind) = match primitive {
        Primitive::Mutex => (format!("{p}/m{i}"), HoldKind::Mutex),
        Primitive::Fair => (format!("{p}/f{i}"), HoldKind::Fair),
        Primitive::Rw if rng.below(10) < 7 => (format!("{p}/rw{i}"), HoldKind::Read),
        Primitive::Rw => (format!("{p}/rw{i}"), HoldKind::Write),
        Primitive::Semaphore => (format!("{p}/s{i}"), HoldKind::Permit),
        Primitive::Multi => {
            let j = (i + 1 + rng.below(opts.names.max(2) - 1)) % opts.names.max(2);
            let names = [format!("{p}/m{i}"), format!("{p}/m{j}")];
            let members: Vec<Member> = names
                .iter()
                .map(|n| provider.lock(n, options).map(Member::from))
                .collect::<dlock::Result<_>>()?;
            let attempt = asked(attempts, &names, HoldKind::Mutex, wait, true);
            let Some(multi) = MultiLock::new(members)?.try_acquire(wait).await? else {
                gave_up(attempt, &names);
                return Ok(None);
            };
            return Ok(Some(Held {
                guards: multi
                    .into_guards()
                    .into_iter()
                    .map(|g| (0, g.name().to_string(), HoldKind::Mutex, g))
                    .collect(),
            }));
        }
    };
    let attempt = asked(attempts, std::slice::from_ref(&name), kind, wait, false);
    let guard = match kind {
        HoldKind::Mutex => provider.lock(&name, options)?.try_acquire(wait).await?,
        // Sabotaged, the hold is a plain mutex's: its waiters race for each release.
        HoldKind::Fair => {
            let fair = opts.sabotage != Some(Sabotage::Unfair);
            provider
                .lock(&name, options.with_fair(fair))?
                .try_acquire(wait)
                .await?
        }
        HoldKind::Read => {
            provider
                .read_write_lock(&name, options)?
                .try_read(wait)
                .await?
        }
        HoldKind::Write => {
            provider
                .read_write_lock(&name, options)?
                .try_write(wait)
                .await?
        }
        HoldKind::Permit => {
            provider
                .semaphore(&name, PERMITS, options)?
                .try_acquire(wait)
                .await?
        }
    };
    if guard.is_none() {
        gave_up(attempt, std::slice::from_ref(&name));
    }
    Ok(guard.map(|g| Held {
        guards: vec![(0, name, kind, g)],
    }))
}

/// Records that an acquisition of `names` (a `MultiLock`'s if `set`) begins, waiting up to
/// `wait`, under a new attempt id from `attempts`; returns the id.
fn asked(attempts: &mut u64, names: &[String], kind: HoldKind, wait: Duration, set: bool) -> u64 {
    *attempts += 1;
    let t = now_ns();
    for name in names {
        emit(&WorkerEvent::Enqueue {
            t,
            attempt: *attempts,
            name: name.clone(),
            kind,
            wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            set,
        });
    }
    *attempts
}

/// Records that the acquisition `attempt` of `names` returned without a hold.
fn gave_up(attempt: u64, names: &[String]) {
    let t = now_ns();
    for name in names {
        emit(&WorkerEvent::Timeout {
            t,
            attempt,
            name: name.clone(),
        });
    }
}

/// Works while holding: half the hold, the writes to the resource, the other half; ends early
/// (and says so) as soon as a hold is reported lost, unless the lock is sabotaged not to.
///
/// Returns when the critical section ended: the moment of the last check that found every hold
/// still held, not the moment this returns. A pause between that check and the `Exit` event
/// (a `SIGSTOP` lands anywhere) would otherwise stretch the hold past work it never did.
async fn critical_section(
    opts: &TortureWorkerOpts,
    rng: &mut Rng,
    resource: &mut Client,
    guards: &[(u64, String, HoldKind, LockGuard, u64)],
) -> u64 {
    let hold = opts.hold.as_millis().max(4) as u64;
    let half = Duration::from_millis((hold / 4 + rng.below(hold * 3 / 4)) / 2);
    let watch_loss = opts.sabotage != Some(Sabotage::NoLoss);
    // How long after its guard a loss is reported: at once, unless sabotaged.
    let late = if opts.sabotage == Some(Sabotage::LateLoss) {
        opts.lease / 2
    } else {
        Duration::ZERO
    };
    let mut vouched = vec![None; guards.len()];
    if watch_loss && let Watched::Lost = lost_during(guards, &mut vouched, half, late).await {
        return now_ns();
    }
    if !watch_loss {
        tokio::time::sleep(half).await;
    }
    for (hold, name, kind, _, token) in guards {
        if !kind.exclusive() {
            continue;
        }
        let accepted = resource
            .fenced_increment(name, *token)
            .await
            .unwrap_or(false);
        emit(&WorkerEvent::Fenced {
            t: now_ns(),
            hold: *hold,
            name: name.clone(),
            token: *token,
            accepted,
        });
        let _ = resource.unfenced_increment(name).await;
    }
    if !watch_loss {
        tokio::time::sleep(half).await;
        return now_ns();
    }
    match lost_during(guards, &mut vouched, half, late).await {
        Watched::Held { checked_at } => checked_at,
        Watched::Lost => now_ns(),
    }
}

/// What [`lost_during`] saw.
enum Watched {
    /// Every hold was still held at `checked_at` (taken before the check that said so).
    Held { checked_at: u64 },
    /// A hold was lost, and reported.
    Lost,
}

/// How often a holder looks at the moment its guards vouch for their holds until
/// ([`WorkerEvent::Vouched`]): a renewal moves it by a third of the lease.
const VOUCH_LOOK: Duration = Duration::from_millis(10);

/// Waits `d`, or until a hold is lost (reporting every hold lost by then, `late` after its
/// guard said so: zero but for [`Sabotage::LateLoss`]); meanwhile reports each move of the
/// moment a guard vouches for its hold until (`vouched`: the last reported, by guard).
async fn lost_during(
    guards: &[(u64, String, HoldKind, LockGuard, u64)],
    vouched: &mut [Option<u64>],
    d: Duration,
    late: Duration,
) -> Watched {
    let mut losses = select_all(guards.iter().map(|g| Box::pin(g.3.lost())));
    let end = from_now(d);
    let lost = loop {
        report_vouched(guards, vouched);
        let look = from_now(VOUCH_LOOK).min(end);
        // A loss wins over the timer when both are due (after a pause, say).
        tokio::select! {
            biased;
            _ = &mut losses => break true,
            () = tokio::time::sleep_until(look) => {}
        }
        if Instant::now() >= end {
            break false;
        }
    };
    // Looks again, as a careful holder does before it trusts what it did: the lease may have
    // ended while the process was stopped, before any timer could fire. The time is taken
    // first, so "held at `checked_at`" is what the check proves.
    let checked_at = now_ns();
    if lost || guards.iter().any(|g| !g.3.is_held()) {
        tokio::time::sleep(late).await;
        report_losses(guards);
        return Watched::Lost;
    }
    Watched::Held { checked_at }
}

/// Reports the moment each guard vouches for its hold until, where it moved since the last
/// report (`vouched`, by guard). The moment is put on the worker's clock from a reading of
/// that clock taken first, so it is never later than the guard's.
fn report_vouched(guards: &[(u64, String, HoldKind, LockGuard, u64)], vouched: &mut [Option<u64>]) {
    let t = now_ns();
    let now = Instant::now();
    for ((hold, _, _, guard, _), last) in guards.iter().zip(vouched.iter_mut()) {
        let Some(until) = guard.held_until() else {
            continue;
        };
        let ahead = until.saturating_duration_since(now).as_nanos();
        let until = t.saturating_add(u64::try_from(ahead).unwrap_or(u64::MAX));
        // Two readings of an unmoved moment differ by the time between the two clock reads;
        // a renewal moves it by a third of the lease.
        if last.is_none_or(|l| until > l.saturating_add(1_000_000)) {
            *last = Some(until);
            emit(&WorkerEvent::Vouched {
                t,
                hold: *hold,
                until,
            });
        }
    }
}

fn report_losses(guards: &[(u64, String, HoldKind, LockGuard, u64)]) {
    let t = now_ns();
    for (hold, name, _, guard, _) in guards {
        if !guard.is_held() {
            emit(&WorkerEvent::Lost {
                t,
                hold: *hold,
                name: name.clone(),
                reason: loss_reason(guard),
            });
        }
    }
}

/// Why a guard says its hold is lost, in words (`suspended`: no final reason yet).
fn loss_reason(guard: &LockGuard) -> String {
    guard
        .loss_reason()
        .map_or_else(|| "suspended".to_string(), |r| r.to_string())
}
