//! Helpers shared by the etcd backend's tests: clients of a test cluster, a
//! side client that looks at and tampers with what the backend wrote, and
//! the steps of a contender (a session, a lock, a queued waiter).
#![allow(dead_code)]

use std::time::Instant;

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, MutexGuard, Result, Session, SessionOptions};
use lockline_etcd::{etcd_client, Etcd};
use lockline_testkit::EtcdCluster;
use tokio::task::JoinHandle;

/// A lockline client of the whole cluster.
pub fn new_client(cluster: &EtcdCluster) -> Client {
    Client::new(Etcd::new(cluster.endpoints()))
}

/// A plain etcd client, for looking at what the backend wrote and for
/// acting behind its back.
pub async fn side(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client")
}

/// The server's current revision.
pub async fn revision(side: &mut etcd_client::Client) -> i64 {
    side.get("revision-probe", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision()
}

/// Revokes the session's lease from another client: an involuntary loss.
pub async fn revoke(side: &mut etcd_client::Client, session: &Session) {
    let lease = i64::from_str_radix(session.id(), 16).expect("hex lease id");
    side.lease_revoke(lease).await.expect("revoke");
}

/// [`revoke`] from a side client of its own.
pub async fn revoke_from(cluster: &EtcdCluster, session: &Session) {
    revoke(&mut side(cluster).await, session).await;
}

/// A session of `client`, opened within the conformance suite's bound.
pub async fn session(client: &Client, options: SessionOptions) -> Session {
    bounded("open a session", client.session_with(options))
        .await
        .expect("session")
}

/// The mutex `name`, locked on `session`.
pub async fn lock(session: &Session, name: &str) -> MutexGuard {
    bounded("lock", session.mutex(name).expect("mutex").lock())
        .await
        .expect("lock")
}

/// A waiter for the mutex `name` on `session` (of `client`), returned once
/// it is queued.
pub async fn queue(client: &Client, session: &Session, name: &str) -> JoinHandle<Result<MutexGuard>> {
    let mutex = session.mutex(name).expect("mutex");
    spawn_queued(client, async move { mutex.lock().await }).await
}

/// [`queue`], the waiter also telling when it was granted.
pub async fn queue_timed(client: &Client, session: &Session, name: &str) -> JoinHandle<(Instant, Result<MutexGuard>)> {
    let mutex = session.mutex(name).expect("mutex");
    spawn_queued(client, async move {
        let granted = mutex.lock().await;
        (Instant::now(), granted)
    })
    .await
}
