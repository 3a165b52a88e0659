//! The attack on one store: its workers start behind their proxies, the planned faults hit
//! them one at a time, each followed by a lease of calm, and once the time is up every worker
//! is stopped and the checker reads what happened.

use std::path::Path;
use std::time::Duration;

use dlock::backend::{from_now, later};
use dlock_proxy::Proxy;

use super::crew::{Crew, Slot, stop};
use super::faults::inject;
use super::history::{FaultRecord, now_ns};
use super::plan::schedule;
use super::report::{StoreReport, write_history};
use super::resource::Resource;
use super::store::{applicable, durable, learns_addresses, private_store, span};
use super::{Primitive, Sabotage, TortureOpts, check};
use crate::exit;

/// Attacks the store at `url` for `--duration` along the plan drawn from `seed`, writes its
/// history to `history_out`, and reports what the checker found.
pub(super) async fn attack(
    opts: &TortureOpts,
    url: &str,
    seed: u64,
    exe: &Path,
    history_out: Option<&mut std::io::BufWriter<std::fs::File>>,
) -> Result<StoreReport, u8> {
    let shown = dlock::redact(url);
    if url.starts_with("memory:") {
        eprintln!(
            "dlock: {shown}: a memory store lives inside one process; torture needs a store \
             its worker processes share (sqlite://, redis://, zk://, mysql://, ...)"
        );
        return Err(exit::CONFIG);
    }
    let locks = dlock::connect(url)
        .await
        .map_err(|e| crate::fail(&format!("cannot use {shown}"), &e))?;
    let caps = locks.capabilities();
    let primitives: Vec<Primitive> = opts
        .primitives
        .iter()
        .copied()
        .filter(|p| match p {
            Primitive::Fair => caps.fair,
            Primitive::Rw => caps.read_write,
            Primitive::Semaphore => caps.semaphore,
            Primitive::Mutex | Primitive::Multi => true,
        })
        .collect();
    for p in &opts.primitives {
        if !primitives.contains(p) {
            eprintln!("dlock: {shown} has no {p:?}: left out");
        }
    }
    if primitives.is_empty() {
        eprintln!("dlock: {shown}: none of the requested primitives is supported");
        return Err(exit::CONFIG);
    }
    let (split, kinds) = applicable(opts, url);
    if split.is_none() && kinds.len() < opts.faults.len() {
        let why = if learns_addresses(url) {
            "its clients learn the servers' addresses from the servers, past any proxy"
        } else {
            "it has no network to attack"
        };
        eprintln!(
            "dlock: {shown}: {why}: only process faults (pause, blip-pause, kill) and restarts"
        );
    }
    let resource = Resource::start().await.map_err(|e| {
        eprintln!("dlock: cannot start the shared resource: {e}");
        exit::SOFTWARE
    })?;
    let prefix = format!("torture/{seed:x}/{:x}", now_ns() % 0xffff_ffff);
    let span = span(url, opts.lease);
    let mut crew = Crew::new(opts, span, seed, prefix, &primitives, exe, &resource);
    let mut slots = Vec::new();
    for i in 0..opts.processes {
        let (proxies, worker_url) = match &split {
            Some((head, servers, tail)) => {
                let mut proxies = Vec::new();
                for server in servers {
                    let p = Proxy::start(server.as_str()).await.map_err(|e| {
                        eprintln!("dlock: cannot put a proxy in front of {server}: {e}");
                        exit::UNAVAILABLE
                    })?;
                    proxies.push(p);
                }
                let list: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
                (proxies, format!("{head}{}{tail}", list.join(",")))
            }
            None if opts.sabotage == Some(Sabotage::NoExclusion) => {
                (Vec::new(), private_store(url, i))
            }
            None => (Vec::new(), url.to_owned()),
        };
        let mut slot = Slot::new(proxies, worker_url);
        slot.drifts = i == 0 && opts.clock_rate.is_some();
        crew.spawn(&mut slot)?;
        slots.push(slot);
    }
    let plan = schedule(seed, opts, span, &kinds, slots.len());
    let start = now_ns();
    let started = tokio::time::Instant::now();
    let mut faults: Vec<FaultRecord> = Vec::new();
    // The store gets at least a span of calm after each fault has healed, also when the
    // fault took longer than planned (a restart command): the liveness check measures
    // recovery after each fault, which a fault that follows at once would hide.
    let last_calm = later(started, opts.duration.saturating_sub(span * 2));
    let mut calm_until = started;
    for planned in &plan {
        let at = later(started, planned.at).max(calm_until);
        if at > last_calm {
            break;
        }
        tokio::time::sleep_until(at).await;
        match inject(planned, &mut slots, &mut crew).await {
            Ok(record) => {
                faults.push(record);
                calm_until = from_now(span);
            }
            Err(code) => {
                stop(&mut slots, opts.lease).await;
                return Err(code);
            }
        }
    }
    tokio::time::sleep_until(later(started, opts.duration)).await;
    let end = now_ns();
    stop(&mut slots, opts.lease).await;
    // Every worker has exited: its reader ends once it has read the worker's last line. A
    // drifting worker's reader adds all its events at its end: without them the history
    // would lack a worker, so a reader that does not end fails the run.
    for slot in &mut slots {
        for reader in slot.readers.drain(..) {
            if tokio::time::timeout(Duration::from_secs(5), reader)
                .await
                .is_err()
            {
                eprintln!("dlock: a worker's output was not closed 5 s after it exited");
                if slot.drifts {
                    return Err(exit::SOFTWARE);
                }
            }
        }
    }
    let errors = std::mem::take(&mut *crew.errors.lock());
    if !errors.is_empty() {
        for e in errors {
            eprintln!("dlock: {shown}: {e}");
        }
        return Err(exit::SOFTWARE);
    }
    let history = std::mem::take(&mut *crew.history.lock());
    let ledger = resource.ledger();
    let terms = check::Terms {
        lease: opts.lease,
        span,
        slack: Duration::from_secs(2),
        connection_bound: caps.connection_bound,
        durable: durable(url),
    };
    let report = check::check(&history, &faults, &ledger, (start, end), terms);
    if let Some(out) = history_out {
        write_history(out, &history, &faults, &ledger.accepted);
    }
    Ok(StoreReport::new(
        opts,
        shown,
        (seed, span),
        &primitives,
        plan.len(),
        report,
    ))
}
