//! A locked-down ZooKeeper: TLS failures, digest and SASL credentials, ACLs.
//!
//! TLS: a wrong CA, a missing client certificate where the server needs one,
//! plain text against the TLS port and TLS against the plain port each give
//! `Unavailable` naming TLS within the connect timeout. Credentials and ACLs:
//! `AclPolicy::Creator` keeps another identity from deleting a contender's
//! node or queueing in the directory; ACL refusals are `PermissionDenied` at
//! once and leave no node; a SASL login the server rejects is
//! `AuthenticationFailed`. No password or key shows in `Debug` or an error.

use std::process::Command;
use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, Error, SessionOptions, Tls};
use lockline_testkit::{ClientAuth, LineChild, TcpProxy, TestCa, ZkEnsemble, ZkOptions, ZkTlsOptions};
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::{AclPolicy, ZooKeeper};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// What a failed session open may take beyond the connect timeout: none is
/// expected, this is scheduling slack.
const SLACK: Duration = Duration::from_millis(300);
const PASSWORD_A: &str = "pw-of-alice-Zq81";
const PASSWORD_B: &str = "pw-of-bob-Xk27";
const SASL_PASSWORD: &str = "sasl-secret-Jm55";

fn options() -> SessionOptions {
    SessionOptions::new().with_connect_timeout(CONNECT_TIMEOUT)
}

/// The error's message and every source's, as `a: b: c`.
fn chain(error: &Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// No secret of these tests in `text`.
fn assert_no_secret(text: &str, key_pem: Option<&str>) {
    for secret in [PASSWORD_A, PASSWORD_B, SASL_PASSWORD] {
        assert!(!text.contains(secret), "a password leaked: {text}");
    }
    if let Some(key) = key_pem {
        let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
        assert!(!text.contains(&body[..20]), "the private key leaked: {text}");
        assert!(!text.contains("PRIVATE KEY"), "the private key leaked: {text}");
    }
}

fn tls_ensemble(ca: &TestCa, client_auth: ClientAuth) -> ZkEnsemble {
    let options = ZkOptions {
        tls: Some(ZkTlsOptions {
            server: ca.server("zookeeper").expect("server certificate"),
            client_ca: ca.cert().to_owned(),
            client_auth,
        }),
        ..ZkOptions::default()
    };
    ZkEnsemble::start_with(1, &options).expect("start ZooKeeper with TLS")
}

/// Opens a session that must fail with `Unavailable` naming TLS within the
/// connect timeout; returns the error's whole chain.
async fn assert_tls_unavailable(backend: ZooKeeper, key_pem: Option<&str>) -> String {
    let started = Instant::now();
    let result = Client::new(backend).session_with(options()).await;
    let took = started.elapsed();
    let error = result.expect_err("the session must not open");
    let text = chain(&error);
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(text.contains("TLS"), "the error does not say TLS: {text}");
    assert!(
        error.to_string().contains("TLS"),
        "the message does not say TLS: {error}"
    );
    assert!(took <= CONNECT_TIMEOUT + SLACK, "took {took:?}: {text}");
    assert_no_secret(&text, key_pem);
    assert_no_secret(&format!("{error:?}"), key_pem);
    eprintln!("{text}");
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_failures_are_unavailable_naming_tls_within_the_connect_timeout() {
    let ca = TestCa::new("lockline-test-ca").expect("CA");
    let other_ca = TestCa::new("some-other-ca").expect("other CA");
    let ensemble = tls_ensemble(&ca, ClientAuth::Need);
    let secure = ensemble.secure_connect_string().expect("a TLS port");
    let client = ca.client("lockline").expect("client certificate");
    let (cert, key) = (client.cert_pem().expect("cert"), client.key_pem().expect("key"));

    // The server's certificate is not signed by the CA the client trusts.
    let wrong_ca = Tls::new()
        .with_ca_pem(other_ca.cert_pem().expect("PEM"))
        .with_client_pem(cert.clone(), key.clone());
    let text = assert_tls_unavailable(ZooKeeper::new(secure.clone()).with_tls(wrong_ca), Some(&key)).await;
    assert!(text.contains("TLS handshake with 127.0.0.1:"), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");

    // The server needs a client certificate and gets none.
    let no_cert = Tls::new().with_ca_pem(ca.cert_pem().expect("PEM"));
    let text = assert_tls_unavailable(ZooKeeper::new(secure.clone()).with_tls(no_cert), None).await;
    assert!(text.contains("TLS handshake with 127.0.0.1:"), "{text}");

    // Plain text against the TLS port (alone in the connect string).
    let text = assert_tls_unavailable(ZooKeeper::new(secure.clone()), None).await;
    assert!(text.contains("expects TLS"), "{text}");

    // TLS against the plain port.
    let good = Tls::new()
        .with_ca_pem(ca.cert_pem().expect("PEM"))
        .with_client_pem(cert, key.clone());
    let text = assert_tls_unavailable(
        ZooKeeper::new(ensemble.connect_string()).with_tls(good.clone()),
        Some(&key),
    )
    .await;
    assert!(text.contains("TLS handshake with 127.0.0.1:"), "{text}");

    // And the right settings do connect, and lock.
    let session = Client::new(ZooKeeper::new(secure).with_tls(good))
        .session_with(options())
        .await
        .expect("a session over TLS");
    let guard = session.mutex("tls/ok").expect("mutex").lock().await.expect("lock");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_pem_is_an_options_error_that_hides_the_key() {
    let ca = TestCa::new("lockline-test-ca").expect("CA");
    let key = "-----BEGIN PRIVATE KEY-----\nTk9UQUtFWU5PVEFLRVlOT1RBS0VZTk9UQUtFWQ==\n-----END PRIVATE KEY-----\n";
    let cases = [
        Tls::new().with_ca_pem("not a certificate"),
        Tls::new(),
        Tls::new()
            .with_ca_pem(ca.cert_pem().expect("PEM"))
            .with_client_pem("not a certificate", key),
    ];
    for tls in cases {
        let backend = ZooKeeper::new("127.0.0.1:1").with_tls(tls.clone());
        let started = Instant::now();
        let error = Client::new(backend).session_with(options()).await.expect_err("refused");
        assert!(matches!(error, Error::InvalidOptions { .. }), "{tls:?}: {error:?}");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refused only after {:?}",
            started.elapsed()
        );
        let text = format!("{} {error:?}", chain(&error));
        assert!(text.contains("TLS"), "{text}");
        assert!(!text.contains("Tk9UQUtFWU5P"), "the key leaked: {text}");
    }
}

/// A plain ZooKeeper client authenticated with digest `user:password`.
async fn raw_client(ensemble: &ZkEnsemble, user: &str, password: &str) -> zk::Client {
    zk::Client::connector()
        .with_auth("digest", format!("{user}:{password}").as_bytes())
        .connect(&ensemble.connect_string())
        .await
        .expect("raw client")
}

fn creator(ensemble: &ZkEnsemble, user: &str, password: &str) -> ZooKeeper {
    ZooKeeper::new(ensemble.connect_string())
        .with_digest(user, password)
        .with_acl_policy(AclPolicy::Creator)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_policy_sets_the_documented_acls() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let session = Client::new(creator(&ensemble, "alice", PASSWORD_A))
        .session()
        .await
        .expect("session");
    let guard = session.mutex("acl/shape").expect("mutex").lock().await.expect("lock");
    // ZooKeeper shows a digest identity's hash only to a reader with ADMIN.
    let side = raw_client(&ensemble, "alice", PASSWORD_A).await;
    let alice = zk::AuthId::new("digest", &digest_id("alice", PASSWORD_A));
    let expected = [
        zk::Acl::new(zk::Permission::ALL, alice),
        zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()),
    ];
    for path in ["/acl", "/acl/shape", guard.key()] {
        let (acl, _) = side.get_acl(path).await.expect("get ACL");
        assert_eq!(acl, expected, "ACL of {path}");
    }
    guard.release().await.expect("release");
}

/// ZooKeeper's digest identity: `user:base64(sha1(user:password))`, read
/// back from the server (a node created with the `auth` scheme records it).
fn digest_id(user: &str, password: &str) -> String {
    let output = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import base64,hashlib,sys; u,p=sys.argv[1:]; print(u+':'+base64.b64encode(hashlib.sha1((u+':'+p).encode()).digest()).decode())",
            user,
            password,
        ])
        .output()
        .expect("python3");
    String::from_utf8(output.stdout).expect("UTF-8").trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_policy_keeps_another_identity_from_deleting_or_queueing() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let alice = Client::new(creator(&ensemble, "alice", PASSWORD_A));
    let alice_session = alice.session().await.expect("alice's session");
    let guard = alice_session
        .mutex("jobs/nightly")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let key = guard.key().to_owned();

    // Bob, another digest identity, cannot delete Alice's node...
    let bob_raw = raw_client(&ensemble, "bob", PASSWORD_B).await;
    assert_eq!(bob_raw.delete(&key, None).await, Err(zk::Error::NoAuth));
    // ...nor the directory's other children, nor change her node's data.
    assert_eq!(
        bob_raw.set_data(&key, b"mine", None).await.err(),
        Some(zk::Error::NoAuth)
    );
    // Her node survived, and she still holds.
    assert!(bob_raw.check_stat(&key).await.expect("stat").is_some());
    assert!(guard.is_held());
    // He may read the queue.
    assert_eq!(bob_raw.list_children("/jobs/nightly").await.expect("list").len(), 1);

    // Through lockline Bob is refused at once, leaving nothing behind.
    let bob = Client::new(creator(&ensemble, "bob", PASSWORD_B));
    let bob_session = bob.session().await.expect("bob's session");
    let bob_mutex = bob_session.mutex("jobs/nightly").expect("mutex");
    let started = Instant::now();
    let error = bob_mutex.lock().await.expect_err("refused");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused after {:?}",
        started.elapsed()
    );
    match &error {
        Error::PermissionDenied { operation, key, .. } => {
            assert_eq!(*operation, "queue on");
            assert_eq!(key, "/jobs/nightly");
        }
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
    assert_no_secret(&format!("{} {error:?}", chain(&error)), None);
    assert_eq!(
        bob_raw.list_children("/jobs/nightly").await.expect("list"),
        vec![key.rsplit('/').next().expect("name").to_owned()]
    );
    let stats = bob.stats();
    assert_eq!(stats.cleanup_failures, 0, "{stats:?}");

    // Another session of Alice's identity queues and is granted after her.
    let alice2 = Client::new(creator(&ensemble, "alice", PASSWORD_A));
    let alice2_session = alice2.session().await.expect("session");
    let mutex = alice2_session.mutex("jobs/nightly").expect("mutex");
    let waiter = spawn_queued(&alice2, async move { mutex.lock().await }).await;
    assert!(!waiter.is_finished());
    guard.release().await.expect("release");
    let second = bounded("alice's second session takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(second.is_held());
    second.release().await.expect("release");
    bob_session.close().await.expect("close");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_refusals_are_permission_denied_at_once_and_leave_no_node() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    // An operator's parent: the digest user "alice" may do anything, nobody
    // else anything.
    let admin = raw_client(&ensemble, "alice", PASSWORD_A).await;
    admin
        .create(
            "/locked",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::creator_all()),
        )
        .await
        .expect("create /locked");

    // Unauthenticated: refused to create the lock directory.
    let anonymous = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = anonymous.session().await.expect("session");
    let started = Instant::now();
    let error = session
        .mutex("locked/a")
        .expect("mutex")
        .lock()
        .await
        .expect_err("refused");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "refused after {:?}",
        started.elapsed()
    );
    assert!(
        matches!(&error, Error::PermissionDenied { operation: "create", key, .. } if key == "/locked/a"),
        "{error:?}"
    );
    assert!(!error.is_transient());

    // Digest with the wrong password is another identity: refused too.
    let wrong = Client::new(ZooKeeper::new(ensemble.connect_string()).with_digest("alice", PASSWORD_B));
    let wrong_session = wrong.session().await.expect("digest never fails at connect");
    let error = wrong_session
        .mutex("locked/a")
        .expect("mutex")
        .try_lock()
        .await
        .expect_err("refused");
    assert!(matches!(error, Error::PermissionDenied { .. }), "{error:?}");
    assert_no_secret(&format!("{} {error:?}", chain(&error)), None);

    // The right password queues, and the directory the operator made holds
    // no node of the refused attempts.
    let right = Client::new(ZooKeeper::new(ensemble.connect_string()).with_digest("alice", PASSWORD_A));
    let right_session = right.session().await.expect("session");
    let guard = right_session
        .mutex("locked/a")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");
    let children = admin.list_children("/locked/a").await.expect("list");
    assert_eq!(children.len(), 1, "{children:?}");
    assert_eq!(format!("/locked/a/{}", children[0]), guard.key());

    // An unauthenticated contender on an existing directory it may read but
    // not create in: refused to queue, nothing left, no cleanup retrying.
    admin
        .create(
            "/readonly",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&[
                zk::Acl::new(zk::Permission::ALL, zk::AuthId::authed()),
                zk::Acl::new(zk::Permission::READ, zk::AuthId::anyone()),
            ])),
        )
        .await
        .expect("create /readonly");
    let error = session
        .mutex("readonly")
        .expect("mutex")
        .lock()
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, Error::PermissionDenied { operation: "queue on", key, .. } if key == "/readonly"),
        "{error:?}"
    );
    assert!(admin.list_children("/readonly").await.expect("list").is_empty());
    assert_eq!(anonymous.stats().cleanup_failures, 0);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_policy_without_credentials_is_refused() {
    let error = Client::new(ZooKeeper::new("127.0.0.1:1").with_acl_policy(AclPolicy::Creator))
        .session_with(options())
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, Error::InvalidOptions { reason } if reason.contains("with_digest")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sasl_digest_md5_logs_in_and_a_wrong_password_is_authentication_failed() {
    let options_with_users = ZkOptions {
        sasl_users: vec![("carol".into(), SASL_PASSWORD.into())],
        ..ZkOptions::default()
    };
    let ensemble = ZkEnsemble::start_with(1, &options_with_users).expect("start ZooKeeper with SASL");

    // The right password: the session's identity is sasl:carol.
    let good = ZooKeeper::new(ensemble.connect_string())
        .with_sasl_digest_md5("carol", SASL_PASSWORD)
        .with_acl_policy(AclPolicy::Creator);
    let session = Client::new(good).session_with(options()).await.expect("SASL login");
    let guard = session.mutex("sasl/a").expect("mutex").lock().await.expect("lock");
    let side = zk::Client::connect(&ensemble.connect_string()).await.expect("side");
    let (acl, _) = side.get_acl(guard.key()).await.expect("ACL");
    assert_eq!(
        acl[0],
        zk::Acl::new(zk::Permission::ALL, zk::AuthId::new("sasl", "carol"))
    );
    guard.release().await.expect("release");

    // A wrong password: refused by the server, reported as such, at once.
    let bad = ZooKeeper::new(ensemble.connect_string()).with_sasl_digest_md5("carol", PASSWORD_B);
    let started = Instant::now();
    let error = Client::new(bad).session_with(options()).await.expect_err("refused");
    let took = started.elapsed();
    assert!(
        matches!(&error, Error::AuthenticationFailed { reason, .. } if reason.contains("carol")),
        "{error:?}"
    );
    assert!(took <= CONNECT_TIMEOUT, "took {took:?}");
    assert_no_secret(&format!("{} {error:?}", chain(&error)), None);
}

#[test]
fn debug_never_shows_a_password_or_key() {
    let key = "-----BEGIN PRIVATE KEY-----\nS2V5Qnl0ZXNLZXlCeXRlc0tleUJ5dGVz\n-----END PRIVATE KEY-----\n";
    let backend = ZooKeeper::new("127.0.0.1:2281/apps")
        .with_tls(Tls::new().with_ca_pem("CA").with_client_pem("CERT", key))
        .with_digest("alice", PASSWORD_A)
        .with_sasl_digest_md5("carol", SASL_PASSWORD)
        .with_acl_policy(AclPolicy::Creator);
    let shown = format!("{backend:?} {backend:#?}");
    assert_no_secret(&shown, Some(key));
    for expected in ["127.0.0.1:2281/apps", "alice", "carol", "Creator", "tls: true"] {
        assert!(shown.contains(expected), "{expected} missing: {shown}");
    }
}

/// kazoo (digest-authenticated, as lockline) holding a `Lock` on `path`.
fn kazoo_lock(ensemble: &ZkEnsemble, path: &str) -> LineChild {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kazoo/hold_lock.py");
    let mut command = Command::new("/usr/bin/python3");
    command
        .args([script, &ensemble.connect_string(), path, "lock"])
        .env("KAZOO_DIGEST", format!("alice:{PASSWORD_A}"));
    LineChild::spawn(command).expect("start the kazoo helper")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_policy_interoperates_with_digest_authenticated_kazoo() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()).with_digest("alice", PASSWORD_A));
    let session = client.session().await.expect("session");
    let mutex = session.mutex("interop/auth").expect("mutex");

    // kazoo holds; lockline queues behind it and takes over when it releases.
    let mut kazoo = kazoo_lock(&ensemble, "/interop/auth");
    let held = kazoo.line(Duration::from_secs(20)).expect("kazoo holds the lock");
    assert!(held.starts_with("held "), "{held}");
    assert!(
        mutex.try_lock().await.expect("try_lock").is_none(),
        "kazoo's lock was ignored"
    );
    let waiter = {
        let mutex = mutex.clone();
        spawn_queued(&client, async move { mutex.lock().await }).await
    };
    assert!(!waiter.is_finished());
    kazoo.close_stdin();
    assert_eq!(kazoo.line(Duration::from_secs(10)).as_deref(), Some("released"));
    kazoo.wait().expect("kazoo exits");
    let guard = bounded("lockline takes over", waiter)
        .await
        .expect("task")
        .expect("lock");

    // lockline holds; kazoo waits until it releases.
    let side = zk::Client::connect(&ensemble.connect_string()).await.expect("side");
    let (_, _, queued) = side.get_and_watch_children("/interop/auth").await.expect("watch");
    let mut kazoo = kazoo_lock(&ensemble, "/interop/auth");
    bounded("kazoo queues", queued.changed()).await;
    assert!(
        kazoo.line(Duration::from_millis(500)).is_none(),
        "kazoo took a held lock"
    );
    guard.release().await.expect("release");
    let held = kazoo
        .line(Duration::from_secs(10))
        .expect("kazoo gets the lock after lockline");
    assert!(held.starts_with("held "), "{held}");
    kazoo.close_stdin();
    assert_eq!(kazoo.line(Duration::from_secs(10)).as_deref(), Some("released"));
}

/// A TLS port behind a silent network (connections accepted, nothing ever
/// answered, no reset): the session fails within the connect timeout, the
/// handshake included, with `Unavailable`, never a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_tls_port_fails_within_the_connect_timeout() {
    let ca = TestCa::new("lockline-test-ca").expect("CA");
    let ensemble = tls_ensemble(&ca, ClientAuth::Need);
    let proxy = TcpProxy::start(&ensemble.secure_address(0).expect("a TLS port")).expect("proxy");
    proxy.blackhole();
    let client = ca.client("lockline").expect("client certificate");
    let tls = Tls::new()
        .with_ca_pem(ca.cert_pem().expect("CA"))
        .with_client_pem(client.cert_pem().expect("cert"), client.key_pem().expect("key"));
    let started = Instant::now();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        Client::new(ZooKeeper::new(proxy.address().to_string()).with_tls(tls)).session_with(options()),
    )
    .await
    .expect("hung for 30 s");
    let took = started.elapsed();
    let error = result.expect_err("no session through a blackhole");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(took <= CONNECT_TIMEOUT + SLACK, "took {took:?}: {error:?}");
}
