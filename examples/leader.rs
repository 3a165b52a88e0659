//! Electing a leader: three replicas campaign on one election; one leads at a time, the
//! others wait their turn, and an observer prints each leader as it changes. Each leader
//! works with its term (the fencing token of its leadership), stops the moment it is told
//! it is deposed, and resigns after a few rounds, handing over to the next.
//!
//! ```text
//! cargo run --example leader --features memory                 # in-process
//! cargo run --example leader --features etcd -- etcd://127.0.0.1:2379
//! cargo run --example leader --features zookeeper -- zk://127.0.0.1:2181
//! ```
//!
//! On etcd the election is `etcdctl elect`'s (`etcdctl elect -l scheduler` watches it too); on
//! ZooKeeper it is Curator's `LeaderLatch` at `/scheduler`.

use std::time::Duration;

use dlock::Leadership;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory://leader-example".into());
    let locks = dlock::connect(&url).await?;
    let election = locks.election("scheduler")?;

    // Who leads, as anyone can watch it: the leader now, then each change.
    let mut observer = election.observe();
    let watching = tokio::spawn(async move {
        let mut leaders = 0;
        while leaders < 3 {
            match observer.next().await {
                Ok(Some(leader)) => {
                    leaders += 1;
                    println!("observer: {leader}");
                }
                Ok(None) => println!("observer: nobody leads"),
                Err(e) => eprintln!("observer: {e}"),
            }
        }
    });

    // Three replicas, each with a client of its own (as three processes would have).
    let mut replicas = Vec::new();
    for replica in ["replica-a", "replica-b", "replica-c"] {
        let locks = dlock::connect(&url).await?;
        replicas.push(tokio::spawn(async move {
            let election = locks.election("scheduler")?;
            let leadership = election.campaign(replica.as_bytes()).await?;
            lead(replica, leadership).await?;
            locks.close().await;
            dlock::Result::Ok(())
        }));
    }
    for replica in replicas {
        replica.await.expect("a replica panicked")?;
    }
    watching.await.expect("the observer panicked");
    locks.close().await;
    Ok(())
}

/// A leader's work: a few rounds, each stamped with the term, unless deposed first.
async fn lead(replica: &str, leadership: Leadership) -> dlock::Result<()> {
    let term = leadership.term();
    println!("{replica}: leading in term {term}");
    let work = async {
        for round in 1..=3 {
            // A store that fences (a database row with the last term seen, say) refuses a
            // write whose term is older than one it has seen: a deposed leader's late write.
            println!("{replica}: round {round}, writing with term {term}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        () = leadership.lost() => {
            println!("{replica}: deposed in term {term}; stopped");
            Ok(())
        }
        () = work => {
            println!("{replica}: resigning");
            leadership.resign().await
        }
    }
}
