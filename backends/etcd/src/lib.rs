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
//!   server-side lock API exclude lockline's holders and vice versa. As with Go,
//!   a name that is a path prefix of another (`a` and `a/b`) shares its keys:
//!   do not nest lock names. A trailing `/` is kept, as in Go's examples:
//!   `/my-lock/` is the prefix `/my-lock//`, the keys of
//!   `concurrency.NewMutex(s, "/my-lock/")`.
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
//!   `ttl - safety margin`, or the key deleted by someone else.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod error;
mod layout;
mod session;
mod watch;

use std::fmt;
use std::sync::Arc;

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
/// come from each session's [`SessionOptions`]: an unreachable cluster gives
/// [`Error::Unavailable`] within the connect timeout, never a hang.
#[derive(Clone)]
pub struct Etcd {
    endpoints: Vec<String>,
    connect: Option<etcd_client::ConnectOptions>,
    client: Arc<OnceCell<etcd_client::Client>>,
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
            client: Arc::default(),
        }
    }

    /// Uses these connect options (TLS, user and password, HTTP/2 keepalive)
    /// instead of lockline's defaults.
    pub fn with_connect_options(mut self, options: etcd_client::ConnectOptions) -> Self {
        self.connect = Some(options);
        self
    }

    /// A backend over a client you already have.
    pub fn from_client(client: etcd_client::Client) -> Self {
        Etcd {
            endpoints: Vec::new(),
            connect: None,
            client: Arc::new(OnceCell::new_with(Some(client))),
        }
    }

    async fn client(&self, options: &SessionOptions) -> Result<etcd_client::Client> {
        let client = self
            .client
            .get_or_try_init(|| async {
                if self.endpoints.is_empty() {
                    return Err(Error::InvalidOptions {
                        reason: "no etcd endpoint given".into(),
                    });
                }
                let connect = self.connect.clone().unwrap_or_else(|| {
                    etcd_client::ConnectOptions::new()
                        .with_connect_timeout(options.connect_timeout())
                        .with_timeout(options.request_timeout())
                        .with_keep_alive(options.keepalive_interval(), options.request_timeout())
                        .with_keep_alive_while_idle(true)
                });
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
