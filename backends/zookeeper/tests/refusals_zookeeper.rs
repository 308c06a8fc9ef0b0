//! ZooKeeper ACLs: refusals that must not end a session, and an entry a
//! refused acquire could not take back.

use std::time::Duration;

use lockline::conformance::bounded;
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_testkit::ZkEnsemble;
use lockline_zookeeper::zookeeper_client as zk;
use lockline_zookeeper::{AclPolicy, ZooKeeper};

const BOSS_PASSWORD: &str = "boss-pw-6e1";
const ALICE_PASSWORD: &str = "alice-pw-d42";
const BOB_PASSWORD: &str = "bob-pw-19f";

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(4))
        .with_connect_timeout(Duration::from_secs(3))
        .with_request_timeout(Duration::from_secs(3))
}

fn creator(ensemble: &ZkEnsemble, user: &str, password: &str) -> Client {
    Client::new(
        ZooKeeper::new(ensemble.connect_string())
            .with_digest(user, password)
            .with_acl_policy(AclPolicy::Creator),
    )
}

/// A directory where everyone may create but only its owner may read or
/// delete. An anonymous acquire creates its node, may not list the queue,
/// and may not delete the node either: the acquire is refused, and the node
/// must not stay in the queue for as long as the anonymous session lives
/// ("an acquire refused when it queues leaves no entry behind").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_acquire_whose_node_cannot_be_deleted_does_not_block_the_owner() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let admin = zk::Client::connector()
        .with_auth("digest", format!("boss:{BOSS_PASSWORD}").as_bytes())
        .connect(&ensemble.connect_string())
        .await
        .expect("admin");
    admin
        .create(
            "/createonly",
            b"",
            &zk::CreateMode::Persistent.with_acls(zk::Acls::new(&[
                zk::Acl::new(zk::Permission::ALL, zk::AuthId::authed()),
                zk::Acl::new(zk::Permission::CREATE, zk::AuthId::anyone()),
            ])),
        )
        .await
        .expect("create /createonly");

    let anonymous = Client::new(ZooKeeper::new(ensemble.connect_string()));
    let session = anonymous.session_with(options()).await.expect("session");
    let refused = session.mutex("createonly").expect("mutex").lock().await;
    assert!(matches!(&refused, Err(Error::PermissionDenied { .. })), "{refused:?}");
    // The node could be neither listed nor deleted: the session is given up,
    // which makes the server delete it.
    assert_eq!(
        bounded("the refused session ends", session.lost()).await,
        SessionState::Lost
    );

    let boss = Client::new(ZooKeeper::new(ensemble.connect_string()).with_digest("boss", BOSS_PASSWORD));
    let owner = boss.session_with(options()).await.expect("session");
    let granted = bounded(
        "the owner is granted while the refused session lives on",
        owner.mutex("createonly").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    granted.release().await.expect("release");
    owner.close().await.expect("close");
    session.close().await.expect("close");
}

/// Under `Creator`, `bob` holds a lock of his own, then meets alice's lock:
/// `contenders()` is allowed (world READ), `try_lock` and a `lock_timeout`
/// cancelled while its create is in flight are refused and made nothing.
/// None of that may end bob's session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_another_identitys_lock_leave_the_session_live() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let alice = creator(&ensemble, "alice", ALICE_PASSWORD);
    let alice_session = alice.session_with(options()).await.expect("session");
    let hers = alice_session
        .mutex("theirs")
        .expect("mutex")
        .lock()
        .await
        .expect("lock");

    let bob = creator(&ensemble, "bob", BOB_PASSWORD);
    let session = bob.session_with(options()).await.expect("session");
    let his = session.mutex("mine").expect("mutex").lock().await.expect("lock");
    let theirs = session.mutex("theirs").expect("mutex");
    let listed = theirs.contenders().await.expect("contenders");
    assert_eq!(listed.len(), 1, "{listed:?}");
    let tried = theirs.try_lock().await;
    assert!(matches!(&tried, Err(Error::PermissionDenied { .. })), "{tried:?}");
    let timed = theirs.lock_timeout(Duration::ZERO).await;
    assert!(timed.is_err(), "{timed:?}");
    bounded("background work ends", session.flush()).await;
    assert_eq!(session.state(), SessionState::Live, "{:?}", bob.stats());
    assert!(his.is_held());
    assert!(hers.is_held());
    his.release().await.expect("release");
    hers.release().await.expect("release");
    session.close().await.expect("close");
    alice_session.close().await.expect("close");
}
