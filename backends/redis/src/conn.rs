//! One command connection over a single node or a cluster.
//!
//! On a single node the session keeps its own connection (not the client
//! library's connection manager), for two reasons:
//!
//! - A connection that stops answering is *replaced*: a request unanswered
//!   within its bound gives the connection up ([`Conn::replace`]), and the
//!   next request opens a new one. The library's manager re-connects only
//!   when a connection breaks, so a connection that a middlebox silently
//!   forgot (a NAT, a load balancer) would be kept, and every renewal sent
//!   on it lost, until the session is lost (DESIGN rule 18).
//! - Each connection learns, before anything else is sent on it, the epoch
//!   of the server at its other end: the `run_id` of its process and its
//!   replication id (`master_replid`), from `INFO`. A connection reaches one
//!   process for its whole life (a restarted server closes every
//!   connection), so an append sent on it can tell its script which epoch
//!   it runs in, and the script can tell whether the lock's counter was
//!   last incremented in another one, which may have lost its latest
//!   increments (see `APPEND` in the scripts).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// The session's command connection: the current connection to one node
/// (re-made after it broke or stopped answering), or the cluster client,
/// which routes each script to the node of its hash tag.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(Arc<Single>),
    Cluster(ClusterConnection),
}

/// The connection to one node, made when first needed and again after it
/// was given up.
pub(crate) struct Single {
    client: redis::Client,
    config: redis::AsyncConnectionConfig,
    connect_timeout: Duration,
    current: std::sync::Mutex<Option<Link>>,
    /// Held while a connection is being made, so that requests waiting for
    /// one share it.
    connecting: tokio::sync::Mutex<()>,
    made: AtomicU64,
    /// Whether the server's refusal of `INFO` was logged already.
    warned: std::sync::atomic::AtomicBool,
}

/// One connection, cheap to clone: what a request is sent on.
#[derive(Clone)]
pub(crate) enum Link {
    Single {
        conn: MultiplexedConnection,
        /// The epoch of the server at the other end: `<run_id>:<master_replid>`.
        epoch: Arc<str>,
        /// Which connection of the session this is, from 1.
        number: u64,
    },
    Cluster(ClusterConnection),
}

impl Link {
    /// The epoch of the server this connection reaches (see [`epoch_of`]);
    /// empty on a cluster (the script reads it where it runs).
    pub(crate) fn epoch(&self) -> &str {
        match self {
            Link::Single { epoch, .. } => epoch,
            Link::Cluster(_) => "",
        }
    }
}

/// The epoch sent when the server refused `INFO`: the append script then
/// neither lifts the counter nor records an epoch.
pub(crate) const UNKNOWN_EPOCH: &str = "-";

/// The epoch of a server, from its `INFO`: `<run_id>:<master_replid>`.
/// The `run_id` is new with every process, so every restart changes it;
/// the replication id is new with every promotion and full resync, so a
/// process that took a replica's data (demoted, resynced, promoted again)
/// is in another epoch too. `None` without a `run_id`.
pub(crate) fn epoch_of(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or_default()
    };
    let run_id = field("run_id");
    (!run_id.is_empty()).then(|| format!("{run_id}:{}", field("master_replid")))
}

/// Whether a request's failure says its connection is of no more use: it
/// broke, or it did not answer in time (a connection silently forgotten by
/// a middlebox answers nothing, ever).
pub(crate) fn is_broken(error: &RedisError) -> bool {
    error.is_timeout() || error.is_io_error() || error.is_connection_dropped() || error.is_unrecoverable_error()
}

impl Conn {
    /// A single node's connection; the first one is made at once.
    ///
    /// # Errors
    ///
    /// When the server cannot be reached, refuses the credentials, or does
    /// not answer within `connect_timeout`.
    pub(crate) async fn single(
        client: redis::Client,
        connect_timeout: Duration,
        request_timeout: Duration,
    ) -> RedisResult<Conn> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(request_timeout));
        let single = Arc::new(Single {
            client,
            config,
            connect_timeout,
            current: std::sync::Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            made: AtomicU64::new(0),
            warned: std::sync::atomic::AtomicBool::new(false),
        });
        let conn = Conn::Single(single);
        conn.link().await?;
        Ok(conn)
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// The connection to send a request on: the current one, or a new one
    /// (made within the connect timeout) when there is none.
    ///
    /// # Errors
    ///
    /// When no connection could be made.
    pub(crate) async fn link(&self) -> RedisResult<Link> {
        let single = match self {
            Conn::Cluster(conn) => return Ok(Link::Cluster(conn.clone())),
            Conn::Single(single) => single,
        };
        if let Some(link) = single.current() {
            return Ok(link);
        }
        let _connecting = single.connecting.lock().await;
        if let Some(link) = single.current() {
            return Ok(link);
        }
        let connect = async {
            let mut conn = single
                .client
                .get_multiplexed_async_connection_with_config(&single.config)
                .await?;
            // Before anything else on this connection: which process answers.
            let epoch = match redis::cmd("INFO").query_async::<String>(&mut conn).await {
                Ok(info) => epoch_of(&info)
                    .ok_or_else(|| RedisError::from((redis::ErrorKind::UnexpectedReturnType, "INFO gave no run_id")))?,
                // Refused (an ACL without `info`, which `-@dangerous` takes
                // away; a renamed command): the epoch is unknown, and the
                // counters are only started from the clock when missing.
                Err(error) if matches!(error.kind(), redis::ErrorKind::Server(_)) => {
                    if !single.warned.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            %error,
                            "the Redis server refused INFO: fencing tokens may repeat after a restart that \
                             lost its last writes (allow the user `+info` to rule that out)"
                        );
                    }
                    UNKNOWN_EPOCH.to_owned()
                }
                Err(error) => return Err(error),
            };
            RedisResult::Ok((conn, Arc::<str>::from(epoch)))
        };
        let (conn, epoch) = match tokio::time::timeout(single.connect_timeout, connect).await {
            Ok(made) => made?,
            Err(elapsed) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed).into()),
        };
        let link = Link::Single {
            conn,
            epoch,
            number: single.made.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *single.slot() = Some(link.clone());
        Ok(link)
    }

    /// Gives up `link` if it is still the current connection: the next
    /// request makes a new one. Requests still in flight on it end with
    /// their own timeouts, and the connection closes with the last of them.
    pub(crate) fn replace(&self, link: &Link) {
        let (Conn::Single(single), Link::Single { number, .. }) = (self, link) else {
            return;
        };
        let mut slot = single.slot();
        if matches!(&*slot, Some(Link::Single { number: current, .. }) if current == number) {
            tracing::debug!(
                connection = number,
                "command connection given up; the next request makes a new one"
            );
            *slot = None;
        }
    }

    /// Gives up `link` when `error` says it broke or went unanswered.
    pub(crate) fn replace_if_broken(&self, link: &Link, error: &RedisError) {
        if is_broken(error) {
            self.replace(link);
        }
    }
}

impl Single {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Link>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> Option<Link> {
        self.slot().clone()
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single { conn, .. } => conn.req_packed_command(cmd),
            Link::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single { conn, .. } => conn.req_packed_commands(pipeline, offset, count),
            Link::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single { conn, .. } => conn.get_db(),
            Link::Cluster(conn) => conn.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::epoch_of;

    #[test]
    fn the_epoch_is_the_run_id_and_the_replication_id() {
        let info = "# Server\r\nredis_version:7.0.15\r\nrun_id:6b64ecf6\r\ntcp_port:6379\r\n\r\n# Replication\r\nrole:master\r\nmaster_replid:9f3e21aa\r\nmaster_replid2:0000\r\n";
        assert_eq!(epoch_of(info).as_deref(), Some("6b64ecf6:9f3e21aa"));
        // No replication section (an old server): the run id alone.
        assert_eq!(epoch_of("run_id:abc\r\n").as_deref(), Some("abc:"));
        assert_eq!(epoch_of("redis_version:7.0.15\r\n"), None);
        // `master_replid2` is not taken for `master_replid`.
        assert_eq!(
            epoch_of("run_id:r\r\nmaster_replid2:x\r\nmaster_replid:y\r\n").as_deref(),
            Some("r:y")
        );
    }
}
