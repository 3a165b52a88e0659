//! ZooKeeper's floor: create (ephemeral sequential) and getChildren sent together, as dlock
//! sends them, then delete.

use zookeeper_client as zk;

use super::{Job, Timed, err, tasks_together, timed_since};

/// The directory the floor's nodes live under (not under the run's prefix).
const DIR: &str = "/dlock-bench-floor";

/// The floor's cycles on the first server of the ZooKeeper of the job's URL, under
/// [`DIR`].
pub(super) async fn timed(job: &Job<'_>) -> dlock::Result<Option<Timed>> {
    let client = connect(job.url).await?;
    let started = job.start.go().await;
    for _ in 0..job.cycles {
        cycle(&client, DIR).await?;
    }
    Ok(timed_since(started))
}

/// The W7 floor: `tasks` tasks on one client (one session, as a provider's), each making
/// `cycles` cycles in a directory of its own under [`DIR`], started together; their cycles
/// per second, from the first start to the last end.
pub(super) async fn shared(url: &str, tasks: u64, cycles: u64) -> dlock::Result<Option<f64>> {
    let client = connect(url).await?;
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    for task in 0..tasks {
        match client
            .create(&format!("{DIR}/t{task}"), b"", &persistent)
            .await
        {
            Ok(_) | Err(zk::Error::NodeExists) => {}
            Err(e) => return Err(err("zookeeper", "create a task's directory", e)),
        }
    }
    tasks_together(tasks, cycles, move |task, _| {
        let client = client.clone();
        let dir = format!("{DIR}/t{task}");
        async move { cycle(&client, &dir).await }
    })
    .await
}

/// A client of the first server of the ZooKeeper of `url`, with [`DIR`] made.
async fn connect(url: &str) -> dlock::Result<zk::Client> {
    let hosts = url
        .trim_start_matches("zk://")
        .split(['/', '?'])
        .next()
        .unwrap_or("127.0.0.1:2181")
        .to_owned();
    let client = zk::Client::connect(&hosts)
        .await
        .map_err(|e| err("zookeeper", "connect", e))?;
    let persistent = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    match client.create(DIR, b"", &persistent).await {
        Ok(_) | Err(zk::Error::NodeExists) => {}
        Err(e) => return Err(err("zookeeper", "create the directory", e)),
    }
    Ok(client)
}

/// One floor cycle in `dir`.
async fn cycle(client: &zk::Client, dir: &str) -> dlock::Result<()> {
    let ephemeral = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let base = format!("{dir}/lock-");
    // Sent together, as dlock sends them: the client sends a request when the call is made,
    // and the server answers a session's requests in order.
    let created = client.create(&base, b"", &ephemeral);
    let listed = client.list_children(dir);
    let (_, seq) = created.await.map_err(|e| err("zookeeper", "create", e))?;
    listed
        .await
        .map_err(|e| err("zookeeper", "getChildren", e))?;
    client
        .delete(&format!("{base}{seq}"), None)
        .await
        .map_err(|e| err("zookeeper", "delete", e))
}
