//! `Etcd::with_namespace`: every key lockline writes lives under a prefix,
//! as with Go's `clientv3/namespace`. Services sharing a cluster keep apart,
//! other clients see the full keys, and one role grant on the prefix covers
//! everything a lock needs (its entries and the markers of abandoned
//! attempts).

use std::time::Duration;

use lockline::{Client, Error};
use lockline_etcd::etcd_client::{self, Permission};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, LineChild};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_keep_services_apart_and_other_clients_see_full_keys() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let billing = Client::new(Etcd::new(cluster.endpoints()).with_namespace("billing/"));
    let search = Client::new(Etcd::new(cluster.endpoints()).with_namespace("search/"));
    let (b, s) = (
        billing.session().await.expect("session"),
        search.session().await.expect("session"),
    );
    // One name, two namespaces: two locks.
    let held = b.mutex("jobs/nightly").expect("mutex").lock().await.expect("lock");
    let other = s
        .mutex("jobs/nightly")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    let other = other.expect("another namespace's lock of the same name is free");
    assert!(
        held.key().starts_with(&format!("billing/jobs/nightly/{}", b.id())),
        "{}",
        held.key()
    );
    assert!(other.key().starts_with("search/jobs/nightly/"), "{}", other.key());
    // The keys are etcd's own: a plain client finds them where they say.
    let mut plain = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    let found = plain.get(held.key(), None).await.expect("get");
    assert_eq!(found.kvs().len(), 1, "the reported key is the etcd key");
    let queue = b.queue("jobs/nightly").await.expect("queue");
    assert_eq!(queue.iter().map(|c| c.key.as_str()).collect::<Vec<_>>(), [held.key()]);
    // Fenced writes and reads take keys within the namespace, as Go's
    // namespaced KV does.
    held.write_if_held([lockline::Write::put("state/last-run", "42")])
        .await
        .expect("fenced write");
    assert_eq!(b.read("state/last-run").await.expect("read"), Some(b"42".to_vec()));
    assert_eq!(
        s.read("state/last-run").await.expect("read"),
        None,
        "another namespace's key"
    );
    let raw = plain.get("billing/state/last-run", None).await.expect("get");
    assert_eq!(raw.kvs().first().map(|kv| kv.value().to_vec()), Some(b"42".to_vec()));
    held.release().await.expect("release");
    other.release().await.expect("release");

    // etcdctl on the full name queues with lockline on the namespaced one.
    let mut command = cluster.etcdctl(&cluster.endpoints());
    command
        .args(["lock", "billing/jobs/weekly"])
        .stderr(std::process::Stdio::null());
    let mut etcdctl = LineChild::spawn(command).expect("start etcdctl");
    let key = etcdctl.line(Duration::from_secs(10)).expect("etcdctl holds the lock");
    assert!(key.starts_with("billing/jobs/weekly/"), "{key}");
    let weekly = b.mutex("jobs/weekly").expect("mutex");
    assert!(
        weekly.try_lock().await.expect("try_lock").is_none(),
        "etcdctl's lock was ignored"
    );
    assert!(
        s.mutex("jobs/weekly")
            .expect("mutex")
            .try_lock()
            .await
            .expect("try_lock")
            .is_some(),
        "another namespace is not blocked by it"
    );
    etcdctl.signal_and_wait(libc::SIGINT).expect("etcdctl exits");
    let guard = weekly.lock().await.expect("lockline takes it after etcdctl");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_grant_on_the_namespace_is_enough() {
    const ROOT: &str = "root-password";
    const TEAM: &str = "team-password";
    let cluster = EtcdCluster::start().expect("start etcd");
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("connect");
    admin.user_add("root", ROOT, None).await.expect("root");
    admin.role_add("root").await.expect("root role");
    admin.user_grant_role("root", "root").await.expect("grant root");
    admin.role_add("team-rw").await.expect("role");
    admin
        .role_grant_permission("team-rw", Permission::read_write("team/").with_prefix())
        .await
        .expect("grant");
    admin.user_add("team", TEAM, None).await.expect("user");
    admin.user_grant_role("team", "team-rw").await.expect("grant role");
    admin.auth_enable().await.expect("enable auth");

    // Without the namespace, a marker prefix outside `team/` is not granted.
    let outside = Client::new(
        Etcd::new(cluster.endpoints())
            .with_user("team", TEAM)
            .with_marker_prefix(lockline_etcd::MARKER_PREFIX),
    );
    let session = outside.session().await.expect("session");
    match session.mutex("team/jobs").expect("mutex").lock().await {
        Err(Error::PermissionDenied { .. }) => {}
        other => panic!("the markers' prefix is not granted, expected PermissionDenied, got {other:?}"),
    }
    // With it, locks and markers (moved or not) are all under `team/`.
    let inside = Client::new(
        Etcd::new(cluster.endpoints())
            .with_user("team", TEAM)
            .with_namespace("team/")
            .with_marker_prefix(lockline_etcd::MARKER_PREFIX),
    );
    let session = inside.session().await.expect("session");
    let mutex = session.mutex("jobs").expect("mutex");
    let guard = mutex.lock().await.expect("lock under the granted prefix");
    assert!(guard.key().starts_with("team/jobs/"), "{}", guard.key());
    assert!(mutex.try_lock().await.expect("try_lock").is_none());
    guard.release().await.expect("release");
    session.close().await.expect("close");
}

/// The shape check of fenced-write keys sees the key as the server stores
/// it: under the namespace `billing/`, the key `cafe` is `billing/cafe`, a
/// holder's shape for the lock `billing` of the whole cluster, and is
/// refused (found by review: it was written and blocked that lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespaced_write_cannot_fake_a_holder_outside_the_namespace() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let billing = Client::new(Etcd::new(cluster.endpoints()).with_namespace("billing/"));
    let session = billing.session().await.expect("session");
    let guard = session.mutex("jobs").expect("mutex").lock().await.expect("lock");
    match guard.write_if_held([lockline::Write::put("cafe", "x")]).await {
        Err(Error::InvalidName { name, .. }) => assert_eq!(name, "cafe"),
        other => panic!("a key stored as a holder of `billing` must be refused, got {other:?}"),
    }
    guard
        .write_if_held([lockline::Write::put("state", "x")])
        .await
        .expect("an ordinary key is written");
    guard.release().await.expect("release");
    let plain = Client::new(Etcd::new(cluster.endpoints()))
        .session()
        .await
        .expect("session");
    let free = plain
        .mutex("billing")
        .expect("mutex")
        .try_lock()
        .await
        .expect("try_lock");
    assert!(free.is_some(), "the lock `billing` outside the namespace is free");
}
