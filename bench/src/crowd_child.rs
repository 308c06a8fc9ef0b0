//! A crowd child's side, with lockline: its contenders' sessions, their
//! lock → record → release loop, and the report to the parent
//! ([`crate::crowd`] has the protocol).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use lockline::{Client, SessionOptions};

use crate::contenders::{counts, SESSION_TTL};
use crate::crowd::{unix_nanos, CrowdChild, GrantRecord};
use crate::BoxResult;

/// How long a child's contenders may take to queue.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a child's sessions may take to close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(30);

impl CrowdChild {
    /// Runs this child's contenders on a multi-thread runtime, each its own
    /// client (from `client`) and session, on the lock `crowd/RUN`, and
    /// reports to the parent.
    ///
    /// # Errors
    ///
    /// When a session cannot be opened, a contender fails, the contenders do
    /// not queue within 120 s, or the parent is gone.
    pub fn contend(self, client: impl Fn() -> Client) -> BoxResult<()> {
        let sessions = self.contenders;
        self.contend_sharing(sessions, client)
    }

    /// [`contend`](Self::contend) with at most `sessions` sessions (each its
    /// own client), the contenders spread over them in turn: contenders of
    /// one session queue for the lock in this process first (a session has
    /// one entry per lock), so the server sees at most `sessions` of this
    /// child's entries at once. The child counts as queued once every
    /// session has appended an entry.
    ///
    /// # Errors
    ///
    /// As [`contend`](Self::contend).
    pub fn contend_sharing(self, sessions: usize, client: impl Fn() -> Client) -> BoxResult<()> {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(contend(self, sessions, client))
    }
}

async fn contend(child: CrowdChild, sessions: usize, client: impl Fn() -> Client) -> BoxResult<()> {
    let name = format!("crowd/{}", child.run);
    let session_count = sessions.clamp(1, child.contenders.max(1));
    let mut clients = Vec::new();
    let mut opened = Vec::new();
    for _ in 0..session_count {
        let client = client();
        let session = client.session_with(SessionOptions::new().with_ttl(SESSION_TTL)).await?;
        opened.push(session);
        clients.push(client);
    }
    let mutexes = (0..child.contenders)
        .map(|i| opened[i % session_count].mutex(&name))
        .collect::<lockline::Result<Vec<_>>>()?;
    child.ready()?;
    let records = Arc::new(StdMutex::new(Vec::<GrantRecord>::new()));
    let tasks: Vec<_> = mutexes
        .iter()
        .map(|mutex| tokio::spawn(contender(mutex.clone(), Arc::clone(&records))))
        .collect();
    tokio::time::timeout(QUEUE_TIMEOUT, async {
        for client in &clients {
            client.wait_for_stats(|s| s.appends >= 1).await;
        }
    })
    .await
    .map_err(|_| "crowd child: contenders did not queue within 120 s")?;
    let window = child.queued()?;
    tokio::time::sleep(window.until_start()).await;
    let before = counts(&clients);
    tokio::time::sleep(window.until_end()).await;
    let during = counts(&clients).since(before);
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        if let Ok(Err(error)) = task.await {
            return Err(format!("crowd child: a contender failed: {error}").into());
        }
    }
    let records = std::mem::take(&mut *records.lock().expect("records"));
    child.report(during, &records, window)?;
    let closes: Vec<_> = opened
        .into_iter()
        .map(|session| tokio::spawn(async move { session.close().await }))
        .collect();
    tokio::time::timeout(CLOSE_TIMEOUT, async {
        for close in closes {
            let _ = close.await;
        }
    })
    .await
    .map_err(|_| "crowd child: sessions did not close within 30 s")?;
    Ok(())
}

/// One contender: lock → record → release, until aborted.
async fn contender(mutex: lockline::Mutex, records: Arc<StdMutex<Vec<GrantRecord>>>) -> lockline::Result<()> {
    loop {
        let guard = mutex.lock().await?;
        let granted_ns = unix_nanos();
        let token = guard.token().get();
        let release_started_ns = unix_nanos();
        records.lock().expect("records").push(GrantRecord {
            token,
            granted_ns,
            release_started_ns,
        });
        guard.release().await?;
    }
}
