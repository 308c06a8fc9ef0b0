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
//! - **Acquire** = create the node and list the directory, the listing sent
//!   right behind the create (one round trip when uncontended). **Wait** = a
//!   data watch (`getData`, as Curator's waiter sets) on the node just before
//!   mine, and an exists-watch on my own node, set once and kept by the hold
//!   once granted (it tells a waiter or a holder at once that someone deleted
//!   its node: Curator sets no such watch); when the first fires, list once
//!   more. **Release** = one `multi`
//!   that sets my node's data and deletes it (the release mark, below; an
//!   election candidate's node is just deleted); the
//!   node's path is unique to this acquire, so it can never delete a newer
//!   holder's. **Fencing token** = the node's `czxid` (the sequence number is not
//!   used: it restarts when the directory is recreated).
//! - A create whose answer is lost is retried by looking for the attempt's id in
//!   the directory (owned by this session) before creating again: never a
//!   duplicate.
//! - **Lock modes** (a `Resource`): `_c_<attempt>-dlm-<sequence>` nodes with
//!   the core's state as data, and the lock value block in the reserved
//!   child `lockline-value-block`. Reading the queue is one multi-read of
//!   the children, the block and every child's data and stat (two when a
//!   contender this session had not seen queued); a conditional update is
//!   one `multi` of version checks, writes and deletes whose zxid is the
//!   token. See `docs/zookeeper.md`, "Lock modes".
//!
//! # Lock-delay: a release and a loss
//!
//! With [`SessionOptions::with_lock_delay`](lockline::SessionOptions::with_lock_delay),
//! a waiter next in line after a holder whose node went with its session is
//! held back for the delay; after a release it is granted at once. ZooKeeper
//! deletes the nodes of an expired session and of a closed one alike, and a
//! watch event names no cause, so lockline's release marks itself: the
//! release's one `multi` sets the node's data (to nothing) and deletes it, in
//! one transaction. The waiter's one-shot watch fires on the data
//! change; the directory listing it makes next anyway finds the node gone:
//! released. A node deleted by its session's end fires `NodeDeleted`: lost,
//! and the delay counts from when the waiter heard of it (the server's
//! removal, after the session timeout for a holder cut off or killed).
//! `close()` hands over the same way: it deletes the session's nodes with the
//! mark, all requests at once, before it ends the ZooKeeper session. Nothing
//! new is on the handoff path (the same one request to release, the same
//! one event and one read to wake), and nothing is written outside the
//! holder's own node, whose ACL lockline sets itself. The edges, all on the
//! side of a loss (a delay) except the first two:
//! a node already gone when the waiter sets its watch (it went in the round
//! trip after the listing that named it) is taken as released, ZooKeeper
//! keeping no trace of how; a node whose data changed for another reason (an
//! election's proclaim, a lock-delay mark) and that was then lost before the
//! waiter's next read is taken as released when that read came within a
//! second (at most half the session timeout): the holder's own write reset
//! its session's expiry, so only a session timeout that short, or an
//! administrator ending the session from elsewhere in that instant, gives
//! that. A release heard while the waiter was disconnected, a watch that had
//! to be set again after a connection loss, and a read later than that
//! second are taken as losses.
//!
//! **Elections are left out.** An election candidate's node is deleted
//! plainly (at a resignation and at `close()` alike), because Curator's
//! `LeaderLatch` wakes only on `NodeDeleted`: a latch queued behind a lockline
//! candidate would miss the data change and wait for ever. A lock-delayed
//! candidate therefore takes every resignation before it for a loss.
//!
//! **Lock modes** release with the mark too (a release, the release
//! inside an update, a `close()`), and their waiters wait with a data watch
//! that reads the node again when it fires. That read is a multi-read of the
//! whole queue: a release shows as the node gone after a change, and the
//! read the waiter makes next is answered from that queue, so the mark costs
//! no request. One more edge, on the side of a release: another session's
//! mark on the node (a waiter telling the holder it blocks) followed by the
//! holder's loss within that read's round trip.
//!
//! **Other clients' releases look like losses.** Curator's and kazoo's
//! releases (and ZooKeeper's own lock recipe's) are plain deletes, without
//! the mark: a lockline waiter with a lock-delay behind one of their holders
//! is held back for the delay after each of their releases, exactly as after
//! a loss. They are not affected the other way: a Curator or kazoo waiter
//! behind a lockline holder is woken by the data change, looks at the
//! directory as it does after any event, and finds the node gone.
//!
//! # Secure ensembles
//!
//! TLS to the servers' `secureClientPort`, credentials, and ACLs on what
//! lockline creates:
//!
//! ```no_run
//! use lockline_zookeeper::lockline::{Client, Tls};
//! use lockline_zookeeper::{AclPolicy, ZooKeeper};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> lockline::Result<()> {
//! let tls = Tls::new()
//!     .with_ca_file("/etc/zookeeper/ca.pem")?
//!     .with_client_files("/etc/zookeeper/client.pem", "/etc/zookeeper/client-key.pem")?;
//! let backend = ZooKeeper::new("zk1.example.com:2281,zk2.example.com:2281/apps")
//!     .with_tls(tls)
//!     .with_digest("billing", std::env::var("ZK_PASSWORD").unwrap_or_default())
//!     .with_acl_policy(AclPolicy::Creator);
//! let session = Client::new(backend).session().await?;
//! let guard = session.mutex("billing/nightly")?.lock().await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! - **TLS** ([`ZooKeeper::with_tls`]): every server in the connect string is
//!   reached over TLS; its certificate must chain to the given CA and name the
//!   host (or IP address) as written in the connect string. The client
//!   certificate is sent when the server asks (`ssl.clientAuth=need|want`).
//! - **Credentials**: [`ZooKeeper::with_digest`] sends `addauth digest
//!   user:password` on every connection (the identity
//!   `digest:user:base64(sha1(user:password))`, as kazoo and Curator make it);
//!   [`ZooKeeper::with_sasl_digest_md5`] logs in with SASL DIGEST-MD5 (the
//!   identity `sasl:user`). Both may be set; the session then has both
//!   identities.
//! - **ACLs** ([`AclPolicy`]) on every node lockline creates: contender nodes,
//!   lock directories and their missing parents. Nodes that exist already
//!   keep their ACLs; lockline never sets an ACL on an existing node.
//!
//! | policy | contender node | directories lockline creates |
//! |---|---|---|
//! | [`AclPolicy::Open`] (default) | `world:anyone` ALL | `world:anyone` ALL |
//! | [`AclPolicy::Creator`] | ALL for `digest:USER:HASH` and `sasl:USER` (the credentials set on the backend), `world:anyone` READ | the same |
//!
//! What ZooKeeper checks decides what these guarantee: creating a node needs
//! CREATE on its parent, **deleting a node needs DELETE on its parent** (the
//! node's own ACL is not consulted), reading data or listing children needs
//! READ on the node, `setData` needs WRITE on the node, and `exists` is never
//! checked. So with one directory shared by several contenders, whoever may
//! delete their own node may delete everybody's: "only the creator may delete
//! its node" cannot be expressed. `Creator` therefore makes a lock directory
//! belong to one identity:
//!
//! - the identity that created the directory (every session authenticated
//!   as it: a service's replicas sharing one credential) can queue, release,
//!   and proclaim election values. Only the configured digest and SASL
//!   identities are named, never ZooKeeper's `auth` scheme, which would also
//!   grant the `x509:` identity the server gives a TLS client certificate:
//!   clients that share a certificate but not a credential stay apart;
//! - every other identity, and unauthenticated clients, can read the queue
//!   (who holds, the tokens, the election value) but cannot queue
//!   ([`Error::PermissionDenied`], operation `"queue on"`), cannot delete
//!   anyone's node, and cannot change a contender's data;
//! - within the owning identity nothing stops one session from deleting
//!   another's node (ZooKeeper cannot tell them apart); lockline itself only
//!   ever deletes the nodes of its own attempts.
//!
//! Limits: the directory is a container node, so the server removes it once
//! it is empty, and whichever identity next locks that name creates it anew
//! and owns it. A missing parent directory is created with the same ACL, so
//! other identities cannot create locks under it while it exists. For a
//! fixed owner or a fixed set of identities, create the directories (as
//! persistent nodes) with the ACL you want beforehand: lockline queues in
//! them under their ACL, with either policy. Use `Open` when Curator or kazoo
//! contenders under other identities must queue in the same directories.
//!
//! Which failure gives which error:
//!
//! | failure | error |
//! |---|---|
//! | the server's certificate does not chain to the CA, the server refuses or misses the client certificate, plain text against a TLS port, TLS against a plain port | [`Error::Unavailable`] within the connect timeout; its source says `TLS handshake with HOST:PORT failed: ...` or `HOST:PORT expects TLS ...` |
//! | PEM that does not parse, a TLS setting without a CA | [`Error::InvalidOptions`] when the session is opened |
//! | a SASL login the server rejects | [`Error::AuthenticationFailed`] when the session is opened; a session whose credentials are rejected later is lost |
//! | `AclPolicy::Creator` without credentials | [`Error::InvalidOptions`] when the session is opened |
//! | an ACL refuses a request (ZooKeeper `NoAuth`) | [`Error::PermissionDenied`] naming the operation (`"create"` a directory, `"queue on"` a directory, `"read"`, `"delete"`, `"write"`) and the path, at once, never retried; a refused acquire leaves no node |
//!
//! A digest `addauth` never fails: ZooKeeper accepts any user and password
//! and derives an identity from them. A wrong password is thus noticed only
//! when an ACL that grants the right identity refuses the wrong one
//! ([`Error::PermissionDenied`]).
//!
//! Passwords and private keys never appear in `Debug` output, in logs or in
//! error messages.

#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(rustdoc::broken_intra_doc_links)]

mod connect;
mod error;
mod layout;
mod session;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use lockline::backend::{Backend, BackendSession};
use lockline::{Error, Result, SessionOptions, Tls};

pub use lockline;
pub use zookeeper_client;

use crate::session::ZkSession;

/// The ZooKeeper backend: hand it to [`lockline::Client::new`].
///
/// Each lockline session opens its own ZooKeeper session (and connection) to
/// the connect string's servers. An unreachable ensemble gives
/// [`Error::Unavailable`] within the session options' connect timeout.
///
/// Its `Debug` output shows the connect string, whether TLS is on, the user
/// names and the ACL policy; never a password or a private key.
#[derive(Clone)]
pub struct ZooKeeper {
    connect: String,
    tls: Option<Tls>,
    digest: Option<Credentials>,
    sasl: Option<Credentials>,
    acl_policy: AclPolicy,
}

/// A user name and its password; only the name is ever shown.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl fmt::Debug for ZooKeeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeper")
            .field("connect", &self.connect)
            .field("tls", &self.tls.is_some())
            .field(
                "tls_client_certificate",
                &self.tls.as_ref().is_some_and(|tls| tls.client_pem().is_some()),
            )
            .field("digest_user", &self.digest.as_ref().map(|c| c.user.as_str()))
            .field("sasl_user", &self.sasl.as_ref().map(|c| c.user.as_str()))
            .field("acl_policy", &self.acl_policy)
            .finish()
    }
}

/// The ACLs lockline sets on the nodes it creates: contender nodes and lock
/// directories (and their missing parents). Nodes that already exist keep
/// theirs: lockline never changes an ACL.
///
/// See the crate docs' "Secure ensembles" section for the exact ACLs and what
/// each guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AclPolicy {
    /// `world:anyone` with every permission, on contender nodes and
    /// directories: what Curator and kazoo set by default, so mixed
    /// deployments keep queueing together. The default.
    #[default]
    Open,
    /// The configured identities (`digest:USER:HASH` for
    /// [`ZooKeeper::with_digest`], `sasl:USER` for
    /// [`ZooKeeper::with_sasl_digest_md5`]; not a TLS client certificate's
    /// `x509:` identity) get every permission, everyone else may only read, on contender nodes and on the directories lockline creates. A
    /// lock directory thereby belongs to the identity that created it, until
    /// the server removes it once empty. Needs credentials
    /// ([`ZooKeeper::with_digest`] or [`ZooKeeper::with_sasl_digest_md5`]).
    Creator,
}

impl ZooKeeper {
    /// Whether the connect string names a chroot other than `/`: below one,
    /// `zookeeper` is an ordinary name.
    fn has_chroot(&self) -> bool {
        connect::chroot(&self.connect).is_some_and(|chroot| chroot != "/")
    }

    /// A backend for the ensemble in this connect string: `host:port[,host:port...][/chroot]`.
    pub fn new(connect: impl Into<String>) -> Self {
        ZooKeeper {
            connect: connect.into(),
            tls: None,
            digest: None,
            sasl: None,
            acl_policy: AclPolicy::Open,
        }
    }

    /// Connects over TLS (to the servers' `secureClientPort`), verifying each
    /// server's certificate against the CA in `tls` and its host name or IP
    /// address against the certificate; presents the client certificate in
    /// `tls` if it has one (for servers with `ssl.clientAuth=need`).
    ///
    /// A CA is required. PEM that does not parse is refused with
    /// [`Error::InvalidOptions`] when a session is opened. A handshake that
    /// fails (an untrusted server, a refused or missing client certificate, a
    /// plain-text port) gives [`Error::Unavailable`] whose source names the
    /// server and says TLS.
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates every connection with ZooKeeper's `digest` scheme
    /// (`addauth digest user:password`), as kazoo's `auth_data` and Curator's
    /// `authorization("digest", ...)` do.
    ///
    /// ZooKeeper accepts any digest credentials: a wrong password is not an
    /// error by itself, it makes another identity, which ACLs granting the
    /// right one then refuse ([`Error::PermissionDenied`]).
    pub fn with_digest(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.digest = Some(Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Logs every connection in with SASL DIGEST-MD5 (a server with
    /// `SASLAuthenticationProvider` and a JAAS `Server` section). The identity
    /// is `sasl:<user>`. A login the server rejects gives
    /// [`Error::AuthenticationFailed`] when the session is opened.
    pub fn with_sasl_digest_md5(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.sasl = Some(Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// The ACLs to set on the nodes lockline creates (default [`AclPolicy::Open`]).
    pub fn with_acl_policy(mut self, policy: AclPolicy) -> Self {
        self.acl_policy = policy;
        self
    }

    /// Refuses settings that cannot work together.
    fn validate(&self) -> Result<()> {
        if let Some(problem) = connect_problem(&self.connect) {
            return Err(Error::InvalidOptions {
                reason: format!("ZooKeeper connect string {:?}: {problem}", self.connect),
            });
        }
        if self.acl_policy == AclPolicy::Creator && self.digest.is_none() && self.sasl.is_none() {
            return Err(Error::InvalidOptions {
                reason: "AclPolicy::Creator grants the creating identity, but no credentials are configured: \
                         add ZooKeeper::with_digest or ZooKeeper::with_sasl_digest_md5"
                    .into(),
            });
        }
        Ok(())
    }
}

/// What is wrong with a connect string (`host:port[,host:port...][/chroot]`),
/// checked before any connection.
fn connect_problem(connect: &str) -> Option<String> {
    if connect.starts_with("http://")
        || connect.starts_with("https://")
        || connect.contains(",http://")
        || connect.contains(",https://")
    {
        return Some(
            "this looks like an etcd URL; a ZooKeeper connect string is HOST:PORT[,HOST:PORT...][/CHROOT]".into(),
        );
    }
    let servers = connect::servers(connect);
    if servers.iter().all(String::is_empty) {
        return Some("no server; a ZooKeeper connect string is HOST:PORT[,HOST:PORT...][/CHROOT]".into());
    }
    for server in &servers {
        let Some((host, port)) = server.rsplit_once(':') else {
            return Some(format!("{server:?} has no port (ZooKeeper listens on 2181)"));
        };
        if host.is_empty() {
            return Some(format!("{server:?} has no host"));
        }
        match port.parse::<u16>() {
            Ok(port) if port > 0 => {}
            _ => return Some(format!("{port:?} is not a port number (1 to 65535)")),
        }
    }
    None
}

#[async_trait]
impl Backend for ZooKeeper {
    fn name(&self) -> &'static str {
        error::BACKEND
    }

    fn describe(&self) -> String {
        self.connect.clone()
    }
    /// ZooKeeper reserves `/zookeeper` (below a chroot `zookeeper` is an
    /// ordinary name), and no ZooKeeper path ends in `/`.
    ///
    /// A trailing `/` (etcd's Go examples name locks `/my-lock/`) is refused
    /// rather than dropped: Curator and kazoo refuse such a path too, and on
    /// etcd `/my-lock/` and `/my-lock` are two different locks, so quietly
    /// mapping both to `/my-lock` here would make one program's two locks one.
    ///
    /// A segment named like a node lockline reserves inside a lock's
    /// directory (`lockline-value-block`, `lockline-stamp`: see the layout
    /// in `docs/zookeeper.md`) is refused: `a/lockline-value-block` would be
    /// the value block of the resource `a`.
    /// The path's name: without its leading `/`s, which the path of a
    /// lock's directory adds (`layout::dir_path`).
    fn stored_name<'n>(&self, name: &'n str) -> std::borrow::Cow<'n, str> {
        std::borrow::Cow::Borrowed(name.trim_start_matches('/'))
    }

    fn validate_name(&self, name: &str) -> Result<()> {
        let first = name.trim_start_matches('/').split('/').next().unwrap_or_default();
        if first == "zookeeper" && !self.has_chroot() {
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
        if let Some(segment) = name.split('/').find(|segment| layout::reserved(segment)) {
            return Err(Error::InvalidName {
                name: name.to_owned(),
                reason: format!(
                    "{segment:?} is a node name lockline reserves inside a lock's directory (a lock-mode \
                     resource's value block)"
                ),
            });
        }
        Ok(())
    }

    /// A key is an absolute ZooKeeper path under the connect string's
    /// chroot: it begins with `/`, is not `/` itself, has no trailing `/`,
    /// no empty, `.` or `..` segment, no character ZooKeeper refuses, and
    /// is not under `/zookeeper`.
    fn validate_key(&self, key: &str) -> Result<()> {
        let invalid = |reason: &str| {
            Err(Error::InvalidName {
                name: key.to_owned(),
                reason: reason.to_owned(),
            })
        };
        let Some(body) = key.strip_prefix('/') else {
            return invalid("a ZooKeeper path must be absolute (begin with '/')");
        };
        if body.is_empty() {
            return invalid("the root node '/' cannot be written");
        }
        if body.ends_with('/') {
            return invalid("a ZooKeeper path cannot end in '/'");
        }
        for segment in body.split('/') {
            match segment {
                "" => return invalid("the path has an empty segment ('//')"),
                "." | ".." => return invalid("the path has a '.' or '..' segment"),
                _ => {}
            }
        }
        if let Some(bad) = key.chars().find(|&c| {
            c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(&c) || ('\u{fff0}'..='\u{ffff}').contains(&c)
        }) {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: format!("the path contains the character {bad:?}, which ZooKeeper cannot store"),
            });
        }
        if body.split('/').next() == Some("zookeeper") && !self.has_chroot() {
            return invalid("ZooKeeper reserves the /zookeeper subtree");
        }
        Ok(())
    }

    /// Refuses a fenced write to a node (or a parent it would create) named
    /// like a lock contender: it would stand in its parent path's lock
    /// queue as a holder nobody releases. A node named like one lockline
    /// reserves inside a lock's directory (a lock-mode resource's value
    /// block) is refused too.
    fn validate_write_key(&self, key: &str) -> Result<()> {
        let body = key.trim_start_matches('/');
        // A node (or a parent the write creates) named like a contender of
        // some client's recipe would stand in its parent lock's queue.
        if let Some(segment) = body.split('/').find(|segment| layout::parse(segment).is_some()) {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: format!(
                    "the node name {segment:?} has the shape of a lock contender (Curator's, kazoo's or \
                     ZooKeeper's lock recipe, or a semaphore's `leases`/`locks`): written, it would block \
                     the lock of its parent path; use another name"
                ),
            });
        }
        if let Some(segment) = body.split('/').find(|segment| layout::reserved(segment)) {
            return Err(Error::InvalidName {
                name: key.to_owned(),
                reason: format!(
                    "{segment:?} is a node name lockline reserves inside a lock's directory (a lock-mode \
                     resource's value block): written, it would replace that block"
                ),
            });
        }
        Ok(())
    }

    async fn open_session(&self, options: &SessionOptions) -> Result<Arc<dyn BackendSession>> {
        self.validate()?;
        let session: Arc<dyn BackendSession> = ZkSession::open(self, options).await?;
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
