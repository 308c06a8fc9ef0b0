//! etcd-specific behaviour: failover, lease revocation, unreachable and
//! vanishing servers, and scale on one session.
//!
//! One test binary, a module per family: `cluster` (failover, unreachable,
//! vanished and isolated members, scale on one session), `session_loss`
//! (revoked leases, failing keepalives, silent partitions, a server down),
//! `appends` (late and shared keys, each session's request timeout),
//! `releases` (a release tried again after a cut-off first try),
//! `lock_delay` (real departures, and a predecessor gone before the watch).

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued, suspend_and_revive, until, ExclusionWorkload};
use lockline::{Client, Error, SessionOptions, SessionState};
use lockline_etcd::Etcd;
use lockline_testkit::{free_port, EtcdCluster, TcpProxy};

mod appends;
mod cluster;
mod lock_delay;
mod releases;
mod session_loss;

fn options(ttl_secs: u64) -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(ttl_secs))
}

async fn revoke(cluster: &EtcdCluster, session: &lockline::Session) {
    let lease = i64::from_str_radix(session.id(), 16).expect("hex lease id");
    let mut side = lockline_etcd::etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("side client");
    side.lease_revoke(lease).await.expect("revoke");
}

/// A proxy in front of member 0 of `cluster`, a client whose every request
/// goes through it, and a session of that client with `options`.
async fn through_a_proxy(cluster: &EtcdCluster, options: SessionOptions) -> (TcpProxy, Client, lockline::Session) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", cluster.client_port(0))).expect("proxy");
    let client = Client::new(Etcd::new([format!("http://{}", proxy.address())]));
    let session = client.session_with(options).await.expect("session");
    (proxy, client, session)
}

/// A single-node etcd, and [`through_a_proxy`] to it.
async fn one_node_through_a_proxy(options: SessionOptions) -> (EtcdCluster, TcpProxy, Client, lockline::Session) {
    let cluster = EtcdCluster::start().expect("start etcd");
    let (proxy, client, session) = through_a_proxy(&cluster, options).await;
    (cluster, proxy, client, session)
}

/// What a timed waiter's task answers: when it was granted, and its guard.
type Granted = tokio::task::JoinHandle<(Instant, lockline::Result<lockline::MutexGuard>)>;

/// A waiter for `name` on a client of its own (one connection, straight to
/// `cluster`) and a session of that client, queued before this returns.
async fn timed_waiter(cluster: &EtcdCluster, name: &str) -> (lockline::Session, Granted) {
    let client = Client::new(Etcd::new(cluster.endpoints()));
    let session = client.session().await.expect("session");
    let mutex = session.mutex(name).expect("mutex");
    let waiter = spawn_queued(&client, async move {
        let guard = mutex.lock().await;
        (Instant::now(), guard)
    })
    .await;
    (session, waiter)
}
