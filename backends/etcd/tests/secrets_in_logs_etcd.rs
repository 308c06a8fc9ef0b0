//! Passwords and private keys never reach the logs: every event of every
//! crate, at TRACE, is captured while sessions authenticate (rightly and
//! wrongly) and connect over TLS (rightly and with a wrong CA), and the
//! secrets are looked for in it. One test per binary: the subscriber is
//! the process's global one.

use std::io::Write;
use std::sync::{Arc, Mutex};

use lockline::{Client, Tls};
use lockline_etcd::etcd_client;
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TestCa};

const PASSWORD: &str = "log-probe-pw-5c1e";
const WRONG_PASSWORD: &str = "log-probe-wrong-9a7d";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_password_or_private_key_is_ever_logged() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .init();

    // Users: a wrong password, then the right one, locking and releasing.
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    admin.user_add("root", PASSWORD, None).await.expect("root");
    admin.role_add("root").await.expect("root role");
    admin.user_grant_role("root", "root").await.expect("grant");
    admin.auth_enable().await.expect("enable auth");
    let wrong = Client::new(Etcd::new(cluster.endpoints()).with_user("root", WRONG_PASSWORD));
    assert!(wrong.session().await.is_err(), "a wrong password was accepted");
    let right = Client::new(Etcd::new(cluster.endpoints()).with_user("root", PASSWORD));
    let session = right.session().await.expect("session");
    let guard = session.mutex("logs/a").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
    session.close().await.expect("close");

    // TLS: a wrong CA, then the right one.
    let ca = TestCa::new("log probe CA").expect("CA");
    let tls_cluster = EtcdCluster::start_tls(&ca, true).expect("etcd with TLS");
    let issued = ca.client("log-probe").expect("client certificate");
    let key = issued.key_pem().expect("key");
    let other = TestCa::new("another CA").expect("CA");
    let tls = |ca_pem: String| {
        Tls::new()
            .with_ca_pem(ca_pem)
            .with_client_pem(issued.cert_pem().expect("cert"), key.clone())
    };
    let refused = Client::new(Etcd::new(tls_cluster.endpoints()).with_tls(tls(other.cert_pem().expect("CA"))));
    assert!(refused.session().await.is_err(), "a wrong CA was accepted");
    let accepted = Client::new(Etcd::new(tls_cluster.endpoints()).with_tls(tls(ca.cert_pem().expect("CA"))));
    let session = accepted.session().await.expect("session over TLS");
    session.close().await.expect("close");

    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    assert!(logs.lines().count() > 10, "nothing was captured: {logs}");
    for secret in [PASSWORD, WRONG_PASSWORD] {
        assert!(!logs.contains(secret), "the password {secret:?} was logged");
    }
    // The key's base64 body, line by line.
    for line in key.lines().filter(|l| !l.starts_with("-----") && l.len() > 16) {
        assert!(!logs.contains(line), "a line of the private key was logged");
    }
}
