//! Inspection: what the store records about a name, read without taking anything.

use dlock_core::{Error, LockKind};

use super::{clients, lock, release, residue_is, take};
use crate::Factory;
use crate::support::Names;

/// `describe` reports a free name as free and leaves nothing behind; a held one as held (a
/// mutex hold, its holder, the holder's token where the store records it) without disturbing
/// the holder; and a bad name as `InvalidName`.
pub async fn describe_reports_the_holder(f: &impl Factory) {
    let [a, b] = clients(f).await;
    let name = Names::new().name("described");
    let free = a
        .describe(&name)
        .await
        .unwrap_or_else(|e| panic!("describe of a free name: {e}"));
    assert!(!free.is_held(), "a free name described as held: {free:?}");
    residue_is(f, &name, 0, "describe of a free name leaves nothing").await;
    let g = take(f, &lock(&b, &name)).await;
    let held = a
        .describe(&name)
        .await
        .unwrap_or_else(|e| panic!("describe of a held name: {e}"));
    assert!(held.is_held(), "a held name described as free: {held:?}");
    assert_eq!(held.kind, Some(LockKind::Mutex), "{held:?}");
    if let Some(token) = held.last_token {
        assert_eq!(
            token,
            g.fencing_token().get(),
            "the holder's token: {held:?}"
        );
    }
    assert!(g.is_held(), "describe disturbed the holder");
    residue_is(f, &name, 1, "describe of a held name adds nothing").await;
    release(g).await;
    let after = a.describe(&name).await.unwrap();
    assert!(
        !after.is_held(),
        "described as held after the release: {after:?}"
    );
    let e = a.describe("").await.expect_err("describe of an empty name");
    assert!(matches!(e, Error::InvalidName { .. }), "got {e:?}");
}
