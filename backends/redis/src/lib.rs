//! The Redis backend of [lockline](https://docs.rs/lockline): the same fair,
//! herd-free, fenced queue as on etcd and ZooKeeper, on one Redis node or a
//! Redis Cluster, behind the same `Client`/`Session`/`Mutex` API.
//!
//! ```no_run
//! use lockline_redis::{lockline::Client, Redis};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let client = Client::new(Redis::new("redis://127.0.0.1:6379"));
//! let session = client.session().await?; // renewed in the background
//! let guard = session.mutex("billing/nightly")?.lock().await?;
//! println!("held as {} with fencing token {}", guard.key(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it uses Redis
//!
//! Every key of lock `n` carries the hash tag `{n}`, so each step is one Lua
//! script on one slot, on a single node or a cluster alike:
//!
//! | key | type | what |
//! |---|---|---|
//! | `{n}:seq` | string | the lock's counter: order and fencing token of each entry (never deleted, so tokens keep growing; started from the server's clock in microseconds when missing, and lifted to it once in each new epoch of the server, so a counter lost with the data, or brought back without its latest increments, goes on above every earlier token) |
//! | `{n}:run` | string | the counter's epoch: `<run_id>:<master_replid>` of the server that last started or lifted it |
//! | `{n}:q` | sorted set | the queue: one member per entry (its attempt id), scored by its order |
//! | `{n}:e:<attempt>` | hash with a TTL | an entry: `kind`, `owner` (session id), `order`, `value`, `plain`; a lock-mode entry (`kind` = `lock mode`) also `changed` |
//! | `{n}:c:<attempt>` | channel | where the entry's release is published: its one waiter listens |
//! | `{n}:x:<attempt>` | string with a TTL | the tombstone of an acquire abandoned with its append in flight (a late append creates nothing) |
//! | `{n}:l:<attempt>` | string with a TTL of a minute | the mark of an entry that went with its owner's session (for lock-delay) |
//! | `{n}:joined` | channel | where election candidates' appends are published (for observers) |
//! | `{n}:b` | string | the lock value block of a lock-mode resource (never deleted, like the counter; not a member of the queue, so never an entry) |
//! | `n` | string with a TTL | the plain key a mutex holder owns, as `SET n … NX PX` would |
//! | `lockline:session:<id>` | string with a TTL | the session: while it exists the session lives |
//!
//! - **Session** = its key and every entry it owns, renewed together every
//!   keepalive interval: one pipelined round trip on a single node however
//!   many locks the session holds. An entry whose owner stopped renewing
//!   expires at its TTL and is reaped by whoever reads the queue next; no
//!   cleaner process is needed.
//! - **Acquire** = one script: the counter gives the order and token, the
//!   entry joins the queue, and the nearest earlier live entries come back
//!   with it; a retried append with the same attempt id finds its own entry.
//! - **Wait** = on exactly one predecessor: subscribe to its channel, then
//!   look at it once. Its release publishes once; a crashed predecessor is
//!   noticed at its TTL (one timer armed at its remaining TTL, re-armed if it
//!   was renewed). Messages lost while the pub/sub connection was down are
//!   covered by looking again when it is back.
//! - **Release** = one script: deletes the entry only if it is still that
//!   entry, gives up the plain key, publishes once. It also reads the
//!   queue's head: when that entry now holds by the exclusive rule (taking
//!   the plain key for a mutex), the message names it and the woken
//!   successor is granted without a read of its own.
//! - **Loss** = no renewal confirmed for `ttl - safety margin` (counted from
//!   the send time of the last confirmed one; `Suspended` while renewals
//!   fail), the session key gone (expired, or a server restarted without its
//!   data), or the entry gone. A failed renewal is tried again at once on a
//!   new connection, then every 100 ms at most: a restart (with its data) or
//!   a failover shorter than the loss deadline is ridden out, `Suspended`
//!   meanwhile, then `Live`; the pub/sub connection is made again as soon,
//!   and every waiter looks again at what it waits for.
//! - **Connections** = the command connection and the pub/sub connection,
//!   each proven alive within the loss deadline by a bounded round trip on
//!   it (a renewal; a `PING`), and replaced when one goes unanswered: a
//!   connection a NAT or a load balancer silently forgot costs a probe
//!   timeout and a keepalive interval, never the session or a frozen queue.
//! - **Lock-delay** ([`SessionOptions::with_lock_delay`](lockline::SessionOptions::with_lock_delay))
//!   = told by the message that woke the waiter: a release, a close or a
//!   cancelled acquire publishes `gone`; an entry removed by a session
//!   declared lost (or by another session), deleted under a holder whose
//!   plain key a foreign client took, or reaped after it expired publishes
//!   `lost` and leaves the mark `{n}:l:<attempt>` for a minute, which the
//!   waiter's one look at its predecessor after subscribing also reads (a
//!   message sent before it subscribed is not missed). A predecessor that
//!   expired with nobody reaping it is seen at the waiter's timer, at its
//!   TTL: the delay counts from then. A release sends what it sent
//!   without lock-delay; the waiter makes no request of its own.
//! - **Lock modes** ([`Resource`](lockline::Resource)) = entries of kind
//!   `lock mode` in the same queue, whose value (the core's encoding of
//!   mode, grant and conversion) the backend stores and never reads. A
//!   read of the resource (`read_queue`) is one script: every entry, first
//!   created first, with its value and `changed`, and the block `{n}:b`.
//!   An update (`update_queue`) is one script: it checks every entry it is
//!   conditioned on is still that entry (its order) at its version (or, for
//!   an entry it needs only present, at any version), takes
//!   the lock's counter's next number as its token (lifted in a new epoch
//!   as an append lifts it), sets values (of any session's entries: owner
//!   and TTL stay its owner's) with `changed` = the token, deletes, writes
//!   the block, and publishes `value` on each set entry's channel and
//!   `gone`/`lost` on each deleted one's: only the entries' own watchers
//!   wake. An entry's version *is* its `changed` (its order until first
//!   written): every write of a lock-mode entry, `set_value` included,
//!   takes a new number of the counter. A value watch subscribes to the
//!   entry's channel, then looks at its value and TTL in one script; an
//!   entry it sees go is told released or lost (for a lock-delay) by the
//!   message or the look, as for a wait.
//!   Peers' recipes (redis-py's `Lock`, a `SET NX PX` lock) never see
//!   lock-mode entries: they take no plain key.
//! - **Single-key interop** = a mutex contender at the head of the queue also
//!   takes the plain key `n` (`SET n <entry key> PX ttl`, only where `n` does
//!   not exist), renews it with the entry and deletes it on release.
//!   redis-py's `Lock` (tested both ways) and, by the commands they send, a
//!   `SET NX PX` lock with a Lua release (redsync and node-redlock on one
//!   node) and Redisson's `RLock` (a hash at `n`) therefore exclude lockline's
//!   holders and are excluded by them. A contender at the head
//!   waits while a foreign client owns `n`: on keyspace events for `n` when
//!   the server publishes them (`notify-keyspace-events` with `K` and `g`,
//!   `x` or `A`), otherwise at its TTL. Read/write locks, semaphores and
//!   elections do not take the plain key.
//!
//! Foreign clients of the plain key (redis-py's `Lock`, a `SET NX PX` lock
//! such as node-redlock's) publish nothing lockline reads: a lock-delayed
//! lockline waiter that waited on one cannot tell its release from its
//! expiry, and holds back for the delay either way, counted from when it
//! saw `n` go (a keyspace event, or its look at `n`'s TTL). A lockline
//! holder's entry deleted because a foreign client took its plain key counts
//! as lost too. Waiters without a lock-delay are not affected.
//!
//! # Limits
//!
//! Redis replicates asynchronously: a failover can lose the latest appends
//! and renewals, so two contenders may both believe they hold. Tokens do not
//! repeat across a restart, whatever `appendfsync` says: a counter lost
//! whole, or brought back without its latest increments (an append-only
//! file fsynced every second and a crash that lost the rest), starts again
//! from the server's clock, above every earlier token, as long as that
//! clock did not step back, and the Redis user is allowed `INFO` (which
//! tells a restart); after a failover the promoted replica's clock must be
//! ahead of them. [`Redis::with_replica_acks`]
//! narrows that window (every write waits for `WAIT` from N replicas) but
//! does not close it; fence what the lock protects with the token. For
//! locks whose correctness matters, use etcd or ZooKeeper.
//!
//! Names cannot hold `{` or `}` (they are the hash tag). On a Redis Cluster a
//! fenced write ([`write_if_held`](lockline::MutexGuard::write_if_held)) can
//! only touch keys in the lock's slot: keys that carry its hash tag, such as
//! `{n}/state`.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod conn;
mod error;
mod hub;
mod layout;
mod scripts;
mod session;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{Backend, BackendSession};
use lockline::{Error, Result, SessionOptions};
use tokio::time::Instant;

pub use lockline;

use crate::conn::Conn;
use crate::error::{map, timed_out, NAME};
use crate::hub::Hub;
use crate::session::{RedisSession, ReplicaAcks, Shared};

/// The Redis backend: a single node or a Redis Cluster.
///
/// ```
/// use lockline_redis::Redis;
/// use std::time::Duration;
///
/// let single = Redis::new("redis://127.0.0.1:6379");
/// let cluster = Redis::cluster(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"]);
/// // Every write waits for one replica's acknowledgement, for at most 100 ms.
/// let acked = Redis::new("redis://:secret@127.0.0.1:6379").with_replica_acks(1, Duration::from_millis(100));
/// ```
#[derive(Clone)]
pub struct Redis {
    urls: Vec<String>,
    cluster: bool,
    acks: Option<ReplicaAcks>,
}

impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redis")
            .field("urls", &self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>())
            .field("cluster", &self.cluster)
            .field("acks", &self.acks)
            .finish()
    }
}

/// A URL with its password (if any) replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((credentials, host)) => {
            let user = credentials.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

impl Redis {
    /// One Redis node, by URL: `redis://[[USER]:PASSWORD@]HOST:PORT[/DB]`, or
    /// `rediss://` for TLS. Nothing is connected until a session opens.
    pub fn new(url: impl Into<String>) -> Self {
        Redis {
            urls: vec![url.into()],
            cluster: false,
            acks: None,
        }
    }

    /// A Redis Cluster, by the URLs of some of its nodes.
    pub fn cluster<I, S>(urls: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Redis {
            urls: urls.into_iter().map(Into::into).collect(),
            cluster: true,
            acks: None,
        }
    }

    /// Confirms every write (appends, releases, renewals, fenced writes) only
    /// once `replicas` replicas acknowledged it (`WAIT replicas timeout`); a
    /// write acknowledged by fewer fails as unavailable. This narrows, and
    /// does not close, the window in which a failover loses a grant. Single
    /// node only: on a cluster, opening a session with it is refused.
    pub fn with_replica_acks(mut self, replicas: usize, timeout: Duration) -> Self {
        self.acks = Some(ReplicaAcks { replicas, timeout });
        self
    }

    fn target(&self) -> String {
        self.urls.iter().map(|u| redact(u)).collect::<Vec<_>>().join(",")
    }

    fn check(&self) -> Result<Vec<redis::ConnectionInfo>> {
        use redis::IntoConnectionInfo;
        if self.urls.is_empty() {
            return Err(Error::InvalidOptions {
                reason: "no Redis URL given".into(),
            });
        }
        if self.cluster && self.acks.is_some() {
            return Err(Error::InvalidOptions {
                reason: "replica acknowledgement (WAIT) is offered on a single Redis node only".into(),
            });
        }
        if self.acks.is_some_and(|a| a.replicas == 0) {
            return Err(Error::InvalidOptions {
                reason: "replica acknowledgement needs at least one replica".into(),
            });
        }
        self.urls
            .iter()
            .map(|url| {
                let bad = |why: String| Error::InvalidOptions {
                    reason: format!("invalid Redis URL {:?}: {why}", redact(url)),
                };
                if !(url.starts_with("redis://") || url.starts_with("rediss://") || url.starts_with("unix://")) {
                    return Err(bad("expected redis://HOST:PORT or rediss://HOST:PORT".into()));
                }
                if let Some(port) = url
                    .split_once("://")
                    .map(|(_, rest)| rest.rsplit_once('@').map_or(rest, |(_, host)| host))
                    .and_then(|host| host.split('/').next())
                    .and_then(|host| host.rsplit_once(':'))
                    .map(|(_, port)| port)
                {
                    if port.parse::<u16>().map_or(true, |p| p == 0) {
                        return Err(bad(format!("port {port:?} is not in 1..=65535")));
                    }
                }
                url.as_str().into_connection_info().map_err(|e| bad(e.to_string()))
            })
            .collect()
    }

    /// The command connection, and a client for each server the session's
    /// pub/sub connection may use (every node of a cluster; the one server
    /// otherwise).
    async fn connect(&self, options: &SessionOptions) -> Result<(Conn, Vec<redis::Client>)> {
        let infos = self.check()?;
        let target = self.target();
        let connect_timeout = options.connect_timeout();
        let request_timeout = options.request_timeout();
        let servers = if self.cluster { infos.len() } else { 1 };
        let pubsub = infos[..servers]
            .iter()
            .map(|info| redis::Client::open(info.clone()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| map("open", &target, e))?;
        let connect = async {
            if self.cluster {
                let client = redis::cluster::ClusterClientBuilder::new(infos)
                    .connection_timeout(connect_timeout)
                    .response_timeout(request_timeout)
                    .retries(2)
                    .build()?;
                client.get_async_connection().await.map(Conn::Cluster)
            } else {
                Conn::single(pubsub[0].clone(), connect_timeout, request_timeout).await
            }
        };
        match tokio::time::timeout(connect_timeout, connect).await {
            Ok(Ok(conn)) => Ok((conn, pubsub)),
            Ok(Err(error)) => Err(map("connect", &target, error)),
            Err(_) => Err(Error::unavailable(
                NAME,
                format!("no answer from {target} within the connect timeout {connect_timeout:?}"),
            )),
        }
    }
}

/// The keyspace-event channel prefix when the server publishes keyspace
/// events for deletions and expiries (`notify-keyspace-events` with `K` and
/// `A`, or `g` and `x`).
async fn keyspace_prefix(conn: &Conn, timeout: Duration) -> Option<String> {
    if conn.is_cluster() {
        // Keyspace events are local to each node; the session's one pub/sub
        // connection would miss most of them.
        return None;
    }
    let mut link = tokio::time::timeout(timeout, conn.link()).await.ok()?.ok()?;
    let mut get = redis::cmd("CONFIG");
    get.arg("GET").arg("notify-keyspace-events");
    let reply = tokio::time::timeout(timeout, get.query_async::<Vec<String>>(&mut link))
        .await
        .ok()?
        .ok()?;
    let flags = reply.get(1)?;
    let events = flags.contains('A') || (flags.contains('g') && flags.contains('x'));
    (flags.contains('K') && events).then(|| format!("__keyspace@{}__:", redis::aio::ConnectionLike::get_db(&link)))
}

#[async_trait::async_trait]
impl Backend for Redis {
    fn name(&self) -> &'static str {
        NAME
    }

    fn describe(&self) -> String {
        self.target()
    }

    fn validate_name(&self, name: &str) -> Result<()> {
        layout::validate_name(name)
    }

    fn validate_write_key(&self, key: &str) -> Result<()> {
        if layout::is_layout_key(key) {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: "the key has the shape of a lock's own keys ({NAME}:q, :seq, :e:…) in the Redis layout".into(),
            });
        }
        Ok(())
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        options.validate()?;
        let target = self.target();
        let (conn, pubsub) = self.connect(options).await?;
        let id = uuid_hex();
        let opened_at = Instant::now();
        let mut set = redis::cmd("SET");
        set.arg(layout::session_key(&id))
            .arg("")
            .arg("PX")
            .arg(u64::try_from(options.ttl().as_millis()).unwrap_or(u64::MAX))
            .arg("NX");
        let opened = async {
            let mut link = conn.link().await?;
            set.query_async::<Option<String>>(&mut link).await
        };
        match tokio::time::timeout(options.connect_timeout(), opened).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(map("open a session", &target, error)),
            Err(_) => return Err(timed_out("open a session", &target, options.connect_timeout())),
        }
        let keyspace = keyspace_prefix(&conn, options.request_timeout()).await;
        let hub = Hub::new(
            pubsub,
            target.clone(),
            options.request_timeout(),
            options.keepalive_interval(),
            session::probe_timeout(options),
        );
        let shared = Shared::new(id, conn, target, Arc::clone(&hub), options.clone(), keyspace, self.acks);
        let hub_task = tokio::spawn(hub.run()).abort_handle();
        let keepalive = tokio::spawn(Arc::clone(&shared).keep_alive(opened_at)).abort_handle();
        Ok(Arc::new(RedisSession::new(shared, vec![hub_task, keepalive])))
    }
}

fn uuid_hex() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
