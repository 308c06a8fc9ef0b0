//! Endpoints are checked before any connection: a malformed one is a typed
//! error naming it, never a connection somewhere else.

use lockline::{Client, Error};
use lockline_etcd::Etcd;

#[tokio::test]
async fn malformed_endpoints_are_refused_before_connecting() {
    for (endpoint, says) in [
        ("http://127.0.0.1:99999", "not a port number"),
        ("http://127.0.0.1:0", "not a port number"),
        ("http://127.0.0.1", "no port"),
        ("http://:2379", "no host"),
        ("ftp://127.0.0.1:2379", "unknown scheme"),
        ("http://127.0.0.1:2379/v3", "without a path"),
    ] {
        let error = Client::new(Etcd::new([endpoint])).session().await.expect_err(endpoint);
        assert!(
            matches!(&error, Error::InvalidOptions { reason } if reason.contains(endpoint) && reason.contains(says)),
            "{endpoint}: {error:?}"
        );
    }
}
