//! etcd with authentication: refusals that must not end a session, and how a
//! session given up after a refused removal ends.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::EtcdCluster;

const ROOT_PASSWORD: &str = "root-pw-4be";
const ERIN_PASSWORD: &str = "erin-pw-0c7";
const DAVE_PASSWORD: &str = "dave-pw-a13";
const MARKERS: &str = "locks/__lockline_abandoned__/";

/// A cluster with auth on:
/// - `erin`: read-write on `locks/` (markers included), read on `shared/`;
/// - `dave`: read-write on `locks/` through the role `dave-rw`.
async fn start() -> (EtcdCluster, etcd_client::Client) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    admin.user_add("root", ROOT_PASSWORD, None).await.expect("root");
    admin.role_add("root").await.expect("root role");
    admin.user_grant_role("root", "root").await.expect("grant root");
    admin.role_add("erin-role").await.expect("role");
    for permission in [
        Permission::read_write("locks/").with_prefix(),
        Permission::read("shared/").with_prefix(),
    ] {
        admin
            .role_grant_permission("erin-role", permission)
            .await
            .expect("grant");
    }
    admin.user_add("erin", ERIN_PASSWORD, None).await.expect("user");
    admin.user_grant_role("erin", "erin-role").await.expect("grant role");
    admin.role_add("dave-rw").await.expect("role");
    admin
        .role_grant_permission("dave-rw", Permission::read_write("locks/").with_prefix())
        .await
        .expect("grant");
    admin.user_add("dave", DAVE_PASSWORD, None).await.expect("user");
    admin.user_grant_role("dave", "dave-rw").await.expect("grant role");
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

/// A user that may only read `shared/` holds `locks/a`, then tries
/// `shared/x` in ways that are refused: `try_lock`, `contenders()` (allowed),
/// and a `lock_timeout` whose deadline passes while its append is in flight,
/// so that the attempt is abandoned in the background. None of these made an
/// entry, so none may end the session: `locks/a` stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_a_name_the_user_may_not_write_leave_its_other_locks_held() {
    let (cluster, _root) = start().await;
    let erin = client(&cluster, "erin", ERIN_PASSWORD);
    let session = erin.session_with(options()).await.expect("session");
    let held = session.mutex("locks/a").expect("mutex").lock().await.expect("lock");

    let shared = session.mutex("shared/x").expect("mutex");
    let tried = shared.try_lock().await;
    assert!(matches!(tried, Err(Error::PermissionDenied { .. })), "{tried:?}");
    let listed = shared.contenders().await.expect("read-only contenders");
    assert!(listed.is_empty(), "{listed:?}");

    // The deadline passes before the append's answer arrives: the attempt is
    // abandoned in the background, and that removal is refused as well.
    let timed = shared.lock_timeout(Duration::ZERO).await;
    assert!(timed.is_err(), "{timed:?}");
    bounded("the abandonment ends", session.flush()).await;

    assert_eq!(session.state(), SessionState::Live, "{:?}", erin.stats());
    assert!(held.is_held(), "locks/a was given up for a refusal on shared/x");
    held.release().await.expect("release");
    session.close().await.expect("close");
}

/// A holder whose role is revoked: its release is refused and the session is
/// given up. Its other guard hears `lost()` at once, before anyone else can
/// take that lock, and closing the given-up session neither hangs nor
/// reports the refused lease revocation as an error of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_up_session_tells_its_holders_first_and_closes_cleanly() {
    let (cluster, mut root) = start().await;
    let dave = client(&cluster, "dave", DAVE_PASSWORD);
    let session = dave.session_with(options()).await.expect("session");
    let first = session.mutex("locks/p").expect("mutex").lock().await.expect("lock");
    let second = session.mutex("locks/q").expect("mutex").lock().await.expect("lock");

    let erin = client(&cluster, "erin", ERIN_PASSWORD);
    let other = erin.session_with(options()).await.expect("session");
    let q = other.mutex("locks/q").expect("mutex");
    let waiter = tokio::spawn(async move {
        let guard = q.lock().await;
        (guard, tokio::time::Instant::now())
    });

    root.user_revoke_role("dave", "dave-rw").await.expect("revoke");
    let released = first.release().await;
    assert!(
        matches!(
            &released,
            Err(Error::PermissionDenied {
                operation: "delete",
                ..
            })
        ),
        "{released:?}"
    );
    bounded("the refused removal ends", session.flush()).await;
    assert_eq!(
        bounded("the session is given up", session.lost()).await,
        SessionState::Lost
    );
    bounded("the other holder hears it", second.lost()).await;
    let told = tokio::time::Instant::now();
    if waiter.is_finished() {
        let (outcome, at) = waiter.await.expect("task");
        panic!(
            "granted before the holder was told: {outcome:?} at {:?} after told",
            at.checked_duration_since(told)
        );
    }
    // Closed while the lease still runs: the revocation is refused (dave may
    // not write the key still on it), which changes nothing for a session
    // already given up.
    let closed = bounded("closing the given-up session", session.close()).await;
    assert!(closed.is_ok(), "{closed:?}");

    let (granted, at) = bounded("erin is granted once the lease expires", waiter)
        .await
        .expect("task");
    let granted = granted.expect("lock");
    assert!(at >= told);
    granted.release().await.expect("release");
    other.close().await.expect("close");
}
