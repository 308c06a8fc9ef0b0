//! The conformance suite against the in-process memory backend.

use lockline::conformance::Fixture;
use lockline::{Client, MemoryBackend, Session};

/// One store shared by every client, as one cluster is.
struct Memory {
    store: MemoryBackend,
}

#[lockline::async_trait]
impl Fixture for Memory {
    async fn client(&self) -> Client {
        Client::new(self.store.clone())
    }

    async fn expire(&self, session: &Session) {
        assert!(self.store.expire(session.id()), "no live session {}", session.id());
    }
}

lockline::conformance_tests!(Memory {
    store: MemoryBackend::new()
});

// Lock-delay needs the backend to tell a release from a loss.
lockline::conformance_tests!(@cases Memory {
    store: MemoryBackend::new()
}; lock_delay_holds_back_after_an_involuntary_loss_only, lock_modes_lock_delay_after_an_involuntary_loss_only);
