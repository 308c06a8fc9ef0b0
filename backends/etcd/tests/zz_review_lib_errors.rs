//! Review probes: `Error`'s one-line Display carries the cause (address,
//! server's words), and connecting to something that never answers fails
//! within the connect deadline.

use std::time::{Duration, Instant};

use lockline::{Client, Error, SessionOptions};
use lockline_etcd::Etcd;
use lockline_testkit::{free_port, TcpProxy, ZkEnsemble};

fn opts(connect: Duration) -> SessionOptions {
    SessionOptions::new().with_connect_timeout(connect)
}

async fn open(endpoint: &str, options: SessionOptions) -> (Result<lockline::Session, Error>, Duration) {
    let started = Instant::now();
    let result = Client::new(Etcd::new([endpoint])).session_with(options).await;
    (result, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_endpoint_fails_within_the_connect_deadline() {
    let port = free_port().expect("port");
    let proxy = TcpProxy::start(&format!("127.0.0.1:{port}")).expect("proxy");
    proxy.blackhole();
    let endpoint = format!("http://{}", proxy.address());
    let (result, took) = open(&endpoint, opts(Duration::from_secs(1))).await;
    let error = result.expect_err("nobody answers");
    eprintln!("silent etcd endpoint, connect timeout 1s: {error} (after {took:?})");
    assert!(error.to_string().contains(&proxy.address()), "{error}");
    assert!(
        took < Duration::from_millis(1500),
        "the connect timeout is 1s, but the failure came after {took:?}: {error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_endpoint_names_address_and_cause() {
    let port = free_port().expect("port");
    let endpoint = format!("http://127.0.0.1:{port}");
    let (result, took) = open(&endpoint, opts(Duration::from_secs(2))).await;
    let error = result.expect_err("nobody listens");
    let line = error.to_string();
    eprintln!("refused etcd endpoint: {line} (after {took:?})");
    assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
    assert!(
        line.to_lowercase().contains("refused"),
        "the cause (connection refused) should be in the message: {line}"
    );
    assert!(took < Duration::from_millis(2500), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_port_and_other_shapes() {
    for endpoint in [
        "http://127.0.0.1:99999",
        "127.0.0.1:99999",
        "http://127.0.0.1:-1",
        "http://[::1]:99999",
    ] {
        let (result, took) = open(endpoint, opts(Duration::from_secs(1))).await;
        let error = result.expect_err(endpoint);
        eprintln!("{endpoint}: {error} ({took:?})");
        assert!(matches!(error, Error::InvalidOptions { .. }), "{endpoint}: {error:?}");
        assert!(error.to_string().contains(endpoint), "{endpoint}: {error}");
    }
}

/// An etcd client pointed at a ZooKeeper port (it accepts TCP, answers
/// garbage for HTTP/2): a typed error naming the endpoint, within the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_on_a_zookeeper_port() {
    let ensemble = ZkEnsemble::start().expect("zk");
    let endpoint = format!("http://{}", ensemble.address(0));
    let (result, took) = open(&endpoint, opts(Duration::from_secs(1))).await;
    let error = result.expect_err("not etcd");
    eprintln!("etcd on a ZooKeeper port: {error} [{error:?}] ({took:?})");
    assert!(error.to_string().contains(&ensemble.address(0)), "{error}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

/// A port that accepts and closes at once (an HTTP/1 server, say): named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_on_a_port_that_hangs_up() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            drop(stream);
        }
    });
    let endpoint = format!("http://{address}");
    let (result, took) = open(&endpoint, opts(Duration::from_secs(1))).await;
    let error = result.expect_err("hangs up");
    eprintln!("etcd on a port that hangs up: {error} ({took:?})");
    assert!(error.to_string().contains(&address), "{error}");
    assert!(took < Duration::from_millis(1500), "{took:?}");
}

/// Request-level errors: a value too large names key and server's words.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_errors_carry_the_servers_words() {
    let cluster = lockline_testkit::EtcdCluster::start().expect("etcd");
    let session = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let guard = session
        .mutex("review/errors")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let error = guard
        .write_if_held([lockline::Write::put("review/big", vec![b'x'; 2 << 20])])
        .await
        .expect_err("too large");
    eprintln!("too large: {error}");
    assert!(matches!(error, Error::InvalidOptions { .. }), "{error:?}");
    // Too many ops in one txn (default --max-txn-ops 128).
    let many: Vec<_> = (0..200)
        .map(|i| lockline::Write::put(format!("review/many/k{i}"), "v"))
        .collect();
    let error = guard.write_if_held(many).await.expect_err("too many operations");
    eprintln!("too many ops: {error} [{error:?}]");
    assert!(
        error.to_string().contains("too many operations"),
        "the server's words should be in the message: {error}"
    );
    assert!(guard.is_held());
    guard.release().await.expect("release");
}

/// `close()` with the server stopped: an error within the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_with_the_server_stopped() {
    let mut cluster = lockline_testkit::EtcdCluster::start().expect("etcd");
    let options = SessionOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2));
    let session = Client::new(Etcd::new(cluster.endpoints()))
        .session_with(options)
        .await
        .expect("session");
    let _g = session
        .mutex("review/close")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    cluster.member(0).stop().expect("stop");
    let started = Instant::now();
    let closed = session.close().await;
    eprintln!(
        "etcd close() with the server stopped: {closed:?} after {:?}",
        started.elapsed()
    );
    assert!(matches!(closed, Err(Error::Unavailable { .. })), "{closed:?}");
    assert!(started.elapsed() < Duration::from_millis(2500));
}
