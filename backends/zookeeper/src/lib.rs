//! The ZooKeeper backend of [lockline](https://docs.rs/lockline): distributed
//! locks and leader election over a ZooKeeper ensemble you already run.
//!
//! ```no_run
//! use lockline_zookeeper::{lockline::Client, ZooKeeper};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let client = Client::new(ZooKeeper::new("127.0.0.1:2181,127.0.0.1:2182/apps"));
//! let session = client.session().await?; // one ZooKeeper session
//! let guard = session.mutex("billing/nightly")?.lock().await?; // the path /apps/billing/nightly
//! println!("held as {} with fencing token {}", guard.key(), guard.token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! # How it uses ZooKeeper
//!
//! - **Session** = one ZooKeeper session; its timeout is
//!   [`SessionOptions::ttl`](lockline::SessionOptions::ttl) (the server clamps it
//!   to its `minSessionTimeout`..`maxSessionTimeout`). `Disconnected` makes the
//!   lockline session `Suspended`; the same session reconnecting makes it `Live`
//!   again; expiry, or no reconnection within the negotiated timeout less the
//!   safety margin, makes it `Lost`. Closing it, or dropping every handle,
//!   closes the ZooKeeper session and so deletes its nodes at once.
//! - **Layout** = Curator's: a lock named `n` is the directory `/n` (a container
//!   node, created on first use and deleted by the server once empty) holding
//!   ephemeral-sequential `_c_<attempt>-lock-<sequence>` nodes. kazoo's and
//!   ZooKeeper's own recipe's contenders in the same directory are recognised and
//!   queued with lockline's by sequence number. A connect string may end in a
//!   chroot (`host:port/apps`).
//! - **Acquire** = create the node, list the directory (two round trips when
//!   uncontended). **Wait** = an exists-watch on the node just before mine
//!   (one watch); when it fires, list once more. **Release** = delete my node,
//!   whose path is unique to this acquire, so it can never delete a newer
//!   holder's. **Fencing token** = the node's `czxid` (the sequence number is not
//!   used: it restarts when the directory is recreated).
//! - A create whose answer is lost is retried by looking for the attempt's id in
//!   the directory (owned by this session) before creating again: never a
//!   duplicate.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod error;
mod layout;
mod session;

use std::sync::Arc;

use async_trait::async_trait;
use lockline::{Backend, BackendSession, Error, Result, SessionOptions};

pub use lockline;
pub use zookeeper_client;

use crate::session::ZkSession;

/// The ZooKeeper backend: hand it to [`lockline::Client::new`].
///
/// Each lockline session opens its own ZooKeeper session (and connection) to
/// the connect string's servers. An unreachable ensemble gives
/// [`Error::Unavailable`] within the session options' connect timeout.
#[derive(Debug, Clone)]
pub struct ZooKeeper {
    connect: String,
}

impl ZooKeeper {
    /// A backend for the ensemble in this connect string: `host:port[,host:port...][/chroot]`.
    pub fn new(connect: impl Into<String>) -> Self {
        ZooKeeper {
            connect: connect.into(),
        }
    }
}

#[async_trait]
impl Backend for ZooKeeper {
    fn name(&self) -> &'static str {
        error::BACKEND
    }

    /// ZooKeeper reserves `/zookeeper`, and no ZooKeeper path ends in `/`.
    ///
    /// A trailing `/` (etcd's Go examples name locks `/my-lock/`) is refused
    /// rather than dropped: Curator and kazoo refuse such a path too, and on
    /// etcd `/my-lock/` and `/my-lock` are two different locks, so quietly
    /// mapping both to `/my-lock` here would make one program's two locks one.
    fn validate_name(&self, name: &str) -> Result<()> {
        let first = name.trim_start_matches('/').split('/').next().unwrap_or_default();
        if first == "zookeeper" {
            return Err(Error::InvalidName {
                name: name.to_owned(),
                reason: "ZooKeeper reserves the /zookeeper subtree".into(),
            });
        }
        if name.ends_with('/') {
            return Err(Error::InvalidName {
                name: name.to_owned(),
                reason: format!(
                    "a ZooKeeper path cannot end in '/' (Curator and kazoo refuse it too); name the lock {:?}",
                    name.trim_end_matches('/')
                ),
            });
        }
        Ok(())
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        let session: Arc<dyn BackendSession> = ZkSession::open(&self.connect, options).await?;
        Ok(session)
    }
}

/// The ZooKeeper session id and password behind a lockline session opened on
/// this backend, to attach to it from another connection (as a test that
/// forces expiry does). `None` for another backend's session or a closed one.
pub fn session_info(session: &lockline::Session) -> Option<zookeeper_client::SessionInfo> {
    let remote: &dyn std::any::Any = &**session.backend_session();
    remote.downcast_ref::<ZkSession>().and_then(ZkSession::session_info)
}
