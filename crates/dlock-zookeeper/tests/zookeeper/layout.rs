//! Curator's node layout: what a hold of each kind is on the server.

use dlock_conformance::Names;
use dlock_core::{LockOptions, LockProvider};

use crate::support::{CONTAINER_OWNER, admin, hold, is_protected, provider, recipe_children, url};

/// A hold is exactly one EPHEMERAL_SEQUENTIAL `_c_<uuid>-lock-<10 digits>` node owned by the
/// provider's session, under CONTAINER parents, and its token is the node's czxid.
#[tokio::test(flavor = "multi_thread")]
async fn mutex_layout_is_curators() {
    let Some(url) = url() else { return };
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let name = Names::new().name("orders/42");
    let path = p.lock_path(&name).unwrap();
    assert!(path.ends_with("/orders/42"), "{path}");
    let g = hold(&p, &name).await;
    let children = admin.list_children(&path).await.unwrap();
    assert_eq!(children.len(), 1, "{children:?}");
    let node = &children[0];
    assert!(is_protected(node, "lock-"), "{node}");
    let (_, stat) = admin.get_data(&format!("{path}/{node}")).await.unwrap();
    assert_eq!(stat.ephemeral_owner, p.session_id(), "owned by our session");
    assert_eq!(stat.data_length, 0);
    assert_eq!(g.fencing_token().get(), u64::try_from(stat.czxid).unwrap());
    // Every ancestor we created is a (container, i.e. non-ephemeral) node.
    let mut parent = path.as_str();
    while let Some(i) = parent.rfind('/').filter(|i| *i > 0) {
        let (_, stat) = admin.get_data(parent).await.unwrap();
        assert_eq!(
            stat.ephemeral_owner, CONTAINER_OWNER,
            "{parent} is not ephemeral"
        );
        parent = &parent[..i];
    }
    g.release().await.unwrap();
    assert!(admin.list_children(&path).await.unwrap().is_empty());
}

/// Read-write and semaphore layouts: `__READ__`/`__WRIT__` directly under the path, and
/// `locks` + `leases/_c_<uuid>-lease-<seq>` for semaphores; a non-reentrant mutex is a
/// `lock-` node like a reentrant one.
#[tokio::test(flavor = "multi_thread")]
async fn rw_and_semaphore_layouts_are_curators() {
    let Some(url) = url() else { return };
    let (p, admin) = (provider(&url).await, admin(&url).await);
    let names = Names::new();

    let rw_name = names.name("rw");
    let rw_path = p.lock_path(&rw_name).unwrap();
    let rw = p.read_write_lock(&rw_name, LockOptions::default()).unwrap();
    let w = rw.write().await.unwrap();
    let r = rw.read().await.unwrap(); // downgrade
    let mut nodes = admin.list_children(&rw_path).await.unwrap();
    nodes.sort_by_key(|n| n.contains("__READ__"));
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    assert!(is_protected(&nodes[0], "__WRIT__"), "{nodes:?}");
    assert!(is_protected(&nodes[1], "__READ__"), "{nodes:?}");
    // The downgraded reader sorts at its writer's place: same sequence, plain EPHEMERAL.
    assert_eq!(
        nodes[0][nodes[0].len() - 10..],
        nodes[1][nodes[1].len() - 10..]
    );
    let (_, stat) = admin
        .get_data(&format!("{rw_path}/{}", nodes[0]))
        .await
        .unwrap();
    assert_eq!(w.fencing_token().get(), u64::try_from(stat.czxid).unwrap());
    w.release().await.unwrap();
    r.release().await.unwrap();
    assert!(recipe_children(&admin, &rw_path).await.is_empty());

    let sem_name = names.name("sem");
    let sem_path = p.lock_path(&sem_name).unwrap();
    let sem = p.semaphore(&sem_name, 2, LockOptions::default()).unwrap();
    let g = sem.acquire().await.unwrap();
    let leases = admin
        .list_children(&format!("{sem_path}/leases"))
        .await
        .unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    assert!(is_protected(&leases[0], "lease-"), "{leases:?}");
    let (_, stat) = admin
        .get_data(&format!("{sem_path}/leases/{}", leases[0]))
        .await
        .unwrap();
    assert_eq!(g.fencing_token().get(), u64::try_from(stat.czxid).unwrap());
    // The internal mutex was released once the lease was taken.
    assert!(
        admin
            .list_children(&format!("{sem_path}/locks"))
            .await
            .unwrap()
            .is_empty()
    );
    for dir in [
        sem_path.clone(),
        format!("{sem_path}/locks"),
        format!("{sem_path}/leases"),
    ] {
        let (_, stat) = admin.get_data(&dir).await.unwrap();
        assert_eq!(
            stat.ephemeral_owner, CONTAINER_OWNER,
            "{dir} is not ephemeral"
        );
    }
    g.release().await.unwrap();

    let nr_name = names.name("nr");
    let nr_path = p.lock_path(&nr_name).unwrap();
    let nr = p
        .lock(&nr_name, LockOptions::new().with_reentrant(false))
        .unwrap();
    let g = nr.acquire().await.unwrap();
    let nodes = admin.list_children(&nr_path).await.unwrap();
    assert_eq!(nodes.len(), 1, "InterProcessMutex layout: {nodes:?}");
    assert!(is_protected(&nodes[0], "lock-"), "{nodes:?}");
    g.release().await.unwrap();
}
