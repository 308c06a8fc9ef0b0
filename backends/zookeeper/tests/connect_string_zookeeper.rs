//! Connect strings are checked before any connection: an etcd URL or a
//! malformed server is a typed error naming it.

use lockline::{Client, Error};
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
