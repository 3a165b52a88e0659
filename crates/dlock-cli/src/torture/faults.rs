//! Injecting one planned fault: on a worker's proxies, on a worker process (SIGSTOP, SIGKILL),
//! or on the whole store (the `--restart-cmd`), and healing it.

use std::time::Duration;

use dlock::backend::from_now;
use dlock_proxy::Fault;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::TortureOpts;
use super::crew::{Crew, Slot};
use super::history::{self, FaultKind, FaultRecord, now_ns};
use super::plan::Planned;
use crate::exit;

/// Applies one planned fault, waits until it has healed, and says what happened.
pub(super) async fn inject(
    planned: &Planned,
    slots: &mut [Slot],
    crew: &mut Crew<'_>,
) -> Result<FaultRecord, u8> {
    let opts = crew.opts;
    let slot_count = slots.len();
    let mut index = planned.slot % slot_count;
    // Pauses, kills, blips and silent networks hit a holder when there is one (a waiter
    // otherwise). In a run with a worker on a drifting clock, that worker while it holds:
    // its hold is the one the drift tests, so another holder is hit only if it holds nothing
    // for the whole span (on a loaded machine it is often between two holds at the moment
    // the first holder is seen, and a run whose faults all hit the others tests no drift).
    if planned.kind.aims_at_a_holder() {
        let until = from_now(crew.span);
        let drift_run = slots.iter().any(|s| s.drifts);
        loop {
            let (drifting, any) = {
                let held = crew.holding.lock();
                let holds = |i: &usize| held.get(&slots[*i].worker).copied().unwrap_or(0) > 0;
                let mut order = (0..slot_count).map(|k| (index + k) % slot_count);
                let drifting = order.clone().find(|i| slots[*i].drifts && holds(i));
                (drifting, order.find(holds))
            };
            let out_of_time = tokio::time::Instant::now() >= until;
            if let Some(i) = drifting.or(any.filter(|_| !drift_run || out_of_time)) {
                index = i;
                break;
            }
            if out_of_time {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let slot = &mut slots[index];
    let worker = slot.worker;
    let start = now_ns();
    let record = |worker, end| FaultRecord {
        kind: planned.kind,
        worker,
        start,
        end,
    };
    // A fault of the slot's proxies, healed after the planned time.
    let lasting = async |slot: &Slot, fault: Fault| {
        slot.set_fault(fault);
        tokio::time::sleep(planned.lasts).await;
        slot.set_fault(Fault::None);
    };
    match planned.kind {
        FaultKind::Pause | FaultKind::BlipPause => {
            if let Some(pid) = slot.pid {
                let _ = kill(pid, Signal::SIGSTOP);
                tokio::time::sleep(planned.lasts).await;
                let _ = kill(pid, Signal::SIGCONT);
            }
        }
        FaultKind::Kill => {
            if let Some(mut child) = slot.child.take() {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
            let end = now_ns();
            crew.spawn(slot)?;
            return Ok(record(worker, end));
        }
        FaultKind::Partition | FaultKind::BlipPartition => {
            lasting(slot, Fault::Partition).await;
        }
        // The proxy's stalls are a silent network: its connections stay open and the bytes
        // wait in the sockets, both ways (`Partition`) or one way.
        FaultKind::Silent => {
            let silence = if planned.both_ways {
                Fault::Partition
            } else if planned.upstream {
                Fault::Upstream
            } else {
                Fault::Downstream
            };
            lasting(slot, silence).await;
        }
        FaultKind::OneWay => {
            let way = if planned.upstream {
                Fault::Upstream
            } else {
                Fault::Downstream
            };
            lasting(slot, way).await;
        }
        FaultKind::Latency => lasting(slot, Fault::Latency(planned.latency)).await,
        FaultKind::Delay => {
            let delay = crew.span.saturating_add(crew.span / 2);
            lasting(slot, Fault::DelayReplies(delay)).await;
        }
        FaultKind::Reset => {
            for p in &slot.proxies {
                p.reset();
            }
        }
        FaultKind::Restart => {
            restart(opts).await?;
            return Ok(record(history::EVERY_WORKER, now_ns()));
        }
    }
    Ok(record(worker, now_ns()))
}

/// A restart command as messages and reports show it: the passwords of URLs in it, and the
/// word after `-a` or `--pass` (redis-cli's password options), masked.
fn shown(cmd: &str) -> String {
    let mut out = Vec::new();
    let mut mask_next = false;
    for word in cmd.split(' ') {
        if mask_next && !word.is_empty() {
            out.push("***".to_owned());
            mask_next = false;
            continue;
        }
        mask_next = matches!(word, "-a" | "--pass" | "--password");
        out.push(dlock::redact(word));
    }
    out.join(" ")
}

/// How long a `--restart-cmd` may take.
const RESTART_PATIENCE: Duration = Duration::from_secs(60);

/// Runs `--restart-cmd` and waits for it (in its own process group, killed with it if it
/// overruns [`RESTART_PATIENCE`]).
async fn restart(opts: &TortureOpts) -> Result<(), u8> {
    let Some(cmd) = &opts.restart_cmd else {
        eprintln!("dlock: --faults restart needs --restart-cmd");
        return Err(exit::CONFIG);
    };
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .stdin(std::process::Stdio::null())
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            eprintln!("dlock: cannot run the restart command: {e}");
            exit::SOFTWARE
        })?;
    match tokio::time::timeout(RESTART_PATIENCE, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => {
            eprintln!(
                "dlock: the restart command failed ({status}): {}",
                shown(cmd)
            );
            Err(exit::SOFTWARE)
        }
        Ok(Err(e)) => {
            eprintln!("dlock: the restart command: {e}");
            Err(exit::SOFTWARE)
        }
        Err(_) => {
            if let Some(pid) = child.id().and_then(|id| i32::try_from(id).ok()) {
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait().await;
            eprintln!(
                "dlock: the restart command did not end within {}s: {}",
                RESTART_PATIENCE.as_secs(),
                shown(cmd)
            );
            Err(exit::SOFTWARE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_commands_are_shown_without_passwords() {
        assert_eq!(
            shown("redis-cli -a hunter2 -u redis://:pw@h:1 shutdown && start"),
            "redis-cli -a *** -u redis://:***@h:1 shutdown && start"
        );
    }
}
