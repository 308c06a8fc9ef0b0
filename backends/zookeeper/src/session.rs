//! A ZooKeeper session: one `zookeeper_client::Client`, its state tracked.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lockline::backend::{
    advance, AppendRequest, Appended, BackendSession, Conflicts, Departure, Earlier, Entry, EntryKind, Queue,
    QueueUpdate, Slot, Wanted, WAITING_EX,
};
use lockline::{Error, FencingToken, Result, SessionOptions, SessionState, Write};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use zookeeper_client::{
    Acl, Acls, AuthId, Client, CreateMode, Error as ZkError, EventType, MultiReadResult, MultiWriteError,
    MultiWriteResult, OneshotWatcher, Permission, SessionState as ZkState, Stat, WatchedEvent,
};

use crate::error::{denied, map};
use crate::layout::{self, Contender};
use crate::{AclPolicy, ZooKeeper};

mod append;
mod close;
mod departure;
mod fenced;
mod listing;
mod liveness;
mod modes;
mod open;
mod release;
mod value;
mod wait;

use departure::Wake;
use liveness::Liveness;
use modes::QueueMemo;

/// A lockline session on ZooKeeper.
pub(crate) struct ZkSession {
    id: String,
    /// `None` once closed or lost; every call clones it (cheap) for its
    /// duration. Dropping the last clone ends the ZooKeeper session: the
    /// client sends `closeSession` as soon as it reaches a server.
    client: Arc<StdMutex<Option<Client>>>,
    state: watch::Sender<SessionState>,
    liveness: Arc<Liveness>,
    tracker: AbortHandle,
    /// Appends that may have created a node without our knowing it: a retry
    /// looks for the attempt's node before creating one. An attempt leaves the
    /// set only once its append has fully succeeded, or it is abandoned.
    uncertain: StdMutex<HashSet<String>>,
    /// How the session was opened, to close it from a second connection
    /// when it is given up.
    backend: crate::ZooKeeper,
    /// The session's id and password, kept after the client is let go (a
    /// lost session), so that `close` can still end it on the server.
    info: zookeeper_client::SessionInfo,
    options: SessionOptions,
    /// Attempts whose create the server refused (an ACL): they made no node,
    /// so abandoning them needs no look at a directory this session may not
    /// be allowed to read.
    refused: StdMutex<HashSet<String>>,
    /// The ACL of the nodes this session creates (see [`AclPolicy`]).
    acls: Vec<Acl>,
    /// This session's nodes that an append made and nothing has removed
    /// yet: `close()` hands them over with the release mark before it ends
    /// the session (see [`release_node`](ZkSession::release_node)).
    held: StdMutex<HashSet<String>>,
    /// How the recent waits on other contenders' nodes ended, by path: what
    /// [`departure`](BackendSession::departure) answers from. Kept only when
    /// the session has a lock-delay, and only for `wake_memory`.
    wakes: StdMutex<HashMap<String, Wake>>,
    /// How long a wake by the release mark counts as one (see
    /// [`ZkSession::departure`]): [`WAKE_MEMORY`](departure::WAKE_MEMORY), or
    /// half the negotiated session timeout when that is shorter.
    wake_memory: Duration,
    /// What this session last saw of lock-mode resources' directories, by
    /// path: the next `read_queue` reads those children's data in the same
    /// request as the listing (see [`QueueMemo`]). At most
    /// [`QUEUE_MEMO_MAX`](modes::QUEUE_MEMO_MAX) directories.
    queues: StdMutex<HashMap<String, QueueMemo>>,
    /// Counts this session's writes to lock directories, each once when it
    /// begins and once when it ends (or is dropped): a queue kept for a
    /// later read (see [`ZkSession::take_fresh`]) serves only while the
    /// count has not moved since its read was sent.
    writes: AtomicU64,
}

/// A write of this session to a lock directory under way (see
/// `ZkSession::writes`): counted when made and when dropped.
struct Writing<'a>(&'a AtomicU64);

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl fmt::Debug for ZkSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkSession")
            .field("id", &self.id)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Drop for ZkSession {
    fn drop(&mut self) {
        self.tracker.abort();
    }
}

/// The most bytes of values (and paths) one request may carry: ZooKeeper
/// drops the connection of a client whose packet exceeds its
/// `jute.maxbuffer` (1 MiB less one byte by default), which would look like
/// a network failure and be retried for ever. Room is left for the rest of
/// the packet.
const MAX_REQUEST_BYTES: usize = 1_000_000;

/// What one operation of a `multi` adds on the wire beside its path and data
/// (its header, lengths, version or flags), rounded up.
const MULTI_OP_OVERHEAD: usize = 32;

/// What one ACL of a created node adds on the wire beside its scheme and id
/// (permissions and lengths), rounded up.
const ACL_BYTES: usize = 16;

/// Refuses a request of `size` bytes that the server would not take.
fn fits(size: usize, key: &str) -> Result<()> {
    if size > MAX_REQUEST_BYTES {
        return Err(Error::InvalidOptions {
            reason: format!(
                "cannot write {key:?}: the request is too large for the server ({size} bytes; ZooKeeper takes \
                 up to about {MAX_REQUEST_BYTES} with its default jute.maxbuffer)"
            ),
        });
    }
    Ok(())
}

/// A backend error that says which path the server refused, and why.
fn on_path(error: Error, operation: &str, path: &str) -> Error {
    match error {
        Error::Backend {
            backend,
            reason,
            source,
        } => Error::Backend {
            backend,
            reason: format!("{operation} {path:?}: {reason}"),
            source,
        },
        other => other,
    }
}

fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ZkSession {
    /// The ZooKeeper session's id and password (to attach to it from elsewhere).
    pub(crate) fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        lock(&self.client).as_ref().map(|c| c.session().clone())
    }

    fn client(&self) -> Result<Client> {
        self.check_deadline()?;
        lock(&self.client).clone().ok_or_else(|| {
            let session = self.id.clone();
            match *self.state.borrow() {
                SessionState::Lost => Error::SessionLost { session },
                _ => Error::Closed { session },
            }
        })
    }

    fn err(&self, error: ZkError) -> Error {
        let mapped = map(error, &self.id);
        // A request that failed for want of an answer once the deadline has
        // passed failed on a lost session.
        if mapped.is_transient() && self.check_deadline().is_err() {
            return Error::SessionLost {
                session: self.id.clone(),
            };
        }
        self.noted(mapped)
    }

    /// As [`err`](Self::err) for a write that was sent and may have been
    /// applied: a transient error stays one (`Unavailable` says the batch may
    /// have landed), whatever the deadline.
    fn err_sent(&self, error: ZkError, path: &str) -> Error {
        on_path(self.noted(map(error, &self.id)), "write", path)
    }

    /// Marks the session lost when the server said it is.
    fn noted(&self, mapped: Error) -> Error {
        match mapped {
            Error::SessionLost { .. } => self.mark_lost("the server expired the session"),
            Error::AuthenticationFailed { .. } => self.mark_lost("the server rejected the session's credentials"),
            _ => {}
        }
        mapped
    }

    /// As [`err`](Self::err), with an ACL refusal named by what was refused.
    fn err_on(&self, error: ZkError, operation: &'static str, path: &str) -> Error {
        match error {
            ZkError::NoAuth => denied(operation, path),
            other => on_path(self.err(other), operation, path),
        }
    }

    /// Counts a write of this session to a lock directory, now and when the
    /// returned guard is dropped: a kept queue read before either never
    /// answers a read after it (see [`take_fresh`](Self::take_fresh)).
    fn writing(&self) -> Writing<'_> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        Writing(&self.writes)
    }
}

/// The directory of an entry: its key less the node name.
fn dir_of(key: &str) -> &str {
    key.rfind('/').map_or(key, |at| &key[..at])
}

#[async_trait]
impl BackendSession for ZkSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// One round trip: create the node, and list the directory right behind
    /// it (two when the directory must be created first).
    ///
    /// Exactly one node per attempt, whatever step fails: the attempt stays
    /// "uncertain" until the append has fully succeeded, and a retry of an
    /// uncertain attempt looks for its node (by the attempt id in its name)
    /// before creating one; a failed look-up fails the retry, never creates.
    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        // The whole queue (or none) for a lock-mode entry, never a window.
        self.append_node(&request.without_window()).await
    }

    /// One round trip: list the directory; my node must be among the children.
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        self.earlier_entries(entry, conflicts, count).await
    }

    /// Two round trips whatever the queue length: list the directory, then
    /// read every contender's stat (token, owner) in one multi-read.
    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        self.list_entries(dir).await
    }

    /// A children watch on the directory (or an exists-watch while it is
    /// missing) until a contender appears.
    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        self.wait_for_contender(dir).await
    }

    /// One round trip: an exists-watch on the node (which also tells whether
    /// it is still there), then its event.
    ///
    /// On this session's own node (the watch a holder keeps), only its
    /// deletion ends the wait: a change of its data (an election's proclaim,
    /// a lock-delay mark) is watched past, and so it is on an election
    /// candidate's node (released without the mark). On another contender's
    /// node, a change of its data ends the wait too: a release changes the node's
    /// data and deletes it in one transaction (see `release_node`), and the
    /// one-shot watch hears only the change; the core's read after the wait
    /// then finds the node gone, or waits on it again when it is still
    /// there (a proclaim, a mark). With a lock-delay, how the wait ended is
    /// remembered for [`departure`](BackendSession::departure).
    ///
    /// A watch request that fails for want of a connection is sent again
    /// once the client has reconnected (the session's own tracking ends the
    /// wait if it is lost meanwhile), so that a wait ends only by what
    /// happened to the node, and `departure` can say how it went.
    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        self.wait_node_gone(entry).await
    }

    /// An election candidate's node is released without the mark (see
    /// `release_node`), so a candidate after it takes a resignation for a
    /// loss and is held back for its lock-delay.
    ///
    /// Released when the wait on `gone` was ended by the release mark (its
    /// data changed, and the read right after found it gone: both in one
    /// transaction, as only a release does) within the last `wake_memory`;
    /// lost when its deletion alone ended the wait (its session expired or
    /// was closed without handing it over), or when the read came later
    /// than that.
    ///
    /// Why a late read is a loss: a node's data changes for other reasons
    /// too (an election's proclaim, a lock-delay mark), and the node may be
    /// lost after such a change and before the waiter's read. Only the
    /// node's own session changes its data, which resets that session's
    /// expiry, so the session cannot expire within its timeout of the
    /// change; a read within `wake_memory` (at most a second, at most half
    /// this session's timeout) cannot have seen such an expiry unless the
    /// holder's session timeout is that short, or an administrator ended the
    /// session from elsewhere in that instant.
    ///
    /// A node already gone when the wait set its watch is taken as released:
    /// it went within the round trip between the read that named it and the
    /// watch, and ZooKeeper keeps no trace of how. A lockline holder cut off
    /// from the server declares its loss a safety margin before the server
    /// expires it, so a loss landing in that round trip is also one whose
    /// holder has already stopped.
    fn departure(&self, gone: &Entry) -> Departure {
        self.departure_of(gone)
    }

    /// Deletes the very node, with the release mark (see `release_node`):
    /// its path carries a unique attempt id and sequence, so no newer node
    /// can have it.
    async fn remove(&self, entry: &Entry) -> Result<bool> {
        self.remove_node(entry).await
    }

    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        self.abandon_attempt(dir, kind, attempt).await
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        self.set_node_value(entry, value).await
    }

    /// One `multi` that begins with a `check` (version -1: exists) of the
    /// entry's node, then creates, sets and deletes. Which of create or set a
    /// put needs, and whether a delete has anything to delete, is read just
    /// before in one multi-read; a node that appears or vanishes in between
    /// fails the `multi` (nothing applied) and the whole write is tried again.
    /// A put whose parent is missing creates the missing parents (persistent,
    /// empty, with the session's ACL policy) and tries again: parents are
    /// made outside the fence, as Curator's `creatingParentsIfNeeded` and
    /// kazoo's `ensure_path` make them; the write itself is fenced.
    async fn write_if_held(&self, entry: &Entry, writes: &[Write]) -> Result<bool> {
        self.write_fenced(entry, writes).await
    }

    async fn read(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.read_key(key).await
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        self.get_node_value(entry).await
    }

    /// A data watch on the node (`getData`), then its event: `None` on
    /// `NodeDeleted`; on `NodeDataChanged` the node is read again (and
    /// watched again if its data is back to `seen`).
    ///
    /// On another session's lock-mode node, the read after a change is a
    /// multi-read of the whole queue, in the same one round trip (unless
    /// the value seen is a request that waits for EX and was never granted,
    /// whose first change leaves it blocking: see
    /// [`watch_value_until`](Self::watch_value_until)): a release
    /// marks the node and deletes it in one transaction (see
    /// `release_node`), so that read finds it gone, and the queue it read is
    /// kept for the `read_queue` the core makes next (which then sends
    /// nothing). A handoff thus costs the event, one multi-read and the
    /// update, and with a lock-delay the wait remembers how the node went for
    /// [`departure`](BackendSession::departure): released when the read
    /// after its data changed found it gone (or when it was gone already at
    /// the first read, as `wait_gone` takes it), lost on `NodeDeleted`.
    ///
    /// The edge, on the side of a release: another session marked the
    /// node (a waiter telling the holder it blocks) and the holder was lost
    /// within the round trip after that mark; the read then finds the node
    /// gone after a change, as after a release.
    ///
    /// A request that fails for want of a connection is sent again once the
    /// client has reconnected (the session's own tracking ends the wait if
    /// it is lost meanwhile), as `wait_gone` does: the wait ends only by
    /// what happened to the node, and a node found gone after such a retry
    /// counts as lost.
    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        self.watch_node_value(entry, seen, &|_| true).await
    }

    /// As [`watch_value`](Self::watch_value), keeping one watch: a value
    /// not wanted is watched past with the read that set the watch again.
    /// A change of a request that waits for EX and was never granted (the
    /// value seen begins with [`WAITING_EX`]) is read with that one
    /// `getData`, not the multi-read of the queue: its first change leaves
    /// it blocking.
    async fn watch_value_until(&self, entry: &Entry, seen: &[u8], wanted: &Wanted) -> Result<Option<Vec<u8>>> {
        self.watch_node_value(entry, seen, wanted).await
    }

    /// One round trip when the contenders are those this session last saw
    /// under the name (by its last `read_queue`, or the listing of its
    /// append there), two otherwise: a multi-read of the directory's
    /// children, the value block (`<dir>/lockline-value-block`) and the data
    /// and stat of every child it expects. The answer is one snapshot (the
    /// server runs a multi-read between writes); it is used only if every
    /// contender the listing shows had its data read in it, else the read is
    /// sent again with the names just listed. A child gone since the
    /// listing the guess came from simply reads as missing.
    ///
    /// `version` is the node's data version, `changed` its `mzxid`, the
    /// entry's token its `czxid` and its owner the ephemeral owner.
    async fn read_queue(&self, dir: &str) -> Result<Queue> {
        self.read_dlm_queue(dir).await
    }

    /// One round trip: one `multi` of a version check on every entry named
    /// (`check` or `setData` with the version read; version -1, "exists",
    /// for an entry in `present`; a deleted entry is released as
    /// `release_node` does, its data set to the release mark at that version,
    /// then deleted), then the value block's `setData` (with a `create`
    /// before it at its first write). All its operations share the
    /// transaction's zxid, which is the token: the `mzxid` of its first
    /// `setData`. An update of checks alone creates, sets and deletes the
    /// stamp node `<dir>/lockline-stamp` in the same `multi`, for a `setData`
    /// stat (ZooKeeper answers a check without one, and some servers answer
    /// a create inside a `multi` without its stat).
    ///
    /// A failed check, set or delete (the node is gone, or at another
    /// version) fails the whole `multi`: `Ok(None)`, nothing written. An
    /// entry is identified by its path, which carries its attempt id and
    /// sequence number: a node deleted and made again under the same path
    /// would need the same attempt to get the same sequence number in a
    /// directory made anew, which lockline never does. Whether the block's
    /// node exists is guessed from the last read; a wrong guess fails the
    /// `multi` at the block's operation and it is sent again with the other.
    async fn update_queue(&self, update: &QueueUpdate<'_>) -> Result<Option<u64>> {
        self.update_dlm_queue(update).await
    }

    /// Asks the server: one request that needs a live session. Past the loss
    /// deadline the session is lost whatever the answer would be.
    async fn confirm(&self) -> Result<SessionState> {
        self.confirm_with_server().await
    }

    /// Drops the client, which closes the ZooKeeper session: the server
    /// deletes its ephemeral nodes whatever their ACLs.
    ///
    /// A copy of the client held by a request still in flight (a future of
    /// the session parked unpolled mid-request) would keep the session open,
    /// so it is also closed from a second connection.
    fn give_up(&self, why: &str) {
        self.give_up_session(why)
    }

    async fn close(&self) -> Result<()> {
        self.close_session().await
    }
}
