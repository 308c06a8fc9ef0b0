//! The conformance suite against a real single-node etcd started for each case.

use lockline::conformance::Fixture;
use lockline::{Client, Session};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

struct EtcdFixture {
    cluster: EtcdCluster,
}

impl EtcdFixture {
    fn start() -> Self {
        EtcdFixture {
            cluster: EtcdCluster::start().expect("start etcd"),
        }
    }
}

#[lockline::async_trait]
impl Fixture for EtcdFixture {
    async fn client(&self) -> Client {
        Client::new(Etcd::new(self.cluster.endpoints()))
    }

    /// Revokes the session's lease from another client.
    async fn expire(&self, session: &Session) {
        let lease = i64::from_str_radix(session.id(), 16).expect("a lease id in hex");
        let mut side = lockline_etcd::etcd_client::Client::connect(self.cluster.endpoints(), None)
            .await
            .expect("connect a side client");
        side.lease_revoke(lease).await.expect("revoke the lease");
    }
}

lockline::conformance_tests!(EtcdFixture::start());

// Lock-delay needs the backend to tell a release from a loss.
lockline::conformance_tests!(@cases EtcdFixture::start(); lock_delay_holds_back_after_an_involuntary_loss_only, lock_modes_lock_delay_after_an_involuntary_loss_only);
