//! Reading a queue: a directory's contenders, the nearest conflicting ones
//! ahead of an entry, and every entry with its token and owner.

use super::*;

impl ZkSession {
    pub(super) async fn children(&self, client: &Client, dir: &str) -> Result<Vec<Contender>> {
        match client.list_children(dir).await {
            Ok(children) => Ok(layout::contenders(&children)),
            Err(ZkError::NoNode) => Ok(Vec::new()),
            Err(error) => Err(self.err_on(error, "read", dir)),
        }
    }

    pub(super) fn mine(contenders: &[Contender], key: &str, dir: &str) -> bool {
        contenders.iter().any(|c| format!("{dir}/{}", c.name) == key)
    }

    pub(super) async fn earlier_entries(&self, entry: &Entry, conflicts: Conflicts, count: usize) -> Result<Earlier> {
        let client = self.client()?;
        let dir = dir_of(&entry.key);
        let contenders = self.children(&client, dir).await?;
        if !Self::mine(&contenders, &entry.key, dir) {
            return Ok(Earlier::Gone);
        }
        let Ok(order) = i32::try_from(entry.order) else {
            return Err(Error::backend(
                crate::error::BACKEND,
                format!("entry {:?} has no ZooKeeper sequence number", entry.key),
            ));
        };
        let mut nearest: Vec<Entry> = conflicting(&contenders, conflicts)
            .filter(|c| layout::precedes(c, order))
            .map(|c| c.entry(dir))
            .collect();
        nearest.reverse();
        nearest.truncate(count);
        Ok(Earlier::Entries(nearest))
    }

    pub(super) async fn list_entries(&self, dir: &str) -> Result<Vec<Entry>> {
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
        let results = reader.commit().await.map_err(|e| self.err_on(e, "read", &dir))?;
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
                MultiReadResult::Error { err } => return Err(self.err_on(err, "read", &entry.key)),
                _ => {}
            }
        }
        Ok(listed)
    }
}

pub(super) fn conflicting(contenders: &[Contender], conflicts: Conflicts) -> impl Iterator<Item = &Contender> {
    contenders.iter().filter(move |c| conflicts.includes(c.kind))
}
