//! Connect strings are checked before any connection: an etcd URL or a
//! malformed server is a typed error naming it.

use std::time::Duration;

use lockline::{Client, Error, SessionOptions};
use lockline_zookeeper::ZooKeeper;

#[tokio::test]
async fn malformed_connect_strings_are_refused_before_connecting() {
    for (connect, says) in [
        ("http://127.0.0.1:2181", "looks like an etcd URL"),
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
