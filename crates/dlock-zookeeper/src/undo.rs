//! Undoing an acquisition: the nodes it created are deleted if it ends without a hold
//! (cancelled, timed out, failed), through the core's [`UndoOnDrop`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::backend::{UndoFn, UndoOnDrop, cleanup, finish_if_dropped};

use crate::session::Session;

/// What an acquisition created and must delete if it ends without a hold.
#[derive(Debug)]
pub(crate) enum Armed {
    /// A create with this protection prefix under `dir` was sent and its answer not seen.
    Creating { dir: String, prefix: String },
    /// This node exists.
    Created(String),
}

/// The undo of one acquisition: armed before each create, disarmed when the node became a
/// hold. Dropped while armed, it deletes the node in the background, retrying connection
/// losses until done or the session is gone.
pub(crate) type NodeUndo = UndoOnDrop<Armed, DeleteArmed>;

/// An undo with nothing armed yet, deleting through `session`.
pub(crate) fn node_undo(session: &Arc<Session>) -> NodeUndo {
    UndoOnDrop::new(DeleteArmed(Arc::clone(session)))
}

/// Deletes what is armed (see [`delete`]).
#[derive(Debug)]
pub(crate) struct DeleteArmed(Arc<Session>);

impl UndoFn<Armed> for DeleteArmed {
    type Future = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn undo(&self, armed: Armed) -> Self::Future {
        let session = Arc::clone(&self.0);
        Box::pin(async move {
            delete(&session, armed).await;
        })
    }
}

/// Deletes the node `armed` names; true if the server answered (the node is gone, or was not
/// there).
async fn delete(session: &Session, armed: Armed) -> bool {
    let result = match &armed {
        Armed::Creating { dir, prefix } => session.delete_by_prefix(dir, prefix).await,
        Armed::Created(path) => session.delete_guaranteed(path).await,
    };
    if let Err(e) = &result {
        tracing::warn!(?armed, error = %e, "could not delete the node of an abandoned acquisition; the session's end removes it");
    }
    result.is_ok()
}

/// Undoes in the background, without waiting.
pub(crate) fn in_background(session: &Arc<Session>, undo: &mut NodeUndo) {
    let Some(armed) = undo.disarm() else { return };
    let owned = Arc::clone(session);
    // Counted as a clean-up: a provider's close waits for the node to go.
    session.spawn(cleanup(async move {
        delete(&owned, armed).await;
    }));
}

/// Undoes now and waits at most `grace` for it (it finishes in the background otherwise):
/// true if the server answered the undo's calls within `grace` (or there was nothing to
/// undo).
pub(crate) async fn within(session: &Arc<Session>, undo: &mut NodeUndo, grace: Duration) -> bool {
    let Some(armed) = undo.disarm() else {
        return true;
    };
    let session = Arc::clone(session);
    let deleted = finish_if_dropped(async move { delete(&session, armed).await });
    matches!(tokio::time::timeout(grace, deleted).await, Ok(true))
}
