//! etcd with authentication: rights revoked while a session waits. The
//! waiter's entry cannot be deleted by its own session any more; it must not
//! block the lock for longer than the session's TTL.

use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, SessionOptions, SessionState};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

const ROOT_PASSWORD: &str = "root-pw-9f2";
const ALICE_PASSWORD: &str = "alice-pw-71c";
const DAVE_PASSWORD: &str = "dave-pw-48e";
const MARKERS: &str = "locks/__lockline_abandoned__/";

/// A cluster with auth on; `alice` and `dave` each have read-write on
/// `locks/` through a role of their own (`alice-rw`, `dave-rw`).
async fn start() -> (EtcdCluster, etcd_client::Client) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    admin.user_add("root", ROOT_PASSWORD, None).await.expect("root");
    admin.role_add("root").await.expect("root role");
    admin.user_grant_role("root", "root").await.expect("grant root");
    for (user, password) in [("alice", ALICE_PASSWORD), ("dave", DAVE_PASSWORD)] {
        let role = format!("{user}-rw");
        admin.role_add(role.as_str()).await.expect("role");
        admin
            .role_grant_permission(role.as_str(), Permission::read_write("locks/").with_prefix())
            .await
            .expect("grant");
        admin.user_add(user, password, None).await.expect("user");
        admin.user_grant_role(user, role.as_str()).await.expect("grant role");
    }
    admin.auth_enable().await.expect("enable auth");
    let root = etcd_client::Client::connect(
        cluster.endpoints(),
        Some(etcd_client::ConnectOptions::new().with_user("root", ROOT_PASSWORD)),
    )
    .await
    .expect("connect as root");
    (cluster, root)
}

fn client(cluster: &EtcdCluster, user: &str, password: &str) -> Client {
    Client::new(
        Etcd::new(cluster.endpoints())
            .with_user(user, password)
            .with_marker_prefix(MARKERS),
    )
}

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2))
}

/// A waiter whose role is revoked while it waits: its acquire fails with a
/// refusal; its entry, which it may no longer delete, ends with its session
/// (declared lost, no longer renewed), so the lock is free again within the
/// TTL instead of for as long as the waiter's process runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_role_is_revoked_gives_the_lock_back_within_its_ttl() {
    let (cluster, mut root) = start().await;
    let alice = client(&cluster, "alice", ALICE_PASSWORD);
    let session = alice.session_with(options()).await.expect("alice's session");
    let guard = session.mutex("locks/b").expect("mutex").lock().await.expect("lock");

    let dave = client(&cluster, "dave", DAVE_PASSWORD);
    let dave_session = dave.session_with(options()).await.expect("dave's session");
    let mutex = dave_session.mutex("locks/b").expect("mutex");
    let waiter = spawn_queued(&dave, async move { mutex.lock().await }).await;

    root.user_revoke_role("dave", "dave-rw").await.expect("revoke");
    guard.release().await.expect("release");
    let outcome = bounded("dave's acquire ends", waiter).await.expect("task");
    match &outcome {
        Err(error) => assert!(error.is_refusal(), "{error:?}"),
        Ok(guard) => panic!("dave, without rights, was granted {}", guard.key()),
    }
    // Dave's cleanup is refused: his session is given up, never renewed again.
    bounded("dave's cleanup", dave_session.flush()).await;
    assert_eq!(dave.stats().cleanup_failures, 1, "{:?}", dave.stats());
    assert_eq!(
        bounded("dave's session ends", dave_session.lost()).await,
        SessionState::Lost
    );
    // Alice gets the lock back once Dave's lease has run out.
    let again = bounded(
        "alice gets the lock again",
        session.mutex("locks/b").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    let left = root
        .get(
            "locks/b/",
            Some(etcd_client::GetOptions::new().with_prefix().with_keys_only()),
        )
        .await
        .expect("read");
    assert_eq!(left.kvs().len(), 1, "only alice's entry is left");
    again.release().await.expect("release");
    session.close().await.expect("close");
}
