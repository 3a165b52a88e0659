//! The registry of the session's live holds: what a change of the session's state reaches.

use dlock_core::backend::{HoldSignal, Horizon, Registration};
use dlock_core::{LockName, LossReason};

use super::Session;

impl Session {
    /// Registers a live hold's signal, for suspension and loss, and returns its place in the
    /// registry and the horizon of its session. `node_session` is the session that owns the
    /// hold's node. The hold starts in the session's current state: suspended while
    /// disconnected, and lost at once (`None`) if its node belongs to a session that is no
    /// longer live.
    pub(crate) fn register(
        &self,
        name: &LockName,
        signal: &HoldSignal,
        node_session: i64,
    ) -> Option<(Registration<()>, Horizon)> {
        // Held while registering: an expiry that ends the live session closes the registry
        // after it, and so loses this hold too.
        let live = self.live.lock();
        let Some(horizon) = live
            .as_ref()
            .filter(|l| l.id == node_session)
            .map(|l| l.horizon.clone())
        else {
            drop(live);
            tracing::debug!(lock = %name, "a hold granted on a session that has expired");
            signal.mark_lost(LossReason::SessionExpired);
            return None;
        };
        let first = self.holds.is_empty();
        let registration = self.holds.register(signal, ());
        drop(live);
        if first {
            self.probe_wake.notify_waiters();
        }
        Some((registration, horizon))
    }

    /// Whether nodes of `node_session` may still be live: it is the current session and it
    /// has not expired. A hold of any other session is gone with it, so there is nothing to
    /// delete.
    pub(crate) fn is_live(&self, node_session: i64) -> bool {
        self.live.lock().as_ref().map(|l| l.id) == Some(node_session)
    }

    /// Live holds right now.
    pub(crate) fn live_holds(&self) -> usize {
        self.holds.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::HoldState;

    /// A hold registered while the session is disconnected starts suspended, and one whose
    /// node belongs to a session that expired meanwhile is lost at once. The state changes
    /// are driven as the session's state watcher drives them.
    #[tokio::test]
    async fn a_hold_registered_during_a_state_change_gets_that_state() {
        let Some(s) = Session::for_test().await else {
            return;
        };
        let name = LockName::new("l1").unwrap();
        let live = s.client().session_id().0;
        s.holds.suspend_all(true); // Disconnected
        let during = HoldSignal::new();
        let _registered = s.register(&name, &during, live);
        assert_eq!(during.state(), HoldState::Suspended);
        s.holds.suspend_all(false); // SyncConnected
        assert_eq!(during.state(), HoldState::Held);
        s.ended("test"); // Expired
        assert_eq!(during.reason(), Some(LossReason::SessionExpired));
        let late = HoldSignal::new();
        let _registered = s.register(&name, &late, live);
        assert_eq!(late.reason(), Some(LossReason::SessionExpired));
        assert!(!s.is_live(live));
        assert_eq!(s.live_holds(), 0);
    }
}
