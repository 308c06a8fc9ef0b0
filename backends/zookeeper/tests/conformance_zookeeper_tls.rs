//! The conformance suite over TLS: a standalone ZooKeeper whose
//! `secureClientPort` requires a client certificate (`ssl.clientAuth=need`);
//! every lockline client connects to it with the test CA and a client
//! certificate, through its own TCP proxy.

use std::sync::Mutex;
use std::time::Duration;

use lockline::conformance::Fixture;
use lockline::{Client, Session, Tls};
use lockline_testkit::{ClientAuth, TcpProxy, TestCa, ZkEnsemble, ZkOptions, ZkTlsOptions};
use lockline_zookeeper::zookeeper_client;
use lockline_zookeeper::ZooKeeper;

struct ZkTlsFixture {
    // Dropped after the ensemble: its files back the server's stores.
    ensemble: ZkEnsemble,
    tls: Tls,
    proxies: Mutex<Vec<TcpProxy>>,
    _ca: Mutex<TestCa>, // TestCa is not Sync
}

impl ZkTlsFixture {
    fn start() -> Self {
        let ca = TestCa::new("lockline-test-ca").expect("make a CA");
        let server = ca.server("zookeeper").expect("server certificate");
        let client = ca.client("lockline").expect("client certificate");
        let options = ZkOptions {
            tls: Some(ZkTlsOptions {
                server,
                client_ca: ca.cert().to_owned(),
                client_auth: ClientAuth::Need,
            }),
            ..ZkOptions::default()
        };
        let ensemble = ZkEnsemble::start_with(1, &options).expect("start ZooKeeper with TLS");
        let tls = Tls::new()
            .with_ca_pem(ca.cert_pem().expect("CA PEM"))
            .with_client_pem(client.cert_pem().expect("cert"), client.key_pem().expect("key"));
        ZkTlsFixture {
            ensemble,
            tls,
            proxies: Mutex::default(),
            _ca: Mutex::new(ca),
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
impl Fixture for ZkTlsFixture {
    async fn client(&self) -> Client {
        let secure = self.ensemble.secure_address(0).expect("a TLS port");
        let proxy = TcpProxy::start(&secure).expect("start a proxy");
        let client = Client::new(ZooKeeper::new(proxy.address()).with_tls(self.tls.clone()));
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

    /// As the plain-text suite's fixture: cut the clients off, attach to the
    /// victim's session (on the plain port, which the server keeps) and close
    /// it, let the clients back.
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

lockline::conformance_tests!(ZkTlsFixture::start());

// Lock-delay: a release marks its node (its data changed and deleted in one
// transaction), a loss does not.
lockline::conformance_tests!(@cases ZkTlsFixture::start(); lock_delay_holds_back_after_an_involuntary_loss_only);
