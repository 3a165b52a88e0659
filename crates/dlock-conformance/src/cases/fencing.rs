//! Fencing: tokens strictly increase per name.

use dlock_core::Error;

use super::{
    caps, client, fixed, lock, lock_with, release, short_watchdog, skip, take, unsupported,
};
use crate::Factory;
use crate::support::{Names, must};

/// Tokens strictly increase over 100 handoffs between two clients.
pub async fn fencing_increases_across_handoffs(f: &impl Factory) {
    let (a, b) = (client(f).await, client(f).await);
    if !caps(&a).fencing {
        return unsupported(f, "no fencing tokens");
    }
    let name = Names::new().name("fence");
    let (la, lb) = (lock(&a, &name), lock(&b, &name));
    let mut last = None;
    for i in 0..100 {
        let l = if i % 2 == 0 { &la } else { &lb };
        let g = must(f.slack(), "handoff", l.acquire()).await.unwrap();
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
    let a = client(f).await;
    if !caps(&a).fencing {
        return unsupported(f, "no fencing tokens");
    }
    let name = Names::new().name("fence-new");
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
    let (a, b, c) = (client(f).await, client(f).await, client(f).await);
    let cp = caps(&a);
    if !cp.fencing || !cp.fixed_lease || !cp.watchdog {
        return unsupported(f, "no fencing tokens with fixed and watchdog leases");
    }
    let name = Names::new().name("fence-expiry");
    let wait = f.holder_timeout() + f.slack() * 2;
    // 1. A fixed lease runs out; another client takes over.
    let g1 = take(f, &lock_with(&a, &name, fixed(f))).await;
    let t1 = g1.fencing_token();
    must(
        f.short_lease() + f.slack(),
        "the fixed lease ends",
        g1.lost(),
    )
    .await;
    let g2 = must(
        wait,
        "takeover after the fixed lease",
        lock(&b, &name).acquire(),
    )
    .await
    .unwrap();
    let t2 = g2.fencing_token();
    assert!(
        t2 > t1,
        "token {t2} after the fixed lease of token {t1} ended"
    );
    // 2. The store drops the hold behind its holder's back; another client takes over.
    let g3 = match f.force_expire(&name).await {
        None => {
            release(g2).await;
            return skip(f, "the factory cannot drop a hold behind its holder's back");
        }
        Some(r) => {
            r.unwrap_or_else(|e| panic!("force_expire: {e}"));
            let g3 = must(
                f.slack(),
                "takeover after a dropped hold",
                lock(&c, &name).acquire(),
            )
            .await
            .unwrap();
            assert!(
                g3.fencing_token() > t2,
                "token {} after the dropped hold of token {t2}",
                g3.fencing_token()
            );
            let e = g2.release().await.expect_err("the dropped hold's release");
            assert!(matches!(e, Error::LockLost { .. }), "got {e:?}");
            g3
        }
    };
    let t3 = g3.fencing_token();
    release(g3).await;
    // 3. A holder dies (its hold is leaked) and its lease expires; another client takes over.
    let g4 = take(f, &lock_with(&a, &name, short_watchdog(f))).await;
    let t4 = g4.fencing_token();
    assert!(t4 > t3, "token {t4} after {t3}");
    let _ = g4.leak();
    let g5 = must(
        wait,
        "takeover after a dead holder",
        lock(&b, &name).acquire(),
    )
    .await
    .unwrap();
    assert!(
        g5.fencing_token() > t4,
        "token {} after the dead holder's token {t4}",
        g5.fencing_token()
    );
    release(g5).await;
}
