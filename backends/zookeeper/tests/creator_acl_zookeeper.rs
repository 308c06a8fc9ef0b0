//! The Creator ACL policy against identities that share a TLS client certificate.

use std::time::Duration;

use lockline::{Client, Error, SessionOptions, Tls};
use lockline_testkit::{ClientAuth, TestCa, ZkEnsemble, ZkOptions, ZkTlsOptions};
use lockline_zookeeper::{AclPolicy, ZooKeeper};

const PASSWORD_A: &str = "pw-of-alice-Zq81";
const PASSWORD_B: &str = "pw-of-bob-Xk27";

fn tls_ensemble(ca: &TestCa) -> ZkEnsemble {
    let options = ZkOptions {
        tls: Some(ZkTlsOptions {
            server: ca.server("zookeeper").expect("server certificate"),
            client_ca: ca.cert().to_owned(),
            client_auth: ClientAuth::Need,
        }),
        ..ZkOptions::default()
    };
    ZkEnsemble::start_with(1, &options).expect("start ZooKeeper with TLS")
}

/// Two digest identities that share one client certificate (one certificate
/// per host or per fleet is the common deployment) are still two identities
/// for `AclPolicy::Creator`: the certificate's `x509:` identity, which the
/// server adds to every TLS session on its own, must not let one queue in,
/// or delete from, the other's directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creator_policy_does_not_share_a_directory_through_the_client_certificate() {
    let ca = TestCa::new("lockline-test-ca").expect("CA");
    let ensemble = tls_ensemble(&ca);
    let secure = ensemble.secure_connect_string().expect("a TLS port");
    let client = ca.client("shared-client").expect("client certificate");
    let tls = Tls::new()
        .with_ca_pem(ca.cert_pem().expect("PEM"))
        .with_client_pem(client.cert_pem().expect("cert"), client.key_pem().expect("key"));
    let backend = |user: &str, password: &str| {
        ZooKeeper::new(secure.clone())
            .with_tls(tls.clone())
            .with_digest(user, password)
            .with_acl_policy(AclPolicy::Creator)
    };
    let options = SessionOptions::new().with_connect_timeout(Duration::from_secs(5));
    let alice = Client::new(backend("alice", PASSWORD_A));
    let alice_session = alice.session_with(options.clone()).await.expect("alice's session");
    let guard = alice_session
        .mutex("jobs/nightly")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");

    let bob = Client::new(backend("bob", PASSWORD_B));
    let bob_session = bob.session_with(options).await.expect("bob's session");
    let result = bob_session.mutex("jobs/nightly").expect("mutex").try_lock().await;
    match result {
        Err(Error::PermissionDenied { operation, .. }) => assert_eq!(operation, "queue on"),
        other => panic!("bob, another identity, was not refused: {other:?}"),
    }
    assert!(guard.is_held());
    guard.release().await.expect("release");
    bob_session.close().await.expect("close");
    alice_session.close().await.expect("close");
}
