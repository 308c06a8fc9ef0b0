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
        ("http://a b:2379", "not a host name or address"),
        ("http://[::1:2379", "not a host name or address"),
    ] {
        let error = Client::new(Etcd::new([endpoint])).session().await.expect_err(endpoint);
        assert!(
            matches!(&error, Error::InvalidOptions { reason } if reason.contains(endpoint) && reason.contains(says)),
            "{endpoint}: {error:?}"
        );
    }
}

/// An endpoint nobody listens on: the error's one line names it, so a log
/// says where lockline looked and what happened.
#[tokio::test]
async fn an_unreachable_endpoint_is_named_in_the_message() {
    let port = lockline_testkit::free_port().expect("free port");
    let endpoint = format!("http://127.0.0.1:{port}");
    let options = lockline::SessionOptions::new().with_connect_timeout(std::time::Duration::from_secs(2));
    let error = Client::new(Etcd::new([endpoint.as_str()]))
        .session_with(options)
        .await
        .expect_err("nobody listens");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    let line = error.to_string();
    assert!(line.starts_with("etcd unavailable: "), "{line}");
    assert!(
        line.contains(&format!("127.0.0.1:{port}")),
        "the message must name the endpoint: {line}"
    );
    assert!(
        line.contains(&format!("http://127.0.0.1:{port}: ")) && line.contains("Connection refused"),
        "the message must say which endpoint refused: {line}"
    );
    assert!(
        !line.contains("tonic::") && !line.contains("ConnectError("),
        "the one line must be words, not the client library's debug dump: {line}"
    );
}

/// A password written into an endpoint URL is refused and never shown.
#[tokio::test]
async fn credentials_in_an_endpoint_url_are_refused_unseen() {
    for endpoint in [
        "https://bob:URL-SECRET@127.0.0.1:2379",
        "http://bob:URL-SECRET@127.0.0.1:2379",
    ] {
        let error = Client::new(Etcd::new([endpoint])).session().await.expect_err(endpoint);
        let shown = format!("{error} {error:?}");
        assert!(matches!(error, Error::InvalidOptions { .. }), "{shown}");
        assert!(!shown.contains("URL-SECRET"), "the password was shown: {shown}");
        assert!(shown.contains("***@127.0.0.1:2379"), "{shown}");
    }
}

/// An endpoint that accepts connections and never answers (a silent
/// partition): the connect deadline's message names it too.
#[tokio::test]
async fn a_silent_endpoint_is_named_in_the_message() {
    let port = lockline_testkit::free_port().expect("free port");
    let proxy = lockline_testkit::TcpProxy::start(&format!("127.0.0.1:{port}")).expect("proxy");
    proxy.blackhole();
    let endpoint = format!("http://{}", proxy.address());
    let options = lockline::SessionOptions::new().with_connect_timeout(std::time::Duration::from_secs(1));
    let error = Client::new(Etcd::new([endpoint.as_str()]))
        .session_with(options)
        .await
        .expect_err("nobody answers");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(
        error.to_string().contains(&proxy.address()),
        "the message must name the endpoint: {error}"
    );
}

/// A port that accepts connections and hangs up at once (not an etcd
/// server): the error says so and names the endpoint (found by review: it
/// named none).
#[tokio::test]
async fn a_port_that_hangs_up_is_named_in_the_message() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            drop(stream);
        }
    });
    let endpoint = format!("http://127.0.0.1:{port}");
    let options = lockline::SessionOptions::new().with_connect_timeout(std::time::Duration::from_secs(2));
    let error = Client::new(Etcd::new([endpoint.as_str()]))
        .session_with(options)
        .await
        .expect_err("not an etcd server");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains(&format!("127.0.0.1:{port}")), "{error}");
}
