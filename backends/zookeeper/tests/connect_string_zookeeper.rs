//! Connect strings are checked before any connection: an etcd URL or a
//! malformed server is a typed error naming it.

use std::time::Duration;

use lockline::{Client, Error, SessionOptions};
use lockline_zookeeper::ZooKeeper;

#[tokio::test]
async fn malformed_connect_strings_are_refused_before_connecting() {
    for (connect, says) in [
        ("http://127.0.0.1:2181", "looks like an etcd URL"),
        ("127.0.0.1:2181,http://127.0.0.1:2379", "looks like an etcd URL"),
        ("127.0.0.1:99999", "not a port number"),
        ("127.0.0.1", "has no port"),
        ("127.0.0.1:2181,:2182", "has no host"),
        ("/apps", "no server"),
    ] {
        let error = Client::new(ZooKeeper::new(connect)).session().await.expect_err(connect);
        assert!(
            matches!(&error, Error::InvalidOptions { reason } if reason.contains(connect) && reason.contains(says)),
            "{connect}: {error:?}"
        );
    }
}

/// The server prefixes zookeeper-client accepts (`tcp://`, `tcp+tls://`) and
/// a chroot pass the check: nothing listens there, so the session fails as
/// unreachable, not as a malformed string.
#[tokio::test]
async fn the_client_libraries_own_forms_pass_the_check() {
    let port = lockline_testkit::free_port().expect("a free port");
    for connect in [
        format!("tcp://127.0.0.1:{port}"),
        format!("127.0.0.1:{port},tcp://127.0.0.1:{port}/apps"),
    ] {
        let options = SessionOptions::new().with_connect_timeout(Duration::from_secs(1));
        let error = Client::new(ZooKeeper::new(connect.as_str()))
            .session_with(options)
            .await
            .expect_err(&connect);
        assert!(matches!(error, Error::Unavailable { .. }), "{connect}: {error:?}");
    }
}

/// A server nobody runs: the error's one line names it, so a log says where
/// lockline looked and what happened.
#[tokio::test]
async fn an_unreachable_server_is_named_in_the_message() {
    let port = lockline_testkit::free_port().expect("free port");
    let connect = format!("127.0.0.1:{port}");
    let options = lockline::SessionOptions::new().with_connect_timeout(std::time::Duration::from_secs(2));
    let error = lockline::Client::new(lockline_zookeeper::ZooKeeper::new(connect.as_str()))
        .session_with(options)
        .await
        .expect_err("nobody listens");
    assert!(matches!(error, lockline::Error::Unavailable { .. }), "{error:?}");
    let line = error.to_string();
    assert!(line.starts_with("zookeeper unavailable: "), "{line}");
    assert!(line.contains(&connect), "the message must name the server: {line}");
}

/// A server that accepts connections and never answers (a silent
/// partition): the connect deadline's message names it too.
#[tokio::test]
async fn a_silent_server_is_named_in_the_message() {
    let port = lockline_testkit::free_port().expect("free port");
    let proxy = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{port}")).expect("proxy");
    proxy.blackhole();
    let options = SessionOptions::new().with_connect_timeout(Duration::from_secs(1));
    let error = Client::new(ZooKeeper::new(proxy.address()))
        .session_with(options)
        .await
        .expect_err("nobody answers");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&proxy.address()),
        "the message must name the server: {error}"
    );
}

/// One silent server in the connect string (a partition: connections
/// accepted, nothing answered) does not keep sessions from opening through
/// the others, whichever the client library tries first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_in_the_list_does_not_keep_sessions_from_opening() {
    let ensemble = lockline_testkit::ZkEnsemble::start().expect("start ZooKeeper");
    let port = lockline_testkit::free_port().expect("free port");
    let silent = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{port}")).expect("proxy");
    silent.blackhole();
    for connect in [
        format!("{},{}", silent.address(), ensemble.address(0)),
        format!("{},{}", ensemble.address(0), silent.address()),
    ] {
        for _ in 0..3 {
            let session = Client::new(ZooKeeper::new(connect.as_str()))
                .session()
                .await
                .unwrap_or_else(|e| panic!("{connect}: {e}"));
            let guard = session.mutex("silent/one").expect("mutex").lock().await.expect("lock");
            guard.release().await.expect("release");
            session.close().await.expect("close");
        }
    }
}

/// Nothing listens on any server: the session fails at once, saying
/// "connection refused" and naming the servers (found by review: it waited
/// the whole connect timeout and said only "no session").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_refuse_connections_fail_at_once_saying_so() {
    let (a, b) = (
        lockline_testkit::free_port().expect("port"),
        lockline_testkit::free_port().expect("port"),
    );
    let connect = format!("127.0.0.1:{a},127.0.0.1:{b}");
    let started = std::time::Instant::now();
    let error = lockline::Client::new(lockline_zookeeper::ZooKeeper::new(connect.as_str()))
        .session_with(lockline::SessionOptions::new().with_connect_timeout(std::time::Duration::from_secs(5)))
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, lockline::Error::Unavailable { .. }), "{error:?}");
    let line = error.to_string();
    assert!(line.contains("refused") && line.contains(&a.to_string()), "{line}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}
