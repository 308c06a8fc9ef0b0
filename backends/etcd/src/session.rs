//! An etcd session: one lease, its keepalive, one watch stream.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};
use lockline::{
    AppendRequest, Appended, BackendSession, Conflicts, Earlier, Entry, EntryKind, Error, Result, SessionOptions,
    SessionState,
};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::error::{map, BACKEND};
use crate::layout;
use crate::watch::{Hub, Signal};

/// A lockline session on etcd.
pub(crate) struct EtcdSession {
    id: String,
    lease: i64,
    client: Client,
    state: watch::Sender<SessionState>,
    hub: Hub,
    keepalive: AbortHandle,
}

impl fmt::Debug for EtcdSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSession")
            .field("lease", &self.id)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl Drop for EtcdSession {
    /// Every handle is gone: stop renewing; the lease expires after its TTL,
    /// as a crashed process's would. `close()` revokes it at once.
    fn drop(&mut self) {
        self.keepalive.abort();
    }
}

impl EtcdSession {
    pub(crate) async fn open(client: Client, options: &SessionOptions) -> Result<Arc<Self>> {
        // etcd counts lease TTLs in whole seconds: round up.
        let ttl = i64::try_from(options.ttl().as_millis().div_ceil(1000)).unwrap_or(i64::MAX);
        let granted_at = Instant::now();
        let grant = client.lease_client().grant(ttl, None).await.map_err(|e| map(e, None))?;
        let lease = grant.id();
        let id = format!("{lease:x}");
        let state = watch::Sender::new(SessionState::Live);
        let keepalive = tokio::spawn(keep_alive(
            client.clone(),
            lease,
            options.clone(),
            granted_at,
            state.clone(),
        ))
        .abort_handle();
        let hub = Hub::start(client.watch_client());
        tracing::debug!(lease = %id, ttl, "etcd session opened");
        Ok(Arc::new(EtcdSession {
            id,
            lease,
            client,
            state,
            hub,
            keepalive,
        }))
    }

    /// Watch events this session's stream has received.
    pub(crate) fn watch_events(&self) -> u64 {
        self.hub.events.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn err(&self, error: etcd_client::Error) -> Error {
        let mapped = map(error, Some(&self.id));
        if let Error::SessionLost { .. } = mapped {
            self.mark_lost("the server no longer has the lease");
        }
        mapped
    }

    fn mark_lost(&self, why: &str) {
        let changed = SessionState::advance(&self.state, SessionState::Lost);
        if changed {
            tracing::warn!(lease = %self.id, why, "etcd session lost");
        }
    }

    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse> {
        self.client.kv_client().txn(txn).await.map_err(|e| self.err(e))
    }

    fn entries(response: &etcd_client::GetResponse) -> Vec<Entry> {
        response.kvs().iter().filter_map(layout::entry).collect()
    }
}

fn first_created(limit: usize) -> GetOptions {
    GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
}

fn get_response(response: Option<&TxnOpResponse>) -> Result<&etcd_client::GetResponse> {
    match response {
        Some(TxnOpResponse::Get(get)) => Ok(get),
        _ => Err(Error::backend(BACKEND, "unexpected transaction response shape")),
    }
}

#[async_trait]
impl BackendSession for EtcdSession {
    fn id(&self) -> &str {
        &self.id
    }

    fn state(&self) -> watch::Receiver<SessionState> {
        self.state.subscribe()
    }

    /// One round trip: if my key does not exist, create it with my lease and
    /// read it back with the head of the queue; else read both (a retry after a
    /// lost response finds its own key).
    async fn append(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        let key = layout::key(request.dir, request.kind, &self.id, request.attempt);
        // Right after my put my key is the newest under the prefix, so the
        // newest conflicting keys (one more than asked, mine may be among them)
        // are exactly the nearest earlier ones.
        let nearest_prefix = layout::conflict_prefix(request.dir, request.conflicts);
        let newest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(i64::try_from(request.nearest.saturating_add(1)).unwrap_or(i64::MAX));
        let put = TxnOp::put(
            key.clone(),
            request.value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                put,
                TxnOp::get(key.clone(), None),
                TxnOp::get(nearest_prefix, Some(newest)),
            ])
            .or_else([TxnOp::get(key.clone(), None)]);
        let response = self.txn(txn).await?;
        let ops = response.op_responses();
        let (mine, newest) = if response.succeeded() {
            (get_response(ops.get(1))?, Some(get_response(ops.get(2))?))
        } else {
            // My key already existed (a retry after a lost answer): keys newer
            // than mine may exist too, so the core asks `earlier`.
            (get_response(ops.first())?, None)
        };
        let entry = mine
            .kvs()
            .first()
            .and_then(layout::entry)
            .ok_or_else(|| Error::LockLost { key: key.clone() })?;
        if mine.kvs().first().map(|kv| kv.lease()) != Some(self.lease) {
            return Err(Error::backend(
                BACKEND,
                format!("key {key:?} exists with another lease; refusing to share it"),
            ));
        }
        let nearest = newest.map(|newest| {
            let mut nearest: Vec<Entry> = Self::entries(newest)
                .into_iter()
                .filter(|e| e.order < entry.order)
                .collect();
            nearest.truncate(request.nearest);
            nearest
        });
        Ok(Appended { entry, nearest })
    }

    /// One round trip: confirm my key is still the same entry and read the
    /// nearest earlier conflicting keys (greatest create revision below mine).
    async fn earlier(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let prefix = layout::conflict_prefix(dir_of(entry), conflicts);
        let nearest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(entry.order - 1)
            .with_limit(i64::try_from(count.max(1)).unwrap_or(i64::MAX));
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then([TxnOp::get(prefix, Some(nearest))]);
        let response = self.txn(txn).await?;
        if !response.succeeded() {
            return Ok(Earlier::Gone);
        }
        let ops = response.op_responses();
        Ok(Earlier::Entries(Self::entries(get_response(ops.first())?)))
    }

    async fn list(&self, dir: &str) -> Result<Vec<Entry>> {
        let response = self
            .client
            .kv_client()
            .get(layout::prefix(dir), Some(first_created(0)))
            .await
            .map_err(|e| self.err(e))?;
        Ok(Self::entries(&response))
    }

    /// A watch on the prefix from the current revision, then one read.
    async fn wait_for_entry(&self, dir: &str) -> Result<()> {
        let mut watch = self.hub.watch_prefix(&layout::prefix(dir));
        loop {
            match watch.next().await {
                Signal::Created => {
                    if !self.list(dir).await?.is_empty() {
                        return Ok(());
                    }
                }
                Signal::Put { .. } => return Ok(()),
                Signal::Delete { .. } => {}
                Signal::Broken(reason) => return Err(unavailable(reason)),
            }
        }
    }

    /// A watch on the key from the current revision (never a past one: etcd
    /// serves those from its slow unsynced-watcher loop), then one read to
    /// confirm the key still exists, then its DELETE event.
    ///
    /// Only a deletion after the entry's creation counts: a member that lags
    /// can serve the watch from a revision before it, and a key name outlives
    /// its entries (a session re-acquiring writes the same key again).
    async fn wait_gone(&self, entry: &Entry) -> Result<()> {
        let mut watch = self.hub.watch(&entry.key, false);
        loop {
            match watch.next().await {
                Signal::Created => {
                    if !self.exists(entry).await? {
                        return Ok(());
                    }
                }
                Signal::Delete { revision } if revision > entry.order => return Ok(()),
                Signal::Delete { .. } | Signal::Put { .. } => {}
                Signal::Broken(reason) => return Err(unavailable(reason)),
            }
        }
    }

    async fn remove(&self, entry: &Entry) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then([TxnOp::delete(entry.key.clone(), None)]);
        Ok(self.txn(txn).await?.succeeded())
    }

    async fn abandon(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        let key = layout::key(dir, kind, &self.id, attempt);
        let txn = Txn::new()
            .when([Compare::lease(key.clone(), CompareOp::Equal, self.lease)])
            .and_then([TxnOp::delete(key, None)]);
        self.txn(txn).await.map(|_| ())
    }

    async fn set_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        let put = TxnOp::put(
            entry.key.clone(),
            value.to_vec(),
            Some(PutOptions::new().with_lease(self.lease)),
        );
        let txn = Txn::new()
            .when([Compare::create_revision(
                entry.key.clone(),
                CompareOp::Equal,
                entry.order,
            )])
            .and_then([put]);
        if self.txn(txn).await?.succeeded() {
            Ok(())
        } else {
            Err(Error::LockLost { key: entry.key.clone() })
        }
    }

    async fn get_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let response = self
            .client
            .kv_client()
            .get(entry.key.clone(), None)
            .await
            .map_err(|e| self.err(e))?;
        Ok(response
            .kvs()
            .first()
            .filter(|kv| kv.create_revision() == entry.order)
            .map(|kv| kv.value().to_vec()))
    }

    async fn watch_value(&self, entry: &Entry, seen: &[u8]) -> Result<Option<Vec<u8>>> {
        let mut watch = self.hub.watch(&entry.key, true);
        loop {
            match watch.next().await {
                Signal::Created => match self.get_value(entry).await? {
                    None => return Ok(None),
                    Some(value) if value != seen => return Ok(Some(value)),
                    Some(_) => {}
                },
                Signal::Delete { revision } if revision > entry.order => return Ok(None),
                Signal::Delete { .. } => {}
                Signal::Put { create_revision, value } => {
                    // An older key under the same name: not this entry.
                    if create_revision < entry.order {
                        continue;
                    }
                    if create_revision > entry.order {
                        return Ok(None);
                    }
                    if value != seen {
                        return Ok(Some(value));
                    }
                }
                Signal::Broken(reason) => return Err(unavailable(reason)),
            }
        }
    }

    /// Asks the server for the lease's remaining TTL; none left means lost.
    async fn confirm(&self) -> Result<SessionState> {
        let current = *self.state.borrow();
        if current.is_over() {
            return Ok(current);
        }
        let response = self
            .client
            .lease_client()
            .time_to_live(self.lease, None)
            .await
            .map_err(|e| self.err(e))?;
        if response.ttl() <= 0 {
            self.mark_lost("the lease has no time left");
        }
        Ok(*self.state.borrow())
    }

    async fn close(&self) -> Result<()> {
        self.keepalive.abort();
        let revoked = self.client.lease_client().revoke(self.lease).await;
        SessionState::advance(&self.state, SessionState::Closed);
        match revoked {
            Ok(_) => Ok(()),
            Err(error) => match map(error, Some(&self.id)) {
                // Already gone on the server: nothing left to release.
                Error::SessionLost { .. } => Ok(()),
                other => Err(other),
            },
        }
    }
}

impl EtcdSession {
    async fn exists(&self, entry: &Entry) -> Result<bool> {
        let response = self
            .client
            .kv_client()
            .get(entry.key.clone(), Some(GetOptions::new().with_keys_only()))
            .await
            .map_err(|e| self.err(e))?;
        Ok(response
            .kvs()
            .first()
            .is_some_and(|kv| kv.create_revision() == entry.order))
    }
}

/// The lock directory an entry belongs to, from its key and the layout.
fn dir_of(entry: &Entry) -> &str {
    let key = entry.key.as_str();
    let cut = match entry.kind {
        EntryKind::Read | EntryKind::Write | EntryKind::Semaphore => {
            // <dir>/<kind>/<lease>-<attempt>
            key.rsplitn(3, '/').nth(2).map(str::len)
        }
        _ => key.rfind('/'),
    };
    cut.map_or(key, |at| &key[..at])
}

fn unavailable(reason: String) -> Error {
    Error::Unavailable {
        backend: BACKEND,
        source: Some(reason.into()),
    }
}

/// Renews the lease every `keepalive_interval`; declares the session lost on a
/// TTL ≤ 0 answer or when nothing has been confirmed for `ttl - safety_margin`,
/// and suspended while renewals fail before that.
async fn keep_alive(
    client: Client,
    lease: i64,
    options: SessionOptions,
    granted_at: Instant,
    state: watch::Sender<SessionState>,
) {
    let interval = options.keepalive_interval();
    let retry = interval.min(Duration::from_millis(250));
    let mut confirmed = granted_at;
    let mut stream = None;
    let mut wait = interval;
    loop {
        let deadline = confirmed + options.loss_deadline();
        if tokio::time::timeout_at(deadline, tokio::time::sleep(wait))
            .await
            .is_err()
        {
            break;
        }
        let sent = Instant::now();
        let renewal = async {
            if stream.is_none() {
                stream = Some(client.lease_client().keep_alive(lease).await?);
            }
            let Some((keeper, responses)) = stream.as_mut() else {
                return Ok(None);
            };
            keeper.keep_alive().await?;
            responses.message().await
        };
        let bounded = tokio::time::timeout(options.request_timeout(), renewal);
        match tokio::time::timeout_at(deadline, bounded).await {
            Err(_) => break,
            Ok(Ok(Ok(Some(response)))) if response.ttl() > 0 => {
                confirmed = sent;
                wait = interval;
                SessionState::advance(&state, SessionState::Live);
            }
            Ok(Ok(Ok(Some(_)))) => {
                tracing::warn!(lease = format!("{lease:x}"), "etcd lease expired or revoked");
                SessionState::advance(&state, SessionState::Lost);
                return;
            }
            outcome => {
                let why = match outcome {
                    Ok(Ok(Err(error))) => error.to_string(),
                    Ok(Ok(Ok(None))) => "keepalive stream ended".into(),
                    _ => "keepalive timed out".into(),
                };
                tracing::debug!(lease = format!("{lease:x}"), why, "etcd keepalive failed; retrying");
                stream = None;
                wait = retry;
                SessionState::advance(&state, SessionState::Suspended);
            }
        }
    }
    tracing::warn!(
        lease = format!("{lease:x}"),
        deadline = ?options.loss_deadline(),
        "etcd lease not confirmed within ttl - safety margin; session lost"
    );
    SessionState::advance(&state, SessionState::Lost);
}
