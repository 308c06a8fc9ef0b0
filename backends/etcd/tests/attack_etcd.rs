//! etcd with authentication: a lock held or waited for longer than the
//! server keeps an idle token.

use std::time::Duration;

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, SessionOptions};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

const ROOT_PASSWORD: &str = "root-pw-9f2";
const ALICE_PASSWORD: &str = "alice-pw-71c";
const DAVE_PASSWORD: &str = "dave-pw-48e";
const MARKERS: &str = "locks/__lockline_abandoned__/";
/// etcd's `--auth-token-ttl` for these clusters, in seconds: simple tokens
/// unused for this long are forgotten by the server.
const TOKEN_TTL_SECS: u64 = 1;

/// A cluster with auth on; `alice` and `dave` each have read-write on
/// `locks/` through a role of their own (`alice-rw`, `dave-rw`).
async fn start() -> (EtcdCluster, etcd_client::Client) {
    // etcd reads every flag from an ETCD_* variable too.
    std::env::set_var("ETCD_AUTH_TOKEN_TTL", TOKEN_TTL_SECS.to_string());
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
        .with_ttl(Duration::from_secs(5))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(4))
}

/// Lets the server forget every token not used for `TOKEN_TTL_SECS`: a
/// span of time is the event here, there is nothing else to wait for.
async fn outlive_tokens() {
    tokio::time::sleep(Duration::from_secs(TOKEN_TTL_SECS * 3)).await;
}

/// A lock held, or waited for, longer than the server keeps an idle token:
/// the client authenticates again (the documented behaviour of
/// `Etcd::with_user`), and release and the wake-up both work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_that_expires_while_holding_or_waiting_is_renewed() {
    let (cluster, _root) = start().await;
    let alice = client(&cluster, "alice", ALICE_PASSWORD);
    let session = alice.session_with(options()).await.expect("alice's session");
    let guard = session.mutex("locks/a").expect("mutex").lock().await.expect("lock");

    let dave = client(&cluster, "dave", DAVE_PASSWORD);
    let dave_session = dave.session_with(options()).await.expect("dave's session");
    let mutex = dave_session.mutex("locks/a").expect("mutex");
    let waiter = spawn_queued(&dave, async move { mutex.lock().await }).await;

    outlive_tokens().await;
    assert!(guard.is_held());
    guard.release().await.expect("release after the token expired");
    let second = bounded("dave is granted", waiter)
        .await
        .expect("task")
        .expect("lock after the token expired");
    second.release().await.expect("release");
    dave_session.close().await.expect("close");
    session.close().await.expect("close");
}
