//! The etcd backend of [lockline](https://docs.rs/lockline): distributed locks
//! and leader election over an etcd cluster you already run.
//!
//! ```no_run
//! use lockline_etcd::{lockline::Client, Etcd};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let client = Client::new(Etcd::new(["http://127.0.0.1:2379"]));
//! let session = client.session().await?; // one lease, kept alive in the background
//! let guard = session.mutex("billing/nightly")?.lock().await?;
//! println!("held as {} with fencing token {}", guard.key(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it uses etcd
//!
//! - **Session** = one lease (TTL from [`SessionOptions`],
//!   rounded up to whole seconds) renewed by one keepalive stream, and one watch
//!   stream that multiplexes every watch of the session. Closing the session
//!   revokes the lease; dropping every handle stops the renewals, so the lease
//!   expires after its TTL.
//! - **Layout** = Go's `concurrency` package: a mutex named `n` is the prefix
//!   `n/` and a session's entry is `n/<lease id in lowercase hex>`, ordered by
//!   create revision. `etcdctl lock n`, Go's `concurrency.Mutex` and etcd's
//!   server-side lock API exclude lockline's holders and vice versa. A key is
//!   an entry of `n` only as `n/<lease hex>` or `n/{read,write,semaphore}/<lease
//!   hex>-<attempt>`: the keys of nested locks (`n/read`, `n/x`) are ignored,
//!   so lockline names may nest and contain any recipe word (Go's mutex `n`
//!   still counts every key under `n/`).
//!   A trailing `/` is kept, as in Go's examples: `/my-lock/` is the prefix
//!   `/my-lock//`, the keys of `concurrency.NewMutex(s, "/my-lock/")`.
//! - **Acquire** = one transaction: create my key if it does not exist and read
//!   the first-created key under the prefix (one round trip when uncontended).
//! - **Wait** = a watch on the key with the greatest create revision below mine,
//!   opened at the current revision, then one read to confirm that key still
//!   exists; on its DELETE, one transaction confirms my key and reads the next
//!   predecessor.
//! - **Release** = `Txn(If CreateRevision(my key) == my revision, Then Delete)`,
//!   never a bare delete, so a stale guard cannot delete a newer holder's key.
//! - **Fencing token** = the holder key's create revision. A Go holder's
//!   matching number is the `CreateRevision` of its key (a `Get` of
//!   `m.Key()`), not `m.Header().Revision` (`etcdctl lock`'s `ETCD_LOCK_REV`),
//!   which is higher whenever the Go holder had to wait.
//! - **Loss** = a keepalive answered with TTL ≤ 0, no renewal confirmed for
//!   `ttl - safety margin` (counted from the send time of the last renewal the
//!   server answered), or the key deleted by someone else. A renewal
//!   unanswered for a keepalive interval makes the session `Suspended` first.
//!   A lost session stops renewing and revokes its lease as soon as the server
//!   answers.
//! - **Cancellation** = an acquire cancelled with an append in flight leaves
//!   a marker `__lockline_abandoned__/<lease hex>-<attempt>` bound to the lease;
//!   the append's transaction requires it absent, so an append that reaches
//!   the server late creates nothing.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod error;
mod layout;
mod session;
mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lockline::{Backend, BackendSession, Error, Result, SessionOptions};
use tokio::sync::OnceCell;

pub use etcd_client;
pub use lockline;

use crate::error::BACKEND;
use crate::session::EtcdSession;

/// The etcd backend: hand it to [`lockline::Client::new`].
///
/// Connects lazily, on the first session, to the given endpoints (several for a
/// cluster: requests go to whichever answers). Connect and request deadlines
/// and HTTP/2 keepalive come from each session's [`SessionOptions`]: sessions
/// whose options agree share one connection, a session with other timeouts
/// gets its own. An unreachable cluster gives [`Error::Unavailable`] within the
/// connect timeout, never a hang.
///
/// Every request asks for a member that has a leader (etcd's
/// `WithRequireLeader`): a member cut off from the rest of the cluster fails
/// requests and ends watches with "no leader" instead of serving them in
/// silence, so waiters move to a healthy member.
#[derive(Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    connect: Option<etcd_client::ConnectOptions>,
    /// Clients by the connection settings taken from session options
    /// (`None`: the caller's own connect options or client, for every session).
    clients: Arc<Mutex<Clients>>,
}

/// One lazily connected client per connection setting.
type Clients = HashMap<Option<Connection>, Arc<OnceCell<etcd_client::Client>>>;

/// The session options a connection is built from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Connection {
    connect_timeout: Duration,
    request_timeout: Duration,
    keepalive_interval: Duration,
}

impl Connection {
    fn of(options: &SessionOptions) -> Self {
        Connection {
            connect_timeout: options.connect_timeout(),
            request_timeout: options.request_timeout(),
            keepalive_interval: options.keepalive_interval(),
        }
    }

    fn options(self) -> etcd_client::ConnectOptions {
        etcd_client::ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(self.request_timeout)
            .with_keep_alive(self.keepalive_interval, self.request_timeout)
            .with_keep_alive_while_idle(true)
            .with_require_leader(true)
    }
}

impl fmt::Debug for Etcd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Etcd").field("endpoints", &self.endpoints).finish()
    }
}

impl Etcd {
    /// A backend for the cluster at these endpoints (`http://host:2379`).
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Etcd {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            connect: None,
            clients: Arc::default(),
        }
    }

    /// Uses these connect options (TLS, user and password, HTTP/2 keepalive)
    /// for every session instead of lockline's defaults, which follow each
    /// session's options. Require-leader is turned on in them.
    pub fn with_connect_options(mut self, options: etcd_client::ConnectOptions) -> Self {
        self.connect = Some(options.with_require_leader(true));
        self
    }

    /// A backend over a client you already have, for every session. Build it
    /// with `ConnectOptions::with_require_leader(true)` so that waits on a
    /// member cut off from its cluster end instead of hanging.
    pub fn from_client(client: etcd_client::Client) -> Self {
        let clients = HashMap::from([(None, Arc::new(OnceCell::new_with(Some(client))))]);
        Etcd {
            endpoints: Vec::new(),
            connect: None,
            clients: Arc::new(Mutex::new(clients)),
        }
    }

    async fn client(&self, options: &SessionOptions) -> Result<etcd_client::Client> {
        let cell = {
            let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            let key = match clients.get(&None) {
                Some(_) => None,
                None if self.connect.is_some() => None,
                None => Some(Connection::of(options)),
            };
            Arc::clone(clients.entry(key).or_default())
        };
        let client = cell
            .get_or_try_init(|| async {
                if self.endpoints.is_empty() {
                    return Err(Error::InvalidOptions {
                        reason: "no etcd endpoint given".into(),
                    });
                }
                let connect = self
                    .connect
                    .clone()
                    .unwrap_or_else(|| Connection::of(options).options());
                etcd_client::Client::connect(&self.endpoints, Some(connect))
                    .await
                    .map_err(|e| error::map(e, None))
            })
            .await?;
        Ok(client.clone())
    }
}

#[async_trait]
impl Backend for Etcd {
    fn name(&self) -> &'static str {
        BACKEND
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        let client = self.client(options).await?;
        let session: Arc<dyn BackendSession> = EtcdSession::open(client, options).await?;
        Ok(session)
    }
}

/// Watch events received so far by a session opened on this backend (for
/// benchmarks that count wakeups on the wire). `None` for another backend's session.
pub fn watch_events(session: &lockline::Session) -> Option<u64> {
    let remote: &dyn std::any::Any = &**session.backend_session();
    remote.downcast_ref::<EtcdSession>().map(EtcdSession::watch_events)
}
