//! etcd's floor: the two transactions of an uncontended dlock cycle, on one client with one
//! lease granted up front (as a provider's): put the key if absent, with the lease, reading
//! it and the range's first key by create revision; then delete it if it is still that key.

use dlock_etcd::etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use super::{Job, Timed, err, tasks_together, timed_since};

/// The floor's cycles on the etcd of the job's URL, on a key under `<prefix><ns>/floor/`.
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let (mut client, lease, prefix) = connect(job.url).await?;
    let range = format!("{prefix}{}%2Ffloor/", job.ns);
    let started = job.start.go().await;
    let mut measured = Ok(());
    for _ in 0..job.cycles {
        measured = cycle(&mut client, lease, &range).await;
        if measured.is_err() {
            break;
        }
    }
    let timed = timed_since(started);
    let _ = client.lease_revoke(lease).await;
    measured.map(|()| timed)
}

/// The W7 floor: `tasks` tasks on one client with one lease (as a provider's), each making
/// `cycles` cycles on a range of its own, `<prefix><ns>/floor<task>/`, started together;
/// their cycles per second, from the first start to the last end.
pub(super) async fn shared(
    url: &str,
    tasks: u64,
    cycles: u64,
    ns: &str,
) -> dlock::Result<Option<f64>> {
    let (mut client, lease, prefix) = connect(url).await?;
    let shared = client.clone();
    let ns = ns.to_owned();
    let measured = tasks_together(tasks, cycles, move |task, _| {
        let mut client = shared.clone();
        let range = format!("{prefix}{ns}%2Ffloor{task}/");
        async move { cycle(&mut client, lease, &range).await }
    })
    .await;
    let _ = client.lease_revoke(lease).await;
    measured
}

/// A client of the etcd of `url`, a lease granted for the floor, and the URL's key prefix.
async fn connect(url: &str) -> dlock::Result<(Client, i64, String)> {
    let config = dlock_etcd::EtcdConfig::from_url(url)?;
    let mut client = Client::connect(&config.endpoints, None)
        .await
        .map_err(|e| err("etcd", "connect", e))?;
    // Long enough for the whole run without keep-alives (which dlock sends from a task of
    // its own, off the cycle's path); revoked at the end.
    let ttl = i64::try_from(config.lease_ttl.as_secs())
        .unwrap_or(i64::MAX)
        .max(3600);
    let lease = client
        .lease_grant(ttl, None)
        .await
        .map_err(|e| err("etcd", "grant a lease", e))?
        .id();
    Ok((client, lease, config.prefix))
}

/// One floor cycle on the key of `lease` in `range`.
async fn cycle(client: &mut Client, lease: i64, range: &str) -> dlock::Result<()> {
    let key = format!("{range}{lease:x}");
    let first = || {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
    };
    let put = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
            TxnOp::get(key.as_str(), None),
            TxnOp::get(range, Some(first())),
        ])
        .or_else([
            TxnOp::get(key.as_str(), None),
            TxnOp::get(range, Some(first())),
        ]);
    let created = client.txn(put).await.map_err(|e| err("etcd", "put", e))?;
    let revision = created
        .op_responses()
        .into_iter()
        .find_map(|op| match op {
            TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.create_revision()),
            _ => None,
        })
        .unwrap_or(0);
    let delete = Txn::new()
        .when([Compare::create_revision(
            key.as_str(),
            CompareOp::Equal,
            revision,
        )])
        .and_then([TxnOp::delete(key.as_str(), None)]);
    client
        .txn(delete)
        .await
        .map_err(|e| err("etcd", "delete", e))?;
    Ok(())
}
