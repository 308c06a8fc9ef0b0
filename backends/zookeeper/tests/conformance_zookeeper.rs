//! The conformance suite against a real standalone ZooKeeper started for each case.

use std::time::Duration;

use lockline::conformance::Fixture;
use lockline::{Client, Session};
use std::sync::Mutex;

use lockline_testkit::{TcpProxy, ZkEnsemble};
use lockline_zookeeper::zookeeper_client;
use lockline_zookeeper::ZooKeeper;

/// One standalone server; every client reaches it through its own TCP proxy,
/// so that `expire` can keep victims from reconnecting while it ends their
/// session.
struct ZkFixture {
    ensemble: ZkEnsemble,
    proxies: Mutex<Vec<TcpProxy>>,
}

impl ZkFixture {
    fn start() -> Self {
        ZkFixture {
            ensemble: ZkEnsemble::start().expect("start ZooKeeper"),
            proxies: Mutex::default(),
        }
    }

    fn set_blocked(&self, blocked: bool) {
        for proxy in self.proxies.lock().expect("proxies").iter() {
            if blocked {
                proxy.block();
            } else {
                proxy.unblock();
            }
        }
    }
}

#[lockline::async_trait]
impl Fixture for ZkFixture {
    async fn client(&self) -> Client {
        let proxy = TcpProxy::start(&self.ensemble.address(0)).expect("start a proxy");
        let client = Client::new(ZooKeeper::new(proxy.address()));
        self.proxies.lock().expect("proxies").push(proxy);
        client
    }

    /// Polls the server's `wchp` until it lists the session's watch on the
    /// node.
    async fn watch_set(&self, session: &Session, key: &str) {
        let id = session.id().to_owned();
        lockline::conformance::until("the waiter's watch is on the server", || {
            self.ensemble.watches(0, key, &id)
        })
        .await;
    }

    /// Cuts every client off (sessions survive a short disconnection), attaches
    /// to the victim's session directly with its id and password and closes it,
    /// then lets the clients back: the victim finds its session expired.
    async fn expire(&self, session: &Session) {
        let info = lockline_zookeeper::session_info(session).expect("a live ZooKeeper session");
        self.set_blocked(true);
        let mut closed = false;
        for _ in 0..20 {
            let attached = zookeeper_client::Client::connector()
                .with_session(info.clone())
                .with_connection_timeout(Duration::from_secs(2))
                .connect(&self.ensemble.connect_string())
                .await;
            match attached {
                // Dropping the only client closes the session; attaching again
                // tells when the server has done it.
                Ok(client) => drop(client),
                Err(zookeeper_client::Error::SessionExpired) => {
                    closed = true;
                    break;
                }
                Err(_) => {}
            }
        }
        self.set_blocked(false);
        assert!(closed, "could not close session {}", session.id());
    }
}

lockline::conformance_tests!(ZkFixture::start());

// Lock-delay: a release marks its node (its data changed and deleted in one
// transaction), a loss does not.
lockline::conformance_tests!(@cases ZkFixture::start();
    lock_delay_holds_back_after_an_involuntary_loss_only,
    lock_modes_lock_delay_after_an_involuntary_loss_only);
