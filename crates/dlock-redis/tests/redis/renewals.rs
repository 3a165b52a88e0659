//! The watchdog's renewals: a provider's holds renew in one pipeline per beat rather than
//! each with its own request, and a hold that is gone is still found out, and lost, alone.

use dlock_core::HoldState;

use crate::support::*;

/// The server's count of read events on client connections (each a request, or a pipeline of
/// them, that arrived on its own) and of `EVALSHA` commands that ran a script (not those
/// answered `NOSCRIPT`, which a fresh server answers to the first pipeline of a script
/// before the provider loads it and sends the pipeline again), asked on `admin` (one read
/// event each time).
async fn reads_and_scripts(admin: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("everything")
        .query_async(admin)
        .await
        .unwrap();
    // The first of the `,`-separated fields after `line` that begins with `name` (`""`: the
    // first field), as a number.
    let field = |line: &str, name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(line))
            .and_then(|rest| {
                rest.split(',')
                    .find_map(|f| f.strip_prefix(name)?.trim().parse::<u64>().ok())
            })
            .unwrap_or_else(|| panic!("no {line} {name} in INFO"))
    };
    (
        field("total_reads_processed:", ""),
        field("cmdstat_evalsha:calls=", "") - field("cmdstat_evalsha:", "failed_calls="),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_holds_renew_together_and_each_is_lost_alone() {
    let Some(server) = PrivateRedis::start(false).await else {
        return;
    };
    let p = RedisProvider::connect(&server.url()).await.unwrap();
    let mut admin = admin(&server.url()).await;
    let names = Names::new();
    // 40 holds with the default 30 s watchdog, granted 25 ms apart over a second: alone,
    // each would renew a third of the lease after its own grant; batched, on a beat.
    const HOLDS: usize = 40;
    let mut guards = Vec::new();
    let mut asked_at = Vec::new();
    let mut spacing = tokio::time::interval(Duration::from_millis(25));
    for i in 0..HOLDS {
        spacing.tick().await;
        let lock = p
            .lock(&names.name(&format!("h{i}")), LockOptions::default())
            .unwrap();
        asked_at.push(Instant::now());
        guards.push(lock.acquire().await.unwrap());
    }
    // The first hold's key goes: its renewal must find that out, and only its own.
    let _: () = admin.del(names.name("h0")).await.unwrap();
    let (reads_before, scripts_before) = reads_and_scripts(&mut admin).await;
    let mut asked = 1;
    // Every hold has renewed once when the server has run one more script per hold, and one
    // for the lost hold's clean-up.
    eventually(Duration::from_secs(20), "every hold renewed once", || {
        asked += 1;
        let mut admin = admin.clone();
        async move {
            let (_, scripts) = reads_and_scripts(&mut admin).await;
            let renewed = scripts - scripts_before;
            if renewed > HOLDS as u64 {
                Ok(())
            } else {
                Err(renewed)
            }
        }
    })
    .await;
    let (reads_after, _) = reads_and_scripts(&mut admin).await;
    asked += 1;
    // What the provider sent: the reads less this test's own INFO requests (one each) and
    // the subscription connection's ping (one each 10 s). The holds' first renewals come
    // due on one or two beats, each batch a pipeline the server may read in more than one
    // event, and the lost hold's clean-up is one more: alone, the renewals were 40.
    let provider_reads = (reads_after - reads_before).saturating_sub(asked + 2);
    assert!(
        provider_reads <= 10,
        "{HOLDS} renewals came in {provider_reads} requests: not in batches"
    );
    must(
        Duration::from_secs(5),
        "the deleted hold is lost",
        guards[0].lost(),
    )
    .await;
    for (i, g) in guards.iter().enumerate().skip(1) {
        assert_eq!(
            g.state(),
            HoldState::Held,
            "hold {i} renewed in the same batch"
        );
        // Not renewed, the key has at most the lease less the time since its acquire was
        // asked (give or take the acquire's round trip); renewed, it has the time from the
        // grant to the renewal on top: over 5 s, since the first renewal goes on the last beat
        // of a sixth of the lease at or before a third of it. Both counted to now, so a slow
        // machine moves neither.
        let unrenewed = 30_000 - i64::try_from(asked_at[i].elapsed().as_millis()).unwrap();
        let ttl: i64 = admin.pttl(names.name(&format!("h{i}"))).await.unwrap();
        assert!(
            ttl > unrenewed + 2_000,
            "hold {i} was not renewed: {ttl} ms left, {unrenewed} ms without a renewal"
        );
    }
    for g in guards.into_iter().skip(1) {
        g.release().await.unwrap();
    }
}
