//! The conformance suite against a real Redis node started for each case.

use lockline::conformance::Fixture;
use lockline::{Client, Session};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;

mod support;

struct RedisFixture {
    server: RedisServer,
}

#[lockline::async_trait]
impl Fixture for RedisFixture {
    async fn client(&self) -> Client {
        Client::new(Redis::new(self.server.url()))
    }

    /// Ends the session as its TTL running out would: its key and its
    /// entries vanish, and nothing is published.
    async fn expire(&self, session: &Session) {
        support::expire(&[self.server.url()], session.id()).await;
    }
}

lockline::conformance_tests!(RedisFixture {
    server: RedisServer::start().expect("start redis"),
});

// Lock-delay needs the backend to tell a release from a loss.
lockline::conformance_tests!(@cases RedisFixture {
    server: RedisServer::start().expect("start redis"),
}; lock_delay_holds_back_after_an_involuntary_loss_only, lock_modes_lock_delay_after_an_involuntary_loss_only);
