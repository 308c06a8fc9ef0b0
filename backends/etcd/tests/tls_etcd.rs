//! etcd served over TLS only, with client certificates required
//! (`--client-cert-auth --trusted-ca-file`), certificates made by the test:
//! the conformance suite passes over it, and a client that cannot complete
//! the handshake fails fast with an error that says TLS.

use std::time::{Duration, Instant};

use lockline::conformance::Fixture;
use lockline::{Client, Error, Session, SessionOptions, Tls};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy, TestCa};

struct TlsFixture {
    ca: TestCa,
    client: lockline_testkit::Issued,
    cluster: EtcdCluster,
}

impl TlsFixture {
    fn start() -> Self {
        let ca = TestCa::new("lockline test CA").expect("make a CA");
        let cluster = EtcdCluster::start_tls(&ca, true).expect("start etcd with TLS");
        let client = ca.client("lockline-test").expect("client certificate");
        TlsFixture { ca, client, cluster }
    }

    fn tls(&self) -> Tls {
        Tls::new()
            .with_ca_file(self.ca.cert())
            .expect("CA file")
            .with_client_files(&self.client.cert, &self.client.key)
            .expect("client files")
    }
}

#[lockline::async_trait]
impl Fixture for TlsFixture {
    async fn client(&self) -> Client {
        Client::new(Etcd::new(self.cluster.endpoints()).with_tls(self.tls()))
    }

    /// Revokes the session's lease from another client (over TLS too).
    async fn expire(&self, session: &Session) {
        let lease = i64::from_str_radix(session.id(), 16).expect("a lease id in hex");
        let issued = &self.client;
        let tls = lockline_etcd::etcd_client::TlsOptions::new()
            .ca_certificate(lockline_etcd::etcd_client::Certificate::from_pem(
                self.ca.cert_pem().expect("CA"),
            ))
            .identity(lockline_etcd::etcd_client::Identity::from_pem(
                issued.cert_pem().expect("cert"),
                issued.key_pem().expect("key"),
            ));
        let options = lockline_etcd::etcd_client::ConnectOptions::new().with_tls(tls);
        let mut side = lockline_etcd::etcd_client::Client::connect(self.cluster.endpoints(), Some(options))
            .await
            .expect("connect a side client");
        side.lease_revoke(lease).await.expect("revoke the lease");
    }
}

mod over_tls {
    use super::*;

    lockline::conformance_tests!(TlsFixture::start());
}

/// Short deadlines: a failed handshake must end within them, never hang.
fn quick() -> SessionOptions {
    SessionOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2))
}

/// The longest a failing connect may take: both deadlines and some slack
/// for a loaded machine.
const FAIL_WITHIN: Duration = Duration::from_secs(8);

async fn failing_session(client: Client) -> (Error, Duration) {
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), client.session_with(quick()))
        .await
        .expect("the session attempt hung for 30 s");
    let error = result.expect_err("a session over a failed handshake");
    (error, started.elapsed())
}

fn assert_tls_unavailable(error: &Error, took: Duration, case: &str) {
    assert!(
        matches!(error, Error::Unavailable { .. }),
        "{case}: expected Unavailable, got {error:?}"
    );
    let text = full_text(error);
    assert!(text.contains("TLS"), "{case}: the error does not say TLS: {text}");
    // The one line a log shows with `{}` says it too.
    assert!(
        error.to_string().contains("TLS"),
        "{case}: the message does not say TLS: {error}"
    );
    assert!(took < FAIL_WITHIN, "{case}: failing took {took:?}");
}

/// The error and its causes, as a log line would show them.
fn full_text(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_fails_fast_saying_tls() {
    let fixture = TlsFixture::start();
    let tls = Tls::new().with_ca_file(fixture.ca.cert()).expect("CA");
    let client = Client::new(Etcd::new(fixture.cluster.endpoints()).with_tls(tls));
    let (error, took) = failing_session(client).await;
    assert_tls_unavailable(&error, took, "no client certificate");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_fails_fast_saying_tls() {
    let fixture = TlsFixture::start();
    let other = TestCa::new("another CA").expect("CA");
    let client_cert = other.client("stranger").expect("client certificate");
    let tls = Tls::new()
        .with_ca_file(other.cert())
        .expect("CA")
        .with_client_files(&client_cert.cert, &client_cert.key)
        .expect("client");
    let client = Client::new(Etcd::new(fixture.cluster.endpoints()).with_tls(tls));
    let (error, took) = failing_session(client).await;
    assert_tls_unavailable(&error, took, "wrong CA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_text_client_against_the_tls_port_fails_fast_saying_tls() {
    let fixture = TlsFixture::start();
    let plain = format!("http://127.0.0.1:{}", fixture.cluster.client_port(0));
    let client = Client::new(Etcd::new([plain]));
    let (error, took) = failing_session(client).await;
    assert_tls_unavailable(&error, took, "plain text");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_the_endpoint_scheme_must_agree() {
    let fixture = TlsFixture::start();
    let plain = format!("http://127.0.0.1:{}", fixture.cluster.client_port(0));
    let client = Client::new(Etcd::new([plain]).with_tls(fixture.tls()));
    let error = client
        .session()
        .await
        .expect_err("TLS options with an http:// endpoint");
    assert!(
        matches!(&error, Error::InvalidOptions { reason } if reason.contains("https://")),
        "{error:?}"
    );
    let client = Client::new(Etcd::new(fixture.cluster.endpoints()));
    let error = client.session().await.expect_err("https:// without a CA");
    assert!(
        matches!(&error, Error::InvalidOptions { reason } if reason.contains("CA")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_that_is_not_pem_is_refused_without_being_quoted() {
    let fixture = TlsFixture::start();
    let tls = Tls::new()
        .with_ca_file(fixture.ca.cert())
        .expect("CA")
        .with_client_pem(fixture.ca.cert_pem().expect("cert"), "not-a-key-SECRET");
    let client = Client::new(Etcd::new(fixture.cluster.endpoints()).with_tls(tls));
    let error = client.session().await.expect_err("a key that is not PEM");
    assert!(matches!(error, Error::InvalidOptions { .. }), "{error:?}");
    assert!(!full_text(&error).contains("SECRET"), "{error}");
}

#[test]
fn debug_output_shows_no_key_or_password() {
    let tls = Tls::new()
        .with_ca_pem("-----BEGIN CERTIFICATE-----\nCA\n")
        .with_client_pem(
            "-----BEGIN CERTIFICATE-----\nC\n",
            "-----BEGIN PRIVATE KEY-----\nKEYSECRET\n",
        );
    let etcd = Etcd::new(["https://127.0.0.1:2379"])
        .with_tls(tls)
        .with_user("alice", "PASSWORDSECRET");
    let shown = format!("{etcd:?} {etcd:#?}");
    assert!(shown.contains("alice"), "{shown}");
    assert!(
        !shown.contains("KEYSECRET") && !shown.contains("PASSWORDSECRET"),
        "{shown}"
    );
}

/// The TLS handshake is part of connecting: a server that accepts the TCP
/// connection and then says nothing (a silent partition) fails the session
/// within the connect timeout, not the connect plus the request timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_tls_handshake_fails_within_the_connect_timeout() {
    let fixture = TlsFixture::start();
    let target = fixture.cluster.endpoint(0).trim_start_matches("https://").to_owned();
    let proxy = TcpProxy::start(&target).expect("proxy");
    proxy.blackhole();
    let client = Client::new(Etcd::new([format!("https://{}", proxy.address())]).with_tls(fixture.tls()));
    let connect_timeout = Duration::from_secs(1);
    let options = SessionOptions::new()
        .with_connect_timeout(connect_timeout)
        .with_request_timeout(Duration::from_secs(8));
    let started = Instant::now();
    let result = tokio::time::timeout(Duration::from_secs(30), client.session_with(options))
        .await
        .expect("hung for 30 s");
    let took = started.elapsed();
    let error = result.expect_err("no session through a blackhole");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(
        took <= connect_timeout + Duration::from_millis(700),
        "took {took:?}: {error:?}"
    );
}
