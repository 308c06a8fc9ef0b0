//! etcd over TLS behind a silent network: a connection accepted whose
//! handshake is never answered.

use std::time::{Duration, Instant};

use lockline::{Client, Error, SessionOptions, Tls};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy, TestCa};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Scheduling slack past the connect timeout.
const SLACK: Duration = Duration::from_millis(700);

/// The TLS handshake is part of connecting: a server that accepts the TCP
/// connection and then says nothing fails the session within the connect
/// timeout (not the connect plus the request timeout), saying TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_tls_handshake_fails_within_the_connect_timeout() {
    let ca = TestCa::new("lockline test CA").expect("CA");
    let cluster = EtcdCluster::start_tls(&ca, true).expect("start etcd with TLS");
    let issued = ca.client("lockline-test").expect("client certificate");
    let target = cluster.endpoint(0).trim_start_matches("https://").to_owned();
    let proxy = TcpProxy::start(&target).expect("proxy");
    proxy.blackhole();
    let tls = Tls::new()
        .with_ca_pem(ca.cert_pem().expect("CA"))
        .with_client_pem(issued.cert_pem().expect("cert"), issued.key_pem().expect("key"));
    let client = Client::new(Etcd::new([format!("https://{}", proxy.address())]).with_tls(tls));
    let options = SessionOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_request_timeout(Duration::from_secs(8));
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), client.session_with(options))
        .await
        .expect("hung for 30 s");
    let took = started.elapsed();
    let error = result.expect_err("no session through a blackhole");
    eprintln!("{took:?}: {error:?}");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(took <= CONNECT_TIMEOUT + SLACK, "took {took:?}: {error:?}");
}
