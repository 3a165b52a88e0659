//! Fencing: tokens strictly increase per name.

use dlock_core::Capabilities;

use super::{
    FENCING_TOKENS, Need, acquired, assert_lock_lost, client, dropped_behind_the_back, expiry_wait,
    fixed, lease_wait, lock, lock_with, named_clients_if, release, short_watchdog, take,
};
use crate::Factory;
use crate::support::must;

/// Tokens strictly increase over 100 handoffs between two clients.
pub async fn fencing_increases_across_handoffs(f: &impl Factory) {
    let Some(([a, b], name)) = named_clients_if(f, FENCING_TOKENS, "fence").await else {
        return;
    };
    let (la, lb) = (lock(&a, &name), lock(&b, &name));
    let mut last = None;
    for i in 0..100 {
        let l = if i % 2 == 0 { &la } else { &lb };
        let g = acquired(f.slack(), "handoff", l.acquire()).await;
        let t = g.fencing_token();
        if let Some(prev) = last {
            assert!(t > prev, "token {t} after {prev} at handoff {i}");
        }
        last = Some(t);
        release(g).await;
    }
}

/// Tokens keep increasing for a client that connects after the lock was released.
pub async fn fencing_increases_across_clients(f: &impl Factory) {
    let Some(([a], name)) = named_clients_if(f, FENCING_TOKENS, "fence-new").await else {
        return;
    };
    let g = take(f, &lock(&a, &name)).await;
    let t1 = g.fencing_token();
    release(g).await;
    drop(a);
    let b = client(f).await;
    let g = take(f, &lock(&b, &name)).await;
    assert!(g.fencing_token() > t1, "{} after {t1}", g.fencing_token());
    release(g).await;
}

/// The case fencing exists for: the next holder's token is greater than the old one's after a
/// fixed lease ran out, after the store dropped a hold behind its holder's back, and after a
/// dead holder's lease expired.
pub async fn fencing_increases_across_expiry_and_takeover(f: &impl Factory) {
    let offered = |c: &Capabilities| c.fencing && c.fixed_lease && c.watchdog;
    let why = "no fencing tokens with fixed and watchdog leases";
    let Some(([a, b, c], name)) = named_clients_if(f, Need(offered, why), "fence-expiry").await
    else {
        return;
    };
    let wait = expiry_wait(f);
    // 1. A fixed lease runs out; another client takes over.
    let g1 = take(f, &lock_with(&a, &name, fixed(f))).await;
    let t1 = g1.fencing_token();
    must(lease_wait(f), "the fixed lease ends", g1.lost()).await;
    let lb = lock(&b, &name);
    let g2 = acquired(wait, "takeover after the fixed lease", lb.acquire()).await;
    let t2 = g2.fencing_token();
    assert!(
        t2 > t1,
        "token {t2} after the fixed lease of token {t1} ended"
    );
    // 2. The store drops the hold behind its holder's back; another client takes over.
    if !dropped_behind_the_back(f, &name).await {
        release(g2).await;
        return;
    }
    let lc = lock(&c, &name);
    let g3 = acquired(f.slack(), "takeover after a dropped hold", lc.acquire()).await;
    let t3 = g3.fencing_token();
    assert!(t3 > t2, "token {t3} after the dropped hold of token {t2}");
    assert_lock_lost(g2.release().await, "the dropped hold's release");
    release(g3).await;
    // 3. A holder dies (its hold is leaked) and its lease expires; another client takes over.
    let g4 = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    let t4 = g4.fencing_token();
    assert!(t4 > t3, "token {t4} after {t3}");
    let _ = g4.leak();
    let lb = lock(&b, &name);
    let g5 = acquired(wait, "takeover after a dead holder", lb.acquire()).await;
    let t5 = g5.fencing_token();
    assert!(t5 > t4, "token {t5} after the dead holder's token {t4}");
    release(g5).await;
}
