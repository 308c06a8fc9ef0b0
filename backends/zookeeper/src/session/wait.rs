//! Waits on nodes: a directory watched until a contender appears, a node
//! until it goes, the watch asked for again across reconnections.

use super::release::marks;
use super::*;

/// The first pause before a failed watch request is sent again (or sooner,
/// once the client has reconnected), and its cap.
pub(super) const WATCH_RETRY_PAUSE: Duration = Duration::from_millis(50);
pub(super) const WATCH_RETRY_MAX_PAUSE: Duration = Duration::from_secs(1);

/// What a watch request found (see [`ZkSession::watch_existing`]).
enum Watched {
    /// The node is there; the watch is set.
    Set(OneshotWatcher),
    /// The node is gone. `across_reconnection`: the connection was lost
    /// and made again while the request was on its way (it was queued or
    /// sent again), so the node may have gone at any time since the read
    /// that named it.
    Gone { across_reconnection: bool },
}

/// A watch request in flight (see [`ZkSession::watch_existing`]).
type Watching<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = std::result::Result<Watched, (Error, Option<zookeeper_client::StateWatcher>)>>
            + Send
            + 'a,
    >,
>;

/// The event of an exists-watch on this session's own node (the watch a
/// waiter sets and hands on to its hold).
///
/// Dropped before its event, as every hold's wait is at its release (the
/// core stops watching, then releases), the watch is left to fire in a task
/// of its own rather than removed: the client library would otherwise send
/// `removeWatches` at the drop and, the release's own change firing the
/// watch on the server anyway, a second one for the event nobody waits for
/// any more; two requests per grant that nothing needs. The event is sure to
/// come: the node's own session changes or deletes it (a release, a
/// cancelled wait's cleanup), or the session ends, which ends every watch.
/// Without a runtime (dropped outside one) the watch is removed as before.
struct OwnWatch(Option<std::pin::Pin<Box<dyn std::future::Future<Output = WatchedEvent> + Send>>>);

impl OwnWatch {
    fn new(watcher: OneshotWatcher) -> Self {
        OwnWatch(Some(Box::pin(watcher.changed())))
    }
}

impl std::future::Future for OwnWatch {
    type Output = WatchedEvent;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<WatchedEvent> {
        let Some(changed) = self.0.as_mut() else {
            return std::task::Poll::Pending;
        };
        let event = std::task::ready!(changed.as_mut().poll(cx));
        self.0 = None;
        std::task::Poll::Ready(event)
    }
}

impl Drop for OwnWatch {
    fn drop(&mut self) {
        if let (Some(changed), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            drop(runtime.spawn(changed));
        }
    }
}

/// Resolves once the client has reconnected after a failed request, or
/// after `pause` at most. Boxed by a plain function, as `watch_existing`: the
/// wait every held lock keeps stays small.
pub(super) fn reconnected(
    state: Option<zookeeper_client::StateWatcher>,
    pause: Duration,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        let connected = async {
            match state {
                Some(mut state) => {
                    while !matches!(
                        state.changed().await,
                        ZkState::SyncConnected | ZkState::ConnectedReadOnly
                    ) {}
                }
                None => std::future::pending().await,
            }
        };
        let _ = tokio::time::timeout(pause, connected).await;
    })
}

impl ZkSession {
    /// A watch on `entry`'s node, or [`Watched::Gone`] when the node is gone; a failure
    /// comes with the client's state, to wait for a reconnection.
    ///
    /// On another contender's node (`own` false) a data watch (`getData`,
    /// as Curator's waiter sets): a node already gone sets no watch. An
    /// exists-watch on a missing node would stay on the server, waiting for
    /// a creation that never comes (the path is unique), so dropping it
    /// would cost a `removeWatches` request; at N = 2 the node is gone before
    /// the watch in about a third of the handoffs. A node this session may
    /// not read (another client's ACL) is refused with
    /// [`Error::PermissionDenied`]: the server delivers a watch's events
    /// only to a session that may read the node, so a wait on it would never
    /// end. An election candidate's node (its value may be large) gets an
    /// exists-watch, as does this session's own node, which is there all
    /// along (the watch a holder keeps).
    ///
    /// Boxed by a plain function: `wait_gone`'s future, which every held
    /// lock keeps for as long as it is held, then keeps no room for this
    /// request, only for the wait on the watch (DESIGN §8).
    fn watch_existing<'a>(&'a self, entry: &'a Entry, own: bool) -> Watching<'a> {
        Box::pin(async move {
            // The client clone is dropped before the wait, as in
            // `wait_for_entry`.
            let client = self.client().map_err(|error| (error, None))?;
            // Whether the connection changed while the request was out.
            let mut connection = client.state_watcher();
            connection.state();
            let gone = |mut connection: zookeeper_client::StateWatcher| async move {
                let across_reconnection = tokio::time::timeout(Duration::ZERO, connection.changed()).await.is_ok();
                Ok(Watched::Gone { across_reconnection })
            };
            if !own && entry.kind != EntryKind::Election {
                match client.get_and_watch_data(&entry.key).await {
                    Ok((_, _, watcher)) => return Ok(Watched::Set(watcher)),
                    Err(ZkError::NoNode) => return gone(connection).await,
                    // Not allowed to read it: the server sends a watch's
                    // events only to a session that may read the node, so
                    // no watch of ours would ever fire (an exists-watch is
                    // accepted and stays silent). Refused, as Curator's
                    // waiter is, rather than a wait for ever.
                    Err(ZkError::NoAuth) => return Err((unreadable(&entry.key), None)),
                    Err(error) => return Err((self.err(error), Some(client.state_watcher()))),
                }
            }
            let (stat, watcher) = client
                .check_and_watch_stat(&entry.key)
                .await
                .map_err(|e| (self.err(e), Some(client.state_watcher())))?;
            match stat {
                Some(_) => Ok(Watched::Set(watcher)),
                None => gone(connection).await,
            }
        })
    }

    pub(super) async fn wait_for_contender(&self, dir: &str) -> Result<()> {
        let dir = layout::dir_path(dir);
        loop {
            // No clone of the client is kept while the watch waits: `close()`
            // ends the session by dropping the last one.
            let client = self.client()?;
            let watcher = match client.list_and_watch_children(&dir).await {
                Ok((children, watcher)) => {
                    if !layout::contenders(&children).is_empty() {
                        return Ok(());
                    }
                    watcher
                }
                Err(ZkError::NoNode) => match client.check_and_watch_stat(&dir).await {
                    Ok((Some(_), _)) => continue,
                    Ok((None, watcher)) => watcher,
                    Err(error) => return Err(self.err(error)),
                },
                Err(error) => return Err(self.err_on(error, "read", &dir)),
            };
            drop(client);
            let event = watcher.changed().await;
            if event.event_type == EventType::Session {
                return Err(match event.session_state {
                    ZkState::Closed => Error::Closed {
                        session: self.id.clone(),
                    },
                    _ => self.err(ZkError::SessionExpired),
                });
            }
        }
    }

    pub(super) async fn wait_node_gone(&self, entry: &Entry) -> Result<()> {
        let own = entry.owner.as_deref() == Some(self.id.as_str());
        let remember = !own && !self.options.lock_delay().is_zero();
        if remember {
            lock(&self.wakes).remove(&entry.key);
        }
        // Whether the watch had to be asked for again: a node found gone
        // then may have gone at any time since the read that named it.
        let mut retried = false;
        let mut backoff = WATCH_RETRY_PAUSE;
        loop {
            let watcher = match self.watch_existing(entry, own).await {
                Ok(watcher) => watcher,
                Err((error, state)) if error.is_transient() => {
                    tracing::debug!(key = %entry.key, %error, "watch request failed; asking again once connected");
                    reconnected(state, backoff).await;
                    backoff = (backoff * 2).min(WATCH_RETRY_MAX_PAUSE);
                    retried = true;
                    continue;
                }
                Err((error, _)) => return Err(error),
            };
            let watcher = match watcher {
                Watched::Set(watcher) => watcher,
                Watched::Gone { across_reconnection } => {
                    if own {
                        lock(&self.held).remove(&entry.key);
                    }
                    // Gone before the watch was set: between the read that
                    // named it and this request, one round trip when asked
                    // once on one connection. ZooKeeper keeps no trace of
                    // how (see `departure`).
                    if remember {
                        self.note_wake(&entry.key, !retried && !across_reconnection && marks(entry.kind));
                    }
                    return Ok(());
                }
            };
            // On this session's own node the watch outlives this wait when
            // it is dropped (see `OwnWatch`).
            let event = if own {
                OwnWatch::new(watcher).await
            } else {
                watcher.changed().await
            };
            match event.event_type {
                EventType::NodeDeleted => {
                    if own {
                        lock(&self.held).remove(&entry.key);
                    }
                    if remember {
                        self.note_wake(&entry.key, false);
                    }
                    return Ok(());
                }
                EventType::NodeDataChanged if !own && marks(entry.kind) => {
                    if remember {
                        self.note_wake(&entry.key, true);
                    }
                    return Ok(());
                }
                EventType::Session => {
                    return Err(match event.session_state {
                        ZkState::Closed => Error::Closed {
                            session: self.id.clone(),
                        },
                        _ => self.err(ZkError::SessionExpired),
                    })
                }
                // This session's own node's data changed, or an election
                // candidate's (a proclaim): watch again.
                _ => {}
            }
        }
    }
}

/// The refusal of a wait behind `path`, a node this session may not read.
fn unreadable(path: &str) -> Error {
    Error::PermissionDenied {
        backend: crate::error::BACKEND,
        operation: "wait behind",
        key: path.to_owned(),
        reason: "the node ahead in the queue may not be read by this session's identity (ZooKeeper NoAuth on \
                 getData), and ZooKeeper delivers a watch's events only to a session that may read the node: \
                 every contender must be able to read the nodes it queues behind"
            .to_owned(),
    }
}
