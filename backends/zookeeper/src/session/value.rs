//! An entry's value: written, read, and watched until it changes or its node
//! goes (with the whole lock-mode queue read after a change).

use super::wait::{reconnected, WATCH_RETRY_MAX_PAUSE, WATCH_RETRY_PAUSE};
use super::*;

impl ZkSession {
    /// After the data of another contender's lock-mode node changed: one
    /// multi-read of the whole queue, the node's data with it, in the round
    /// trip a read of the node alone would take. `None` when the node is
    /// gone, as a release leaves it (it marks the node and deletes it in one
    /// transaction); the queue is then kept for the `read_queue` the core
    /// makes next, which so costs no request. Otherwise the node's data.
    async fn read_after_change(&self, client: &Client, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let dir = dir_of(&entry.key);
        let name = entry.key.rsplit('/').next().unwrap_or_default();
        let mut guess = lock(&self.queues)
            .get(dir)
            .map(|memo| memo.children.clone())
            .unwrap_or_default();
        if !guess.iter().any(|g| g == name) {
            guess.push(name.to_owned());
        }
        let writes = self.writes.load(Ordering::SeqCst);
        let snapshot = self.snapshot(client, dir, &guess).await?;
        let present = snapshot.contenders.iter().any(|c| c.name == name);
        let data = snapshot.read.get(name).map(|(data, _)| data.clone());
        let queue = self.remember_snapshot(dir, snapshot);
        if !present {
            if let Ok(queue) = queue {
                if let Some(memo) = lock(&self.queues).get_mut(dir) {
                    memo.fresh = Some((Instant::now(), writes, queue));
                }
            }
            return Ok(None);
        }
        // Listed, so read in the same snapshot.
        data.map(Some).ok_or_else(|| {
            Error::backend(
                crate::error::BACKEND,
                format!("{:?} was listed but not read in one multi-read", entry.key),
            )
        })
    }

    pub(super) async fn set_node_value(&self, entry: &Entry, value: &[u8]) -> Result<()> {
        fits(value.len(), &entry.key)?;
        let client = self.client()?;
        let _writing = self.writing();
        match client.set_data(&entry.key, value, None).await {
            Ok(_) => Ok(()),
            Err(ZkError::NoNode) => Err(Error::LockLost { key: entry.key.clone() }),
            Err(error) => Err(self.err_on(error, "write", &entry.key)),
        }
    }

    pub(super) async fn get_node_value(&self, entry: &Entry) -> Result<Option<Vec<u8>>> {
        let client = self.client()?;
        match client.get_data(&entry.key).await {
            Ok((data, _)) => Ok(Some(data)),
            Err(ZkError::NoNode) => Ok(None),
            Err(error) => Err(self.err_on(error, "read", &entry.key)),
        }
    }

    /// Watches `entry` until its data is a value `wanted` takes (that
    /// value) or it goes (`None`), keeping one watch: a change it does not
    /// want is watched past with the read that set the watch again.
    pub(super) async fn watch_node_value(
        &self,
        entry: &Entry,
        seen: &[u8],
        wanted: &Wanted,
    ) -> Result<Option<Vec<u8>>> {
        let mut seen = seen.to_vec();
        let own = entry.owner.as_deref() == Some(self.id.as_str());
        let whole_queue = !own && entry.kind == EntryKind::Dlm;
        let remember = whole_queue && !self.options.lock_delay().is_zero();
        if remember {
            lock(&self.wakes).remove(&entry.key);
        }
        // Whether the node's data changed since the caller's read, and
        // whether a request had to be sent again (a node found gone then may
        // have gone at any time since).
        let mut changed = false;
        let mut retried = false;
        let mut backoff = WATCH_RETRY_PAUSE;
        loop {
            // The client clone is dropped before the wait, as in
            // `wait_for_entry`.
            let client = self.client()?;
            // A request that waits for EX and was never granted changes
            // first by its grant (or a waiter's mark), after which it still
            // blocks everyone it blocked: the read that sets the watch
            // again is the look, and the queue is read only once it goes.
            let first_change_blocks = seen.starts_with(WAITING_EX);
            let failed = if changed && whole_queue && !first_change_blocks {
                match self.read_after_change(&client, entry).await {
                    Ok(None) => {
                        if remember {
                            self.note_wake(&entry.key, !retried);
                        }
                        return Ok(None);
                    }
                    Ok(Some(data)) if data != seen && wanted(&data) => return Ok(Some(data)),
                    Ok(Some(data)) if data != seen => {
                        seen = data;
                        None
                    }
                    // Back to what the caller saw: watch again.
                    Ok(Some(_)) => None,
                    Err(error) => Some(error),
                }
            } else {
                None
            };
            let watched = match failed {
                Some(error) => Err(error),
                None => {
                    // Whether the connection changed while the request was out.
                    let mut connection = client.state_watcher();
                    connection.state();
                    match client.get_and_watch_data(&entry.key).await {
                        Ok(found) => Ok(found),
                        Err(ZkError::NoNode) => {
                            if remember {
                                // Gone between the read that named it and
                                // this one: as `wait_gone` takes it (see
                                // `departure`).
                                let across_reconnection =
                                    tokio::time::timeout(Duration::ZERO, connection.changed()).await.is_ok();
                                self.note_wake(&entry.key, !retried && !across_reconnection);
                            }
                            return Ok(None);
                        }
                        Err(error) => Err(self.err_on(error, "read", &entry.key)),
                    }
                }
            };
            let (data, _, watcher) = match watched {
                Ok(found) => found,
                // Sent again once the client has reconnected (the session's
                // own tracking ends the wait if it is lost meanwhile), so
                // that the wait ends only by what happened to the node.
                Err(error) if error.is_transient() => {
                    tracing::debug!(key = %entry.key, %error, "value watch failed; asking again once connected");
                    let state = client.state_watcher();
                    drop(client);
                    reconnected(Some(state), backoff).await;
                    backoff = (backoff * 2).min(WATCH_RETRY_MAX_PAUSE);
                    retried = true;
                    continue;
                }
                Err(error) => return Err(error),
            };
            drop(client);
            if data != seen {
                if wanted(&data) {
                    return Ok(Some(data));
                }
                // Watched past, with the watch this read set.
                seen = data;
            }
            let event = watcher.changed().await;
            match event.event_type {
                EventType::NodeDeleted => {
                    if remember {
                        self.note_wake(&entry.key, false);
                    }
                    return Ok(None);
                }
                EventType::Session => {
                    return Err(match event.session_state {
                        ZkState::Closed => Error::Closed {
                            session: self.id.clone(),
                        },
                        _ => self.err(ZkError::SessionExpired),
                    })
                }
                _ => changed = true,
            }
        }
    }
}
