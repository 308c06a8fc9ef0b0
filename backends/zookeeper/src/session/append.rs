//! Appends: one node per attempt, created with the directory's listing in
//! the same round trip, found again by a retry, and abandoned.

use super::listing::conflicting;
use super::release::marks;
use super::*;

impl ZkSession {
    /// The node an earlier try of this append created, if any: found by its
    /// attempt id. Any further node of the attempt (there should be none) is
    /// deleted, so one attempt never holds two places in the queue. Errors are
    /// returned, never taken for "no node": the caller would create a second one.
    async fn find_attempt(&self, client: &Client, dir: &str, attempt: &str) -> Result<Option<(String, i64, i32)>> {
        // After a lost answer the client may have reconnected to a member that
        // has not applied the create yet: catch it up with the leader first.
        match client.sync(dir).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(error) => return Err(self.err_on(error, "read", dir)),
        }
        let mine: Vec<Contender> = self
            .children(client, dir)
            .await?
            .into_iter()
            .filter(|c| c.attempt.as_deref() == Some(attempt))
            .collect();
        let Some((first, extra)) = mine.split_first() else {
            return Ok(None);
        };
        for node in extra {
            let path = format!("{dir}/{}", node.name);
            match client.delete(&path, None).await {
                Ok(()) | Err(ZkError::NoNode) => {}
                Err(error) => return Err(self.err_on(error, "delete", &path)),
            }
        }
        let path = format!("{dir}/{}", first.name);
        match client.check_stat(&path).await {
            Ok(Some(stat)) => {
                if format!("{:x}", stat.ephemeral_owner) != self.id {
                    return Err(Error::backend(
                        crate::error::BACKEND,
                        format!("node {path:?} carries this attempt's id but another session owns it"),
                    ));
                }
                Ok(Some((path, stat.czxid, first.sequence)))
            }
            // Gone since the listing (deleted by someone else): make a new one.
            Ok(None) => Ok(None),
            Err(error) => Err(self.err_on(error, "read", &path)),
        }
    }

    /// As [`create`](Self::create), with the directory's listing requested
    /// right behind the create, in the same round trip; the listing goes to
    /// `listed` when the first create succeeded (a missing directory takes
    /// the slow way, and no listing).
    async fn create_and_list(
        &self,
        client: &Client,
        prefix: &str,
        dir: &str,
        value: &[u8],
        listed: &mut Option<Result<Vec<Contender>>>,
    ) -> Result<(String, i64)> {
        let node = CreateMode::EphemeralSequential.with_acls(Acls::new(&self.acls));
        // Both requests are sent here, in this order; then both answers awaited.
        let created = client.create(prefix, value, &node);
        let children = client.list_children(dir);
        let (created, children) = tokio::join!(created, children);
        match created {
            Ok((stat, sequence)) => {
                *listed = Some(match children {
                    Ok(children) => Ok(layout::contenders(&children)),
                    Err(ZkError::NoNode) => Ok(Vec::new()),
                    Err(error) => Err(self.err_on(error, "read", dir)),
                });
                Ok((format!("{prefix}{sequence}"), stat.czxid))
            }
            Err(ZkError::NoNode) => self.create(client, prefix, dir, value).await,
            Err(error) => Err(self.err_on(error, "queue on", dir)),
        }
    }

    /// Creates the ephemeral-sequential node, creating missing parents as
    /// container nodes (deleted by the server once empty), all with the
    /// policy's ACLs.
    async fn create(&self, client: &Client, prefix: &str, dir: &str, value: &[u8]) -> Result<(String, i64)> {
        let node = CreateMode::EphemeralSequential.with_acls(Acls::new(&self.acls));
        for _ in 0..3 {
            match client.create(prefix, value, &node).await {
                Ok((stat, sequence)) => return Ok((format!("{prefix}{sequence}"), stat.czxid)),
                // The directory is missing (never made, or a container the
                // server just cleaned up): make it and try again.
                Err(ZkError::NoNode) => {
                    let parent = CreateMode::Container.with_acls(Acls::new(&self.acls));
                    match client.mkdir(dir, &parent).await {
                        Ok(()) | Err(ZkError::NodeExists) => {}
                        Err(error) => return Err(self.err_on(error, "create", dir)),
                    }
                }
                Err(error) => return Err(self.err_on(error, "queue on", dir)),
            }
        }
        Err(Error::backend(
            crate::error::BACKEND,
            format!("the lock directory {dir:?} kept disappearing while creating an entry"),
        ))
    }

    /// An attempt known to have no node: abandoning it is a no-op.
    fn settle_refused(&self, attempt: &str) {
        lock(&self.uncertain).remove(attempt);
        lock(&self.refused).insert(attempt.to_owned());
    }

    pub(super) async fn append_node(&self, request: &AppendRequest<'_>) -> Result<Appended> {
        fits(request.value.len(), request.dir)?;
        let client = self.client()?;
        let dir = layout::dir_path(request.dir);
        let _writing = self.writing();
        let prefix = layout::node_prefix(&dir, request.kind, request.attempt);
        let retried = lock(&self.uncertain).contains(request.attempt);
        let found = if retried {
            self.find_attempt(&client, &dir, request.attempt).await?
        } else {
            None
        };
        // The listing, sent right behind the create when there is one: the
        // server applies a session's requests in order, so it shows the new
        // node, and the acquire costs one round trip instead of two.
        let mut listed = None;
        let (key, czxid, sequence) = match found {
            Some(found) => found,
            None => {
                lock(&self.uncertain).insert(request.attempt.to_owned());
                let (key, czxid) = match self
                    .create_and_list(&client, &prefix, &dir, request.value, &mut listed)
                    .await
                {
                    Ok(created) => created,
                    // The server refused: no node was made (a session's
                    // requests are applied in order, so no earlier try of the
                    // attempt is still on its way either).
                    Err(error @ Error::PermissionDenied { .. }) => {
                        self.settle_refused(request.attempt);
                        return Err(error);
                    }
                    Err(error) => return Err(error),
                };
                let sequence = layout::parse(key.rsplit('/').next().unwrap_or_default())
                    .map(|c| c.sequence)
                    .ok_or_else(|| Error::backend(crate::error::BACKEND, format!("unexpected node name {key:?}")))?;
                (key, czxid, sequence)
            }
        };
        let entry = Entry {
            key,
            kind: request.kind,
            order: i64::from(sequence),
            token: FencingToken::new(u64::try_from(czxid).unwrap_or(0)),
            owner: Some(self.id.clone()),
        };
        let contenders = match listed {
            Some(listed) => listed,
            None => self.children(&client, &dir).await,
        };
        let contenders = match contenders {
            Ok(contenders) => contenders,
            // Allowed to queue but not to read the queue: take the node back
            // at once rather than leave it to a cleanup that cannot list. The
            // refusal tells the core there is nothing to clean up, so a node
            // that cannot be deleted either (no DELETE on the directory) would
            // block the queue for as long as the session lives: end the
            // session instead, and the server deletes the node.
            Err(error @ Error::PermissionDenied { .. }) => {
                match client.delete(&entry.key, None).await {
                    Ok(()) | Err(ZkError::NoNode) => self.settle_refused(request.attempt),
                    Err(delete) => {
                        tracing::warn!(
                            key = %entry.key,
                            error = %delete,
                            "cannot delete a node whose directory may not be read; ending the session so that the server deletes it"
                        );
                        drop(client);
                        self.give_up("the server refused to remove a node of a refused acquire");
                    }
                }
                return Err(error);
            }
            Err(error) => return Err(error),
        };
        lock(&self.uncertain).remove(request.attempt);
        if marks(request.kind) {
            lock(&self.held).insert(entry.key.clone());
        }
        if request.kind == EntryKind::Dlm {
            // The resource's next read reads these nodes' data with the
            // listing, in one request.
            self.remember_queue(&dir, Some(contenders.iter().map(|c| c.name.clone()).collect()), None);
        }
        let mut nearest: Vec<Entry> = conflicting(&contenders, request.conflicts)
            .filter(|c| layout::precedes(c, sequence))
            .map(|c| c.entry(&dir))
            .collect();
        nearest.reverse();
        nearest.truncate(request.nearest);
        // The listing must show my own node, or it raced with its deletion: let
        // the core look again.
        let nearest = Self::mine(&contenders, &entry.key, &dir).then_some(nearest);
        Ok(Appended {
            entry,
            nearest,
            queue: None,
        })
    }

    pub(super) async fn abandon_attempt(&self, dir: &str, kind: EntryKind, attempt: &str) -> Result<()> {
        if lock(&self.refused).remove(attempt) {
            return Ok(());
        }
        let client = self.client()?;
        let dir = layout::dir_path(dir);
        let _writing = self.writing();
        for contender in self.children(&client, &dir).await? {
            if contender.attempt.as_deref() == Some(attempt) {
                let path = format!("{dir}/{}", contender.name);
                self.release_node(&client, &path, marks(kind)).await?;
                lock(&self.held).remove(&path);
            }
        }
        lock(&self.uncertain).remove(attempt);
        Ok(())
    }
}
