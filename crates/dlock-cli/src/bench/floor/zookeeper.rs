//! ZooKeeper's floor: create (ephemeral sequential) and getChildren sent together, as dlock
//! sends them, then delete.

use zookeeper_client as zk;

use super::{Job, Timed, err, timed_since};

/// The floor's cycles on the first server of the ZooKeeper of the job's URL, under
/// `/dlock-bench-floor`.
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let url = job.url;
    let hosts = url
        .trim_start_matches("zk://")
        .split(['/', '?'])
        .next()
        .unwrap_or("127.0.0.1:2181")
        .to_owned();
    let client = zk::Client::connect(&hosts)
        .await
        .map_err(|e| err("zookeeper", "connect", e))?;
    let dir = "/dlock-bench-floor";
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match client.create(dir, b"", &persistent).await {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => return Err(err("zookeeper", "create the directory", e)),
    }
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let started = job.start.go().await;
    let base = format!("{dir}/lock-");
    for _ in 0..job.cycles {
        // Sent together, as dlock sends them: the client sends a request when the call is
        // made, and the server answers a session's requests in order.
        let created = client.create(&base, b"", &ephemeral);
        let listed = client.list_children(dir);
        let (_, seq) = created.await.map_err(|e| err("zookeeper", "create", e))?;
        listed
            .await
            .map_err(|e| err("zookeeper", "getChildren", e))?;
        client
            .delete(&format!("{dir}/lock-{seq}"), None)
            .await
            .map_err(|e| err("zookeeper", "delete", e))?;
    }
    Ok(timed_since(started))
}
