//! A ZooKeeper session: one `zookeeper_client::Client`, its state tracked.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use lockline::{
    AppendRequest, Appended, BackendSession, Conflicts, Earlier, Entry, EntryKind, Error, FencingToken, Result,
    SessionOptions, SessionState,
};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, EventType, MultiReadResult, SessionState as ZkState,
};

use crate::error::map;
use crate::layout::{self, Contender};

/// A lockline session on ZooKeeper.
pub(crate) struct ZkSession {
    id: String,
    /// `None` once closed; every call clones it (cheap) for its duration.
    client: StdMutex<Option<Client>>,
    state: watch::Sender<SessionState>,
    tracker: AbortHandle,
    /// Appends whose response was lost: a retry looks for their node first.
    uncertain: StdMutex<HashSet<String>>,
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

fn lock<T>(mutex: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ZkSession {
    pub(crate) async fn open(connect: &str, options: &SessionOptions) -> Result<Arc<Self>> {
        let client = Client::connector()
            .with_session_timeout(options.ttl())
            .with_connection_timeout(options.connect_timeout())
            .connect(connect)
            .await
            .map_err(|e| map(e, "(connecting)"))?;
        let id = format!("{:x}", client.session_id().0);
        let state = watch::Sender::new(SessionState::Live);
        // Declare the session lost a safety margin before the server could
        // expire it: the negotiated timeout less the margin.
        let negotiated = client.session_timeout();
        let margin = options.safety_margin().min(negotiated / 2);
        let loss_deadline = negotiated.saturating_sub(margin);
        let tracker = tokio::spawn(track_state(client.state_watcher(), state.clone(), loss_deadline)).abort_handle();
        tracing::debug!(session = %id, ?negotiated, "ZooKeeper session opened");
        Ok(Arc::new(ZkSession {
            id,
            client: StdMutex::new(Some(client)),
            state,
            tracker,
            uncertain: StdMutex::default(),
        }))
    }

    /// The ZooKeeper session's id and password (to attach to it from elsewhere).
    pub(crate) fn session_info(&self) -> Option<zookeeper_client::SessionInfo> {
        lock(&self.client).as_ref().map(|c| c.session().clone())
    }

    fn client(&self) -> Result<Client> {
        lock(&self.client).clone().ok_or_else(|| Error::Closed {
            session: self.id.clone(),
        })
    }

    fn err(&self, error: ZkError) -> Error {
        let mapped = map(error, &self.id);
        if let Error::SessionLost { .. } = mapped {
            SessionState::advance(&self.state, SessionState::Lost);
        }
        mapped
    }

    async fn children(&self, client: &Client, dir: &str) -> Result<Vec<Contender>> {
        match client.list_children(dir).await {
            Ok(children) => Ok(layout::contenders(&children)),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(error) => Err(self.err(error)),
        }
    }

    /// Creates the ephemeral-sequential node, creating missing parents as
    /// container nodes (deleted by the server once empty).
    async fn create(&self, client: &Client, prefix: &str, dir: &str, value: &[u8]) -> Result<(String, i64)> {
        let node = CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
        for _ in 0..3 {
            match client.create(prefix, value, &node).await {
                Ok((stat, sequence)) => return Ok((format!("{prefix}{sequence}"), stat.czxid)),
                // The directory is missing (never made, or a container the
                // server just cleaned up): make it and try again.
                Err(ZkError::NoNode) => {
                    let parent = CreateMode::Container.with_acls(Acls::anyone_all());
                    match client.mkdir(dir, &parent).await {
                        Ok(()) | Err(ZkError::NodeExists) => {}
                        Err(error) => return Err(self.err(error)),
                    }
                }
                Err(error) => return Err(self.err(error)),
            }
        }
        Err(Error::backend(
            crate::error::BACKEND,
            format!("the lock directory {dir:?} kept disappearing while creating an entry"),
        ))
    }

    fn mine(contenders: &[Contender], key: &str, dir: &str) -> bool {
        contenders.iter().any(|c| format!("{dir}/{}", c.name) == key)
    }
}

/// The directory of an entry: its key less the node name.
fn dir_of(key: &str) -> &str {
    key.rfind('/').map_or(key, |at| &key[..at])
}

fn conflicting(contenders: &[Contender], conflicts: Conflicts) -> impl Iterator<Item = &Contender> {
    contenders.iter().filter(move |c| conflicts.includes(c.kind))
}

#[async_trait]
impl BackendSession for ZkSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// Two round trips: create the node, list the directory.
    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        let client = self.client()?;
        let dir = layout::dir_path(request.dir);
        let prefix = layout::node_prefix(&dir, request.kind, request.attempt);
        let retried = lock(&self.uncertain).contains(request.attempt);
        let mut found = None;
        if retried {
            // A previous try may have created the node before its answer was
            // lost: find it by its attempt id and our session as its owner.
            for contender in self.children(&client, &dir).await? {
                if contender.attempt.as_deref() == Some(request.attempt) {
                    let path = format!("{dir}/{}", contender.name);
                    if let Ok(Some(stat)) = client.check_stat(&path).await {
                        if format!("{:x}", stat.ephemeral_owner) == self.id {
                            found = Some((path, stat.czxid, contender.sequence));
                        }
                    }
                }
            }
        }
        let (key, czxid, sequence) = match found {
            Some(found) => found,
            None => {
                lock(&self.uncertain).insert(request.attempt.to_owned());
                let (key, czxid) = self.create(&client, &prefix, &dir, request.value).await?;
                let sequence = layout::parse(key.rsplit('/').next().unwrap_or_default())
                    .map(|c| c.sequence)
                    .ok_or_else(|| Error::backend(crate::error::BACKEND, format!("unexpected node name {key:?}")))?;
                (key, czxid, sequence)
            }
        };
        lock(&self.uncertain).remove(request.attempt);
        let entry = Entry {
            key,
            kind: request.kind,
            order: i64::from(sequence),
            token: FencingToken::new(u64::try_from(czxid).unwrap_or(0)),
            owner: Some(self.id.clone()),
        };
        let contenders = self.children(&client, &dir).await?;
        let mut nearest: Vec<Entry> = conflicting(&contenders, request.conflicts)
            .filter(|c| i64::from(c.sequence) < entry.order)
            .map(|c| c.entry(&dir))
            .collect();
        nearest.reverse();
        nearest.truncate(request.nearest);
        // The listing must show my own node, or it raced with its deletion: let
        // the core look again.
        let nearest = Self::mine(&contenders, &entry.key, &dir).then_some(nearest);
        Ok(Appended { entry, nearest })
    }

    /// One round trip: list the directory; my node must be among the children.
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let client = self.client()?;
        let dir = dir_of(&entry.key);
        let contenders = self.children(&client, dir).await?;
        if !Self::mine(&contenders, &entry.key, dir) {
            return Ok(Earlier::Gone);
        }
        let mut nearest: Vec<Entry> = conflicting(&contenders, conflicts)
            .filter(|c| i64::from(c.sequence) < entry.order)
            .map(|c| c.entry(dir))
            .collect();
        nearest.reverse();
        nearest.truncate(count);
        Ok(Earlier::Entries(nearest))
    }

    /// Two round trips whatever the queue length: list the directory, then
    /// read every contender's stat (token, owner) in one multi-read.
    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        let contenders = self.children(&client, &dir).await?;
        if contenders.is_empty() {
            return Ok(Vec::new());
        }
        let mut entries: Vec<Entry> = contenders.iter().map(|c| c.entry(&dir)).collect();
        let mut reader = client.new_multi_reader();
        for entry in &entries {
            reader.add_get_data(&entry.key).map_err(|e| self.err(e))?;
        }
        let results = reader.commit().await.map_err(|e| self.err(e))?;
        let mut listed = Vec::with_capacity(entries.len());
        for (mut entry, result) in entries.drain(..).zip(results) {
            match result {
                MultiReadResult::Data { stat, .. } => {
                    entry.token = FencingToken::new(u64::try_from(stat.czxid).unwrap_or(0));
                    entry.owner = (stat.ephemeral_owner != 0).then(|| format!("{:x}", stat.ephemeral_owner));
                    listed.push(entry);
                }
                // Gone since the listing: not a contender any more.
                MultiReadResult::Error { err: ZkError::NoNode } => {}
                MultiReadResult::Error { err } => return Err(self.err(err)),
                _ => {}
            }
        }
        Ok(listed)
    }

    /// A children watch on the directory (or an exists-watch while it is
    /// missing) until a contender appears.
    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        loop {
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
                Err(error) => return Err(self.err(error)),
            };
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

    /// One round trip: an exists-watch on the node (which also tells whether
    /// it is still there), then its deletion event.
    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let client = self.client()?;
        loop {
            let (stat, watcher) = client.check_and_watch_stat(&entry.key).await.map_err(|e| self.err(e))?;
            if stat.is_none() {
                return Ok(());
            }
            let event = watcher.changed().await;
            match event.event_type {
                EventType::NodeDeleted => return Ok(()),
                EventType::Session => {
                    return Err(match event.session_state {
                        ZkState::Closed => Error::Closed {
                            session: self.id.clone(),
                        },
                        _ => self.err(ZkError::SessionExpired),
                    })
                }
                // Data changed (an election's proclaim): watch again.
                _ => {}
            }
        }
    }

    /// Deletes the very node: its path carries a unique attempt id and sequence,
    /// so no newer node can have it.
    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let client = self.client()?;
        match client.delete(&entry.key, None).await {
            Ok(()) => Ok(true),
            Err(ZkError::NoNode) => Ok(false),
            Err(error) => Err(self.err(error)),
        }
    }

    async fn abandon(&self, dir: &str, _kind: EntryKind, attempt: &str) -> Result<()> {
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        for contender in self.children(&client, &dir).await? {
            if contender.attempt.as_deref() == Some(attempt) {
                let path = format!("{dir}/{}", contender.name);
                match client.delete(&path, None).await {
                    Ok(()) | Err(ZkError::NoNode) => {}
                    Err(error) => return Err(self.err(error)),
                }
            }
        }
        lock(&self.uncertain).remove(attempt);
        Ok(())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        let client = self.client()?;
        match client.set_data(&entry.key, value, None).await {
            Ok(_) => Ok(()),
            Err(ZkError::NoNode) => Err(Error::LockLost { key: entry.key.clone() }),
            Err(error) => Err(self.err(error)),
        }
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let client = self.client()?;
        match client.get_data(&entry.key).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(ZkError::NoNode) => Ok(None),
            Err(error) => Err(self.err(error)),
        }
    }

    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        let client = self.client()?;
        loop {
            let (data, _, watcher) = match client.get_and_watch_data(&entry.key).await {
                Ok(found) => found,
                Err(ZkError::NoNode) => return Ok(None),
                Err(error) => return Err(self.err(error)),
            };
            if data != seen {
                return Ok(Some(data));
            }
            let event = watcher.changed().await;
            match event.event_type {
                EventType::NodeDeleted => return Ok(None),
                EventType::Session => return Err(self.err(ZkError::SessionExpired)),
                _ => {}
            }
        }
    }

    async fn close(&self) -> Result<()> {
        // Dropping the last client closes the ZooKeeper session, which deletes
        // its ephemeral nodes.
        let client = lock(&self.client).take();
        drop(client);
        self.tracker.abort();
        self.state.send_replace(SessionState::Closed);
        Ok(())
    }
}

/// Follows the client's state: `Disconnected` is `Suspended` until the same
/// session reconnects, or `Lost` once `loss_deadline` passes without it;
/// `Expired` (or failed authentication) is `Lost`.
async fn track_state(
    mut watcher: zookeeper_client::StateWatcher,
    state: watch::Sender<SessionState>,
    loss_deadline: Duration,
) {
    let mut current = watcher.peek_state();
    loop {
        let next = match current {
            ZkState::Disconnected => {
                SessionState::advance(&state, SessionState::Suspended);
                match tokio::time::timeout(loss_deadline, watcher.changed()).await {
                    Ok(next) => next,
                    Err(_) => {
                        tracing::warn!(
                            ?loss_deadline,
                            "ZooKeeper session not reconnected in time; declaring it lost"
                        );
                        SessionState::advance(&state, SessionState::Lost);
                        return;
                    }
                }
            }
            ZkState::SyncConnected | ZkState::ConnectedReadOnly => {
                SessionState::advance(&state, SessionState::Live);
                watcher.changed().await
            }
            ZkState::Closed => {
                SessionState::advance(&state, SessionState::Closed);
                return;
            }
            _ => {
                tracing::warn!(state = ?current, "ZooKeeper session expired");
                SessionState::advance(&state, SessionState::Lost);
                return;
            }
        };
        current = next;
    }
}
