//! etcd's floor: the two transactions of an uncontended dlock cycle, on one client with one
//! lease granted up front (as a provider's): put the key if absent, with the lease, reading
//! it and the range's first key by create revision; then delete it if it is still that key.

use dlock_etcd::etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};

use super::{Job, Timed, err, timed_since};

/// The floor's cycles on the etcd of the job's URL, on a key under `<prefix><ns>/floor/`.
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let (url, ns, start) = (job.url, job.ns, job.start);
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
    let range = format!("{}{ns}%2Ffloor/", config.prefix);
    let key = format!("{range}{lease:x}");
    let first = || {
        GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1)
    };
    let started = start.go().await;
    let mut measured = Ok(());
    for _ in 0..job.cycles {
        let put = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.as_str(), "", Some(PutOptions::new().with_lease(lease))),
                TxnOp::get(key.as_str(), None),
                TxnOp::get(range.as_str(), Some(first())),
            ])
            .or_else([
                TxnOp::get(key.as_str(), None),
                TxnOp::get(range.as_str(), Some(first())),
            ]);
        let created = match client.txn(put).await {
            Ok(r) => r,
            Err(e) => {
                measured = Err(err("etcd", "put", e));
                break;
            }
        };
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
        if let Err(e) = client.txn(delete).await {
            measured = Err(err("etcd", "delete", e));
            break;
        }
    }
    let timed = timed_since(started);
    let _ = client.lease_revoke(lease).await;
    measured.map(|()| timed)
}
