//! Passwords and private keys never reach the logs: every event of every
//! crate, at TRACE, is captured while sessions log in with digest and SASL
//! credentials (rightly and wrongly) over TLS, and the secrets are looked
//! for in it. One test per binary: the subscriber is the process's global one.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockline::{Client, SessionOptions, Tls};
use lockline_testkit::{ClientAuth, TestCa, ZkEnsemble, ZkOptions, ZkTlsOptions};
use lockline_zookeeper::ZooKeeper;

const DIGEST_PASSWORD: &str = "zk-log-probe-digest-3b8e";
const SASL_PASSWORD: &str = "zk-log-probe-sasl-7f20";
const WRONG_PASSWORD: &str = "zk-log-probe-wrong-1d44";

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

    let ca = TestCa::new("log probe CA").expect("CA");
    let ensemble = ZkEnsemble::start_with(
        1,
        &ZkOptions {
            tls: Some(ZkTlsOptions {
                server: ca.server("zookeeper").expect("server certificate"),
                client_ca: ca.cert().to_owned(),
                client_auth: ClientAuth::Need,
            }),
            sasl_users: vec![("carol".into(), SASL_PASSWORD.into())],
            ..ZkOptions::default()
        },
    )
    .expect("ZooKeeper with TLS and SASL");
    let issued = ca.client("log-probe").expect("client certificate");
    let key = issued.key_pem().expect("key");
    let tls = Tls::new()
        .with_ca_pem(ca.cert_pem().expect("CA"))
        .with_client_pem(issued.cert_pem().expect("cert"), key.clone());
    let connect = ensemble.secure_connect_string().expect("a TLS port");
    let options = SessionOptions::new().with_connect_timeout(Duration::from_secs(3));

    let digest = Client::new(
        ZooKeeper::new(connect.as_str())
            .with_tls(tls.clone())
            .with_digest("dave", DIGEST_PASSWORD),
    );
    let session = digest.session_with(options.clone()).await.expect("digest session");
    let guard = session.mutex("logs/a").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
    session.close().await.expect("close");

    let sasl = Client::new(
        ZooKeeper::new(connect.as_str())
            .with_tls(tls.clone())
            .with_sasl_digest_md5("carol", SASL_PASSWORD),
    );
    sasl.session_with(options.clone())
        .await
        .expect("SASL session")
        .close()
        .await
        .expect("close");
    let wrong = Client::new(
        ZooKeeper::new(connect.as_str())
            .with_tls(tls)
            .with_sasl_digest_md5("carol", WRONG_PASSWORD),
    );
    assert!(
        wrong.session_with(options).await.is_err(),
        "a wrong SASL password was accepted"
    );

    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    assert!(logs.lines().count() > 10, "nothing was captured: {logs}");
    for secret in [DIGEST_PASSWORD, SASL_PASSWORD, WRONG_PASSWORD] {
        assert!(!logs.contains(secret), "the password {secret:?} was logged");
    }
    for line in key.lines().filter(|l| !l.starts_with("-----") && l.len() > 16) {
        assert!(!logs.contains(line), "a line of the private key was logged");
    }
}
