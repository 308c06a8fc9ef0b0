//! Notices of writes to lock-mode entries by sessions that do not own them
//! (PostgreSQL: `LISTEN` on each watched entry's channel): one connection
//! per session, however many entries it watches, opened while it watches
//! any (and a keepalive interval longer).
//!
//! A watcher blocks on the server on the lock its entry's owner holds for
//! the entry's version, which wakes it when the owner writes or removes the
//! entry or its connection ends; a write by another session cannot let go
//! of that lock, so it notifies the entry's channel instead, and this
//! connection wakes the watchers of that entry alone (no herd). The
//! connection is proven alive by a round trip each keepalive interval; one
//! that fails or goes silent is made again, and every watcher woken (a
//! notice may have been missed while it was down: each reads its entry
//! again).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use crate::dialect::{DbResult, Dialect, Listener, Written};

/// What a watcher asks of the notices' task.
enum Command {
    /// Hear of entry `id`: answered once the server listens.
    Listen(i64, oneshot::Sender<DbResult<watch::Receiver<Heard>>>),
    /// One watcher of `id` is done.
    Unlisten(i64),
}

/// A session's notices: the task that owns the listening connection.
#[derive(Debug)]
pub(crate) struct Notices {
    commands: mpsc::UnboundedSender<Command>,
}

/// The notices of one entry so far: how many, and the write the last one
/// carried, with the count of the first of the notices since that each
/// carried one (a removal, a notice too long to carry its value, or a
/// connection made again carries none).
#[derive(Debug, Clone, Default)]
pub(crate) struct Heard {
    count: u64,
    written: Option<(u64, Written)>,
}

impl Heard {
    fn add(&mut self, written: Option<Written>) {
        self.count = self.count.wrapping_add(1);
        self.written = written.map(|write| {
            let since = self.written.as_ref().map_or(self.count, |(since, _)| *since);
            (since, write)
        });
    }
}

/// One watcher's subscription to an entry's notices; stops them when
/// dropped (the last watcher's drop stops the listening).
#[derive(Debug)]
pub(crate) struct Subscription {
    id: i64,
    notices: watch::Receiver<Heard>,
    /// How many notices this watcher has seen.
    seen: u64,
    commands: mpsc::UnboundedSender<Command>,
}

impl Subscription {
    /// Marks every notice so far as seen: call before reading the entry.
    pub(crate) fn seen(&mut self) {
        self.seen = self.notices.borrow_and_update().count;
    }

    /// Resolves at the first notice not seen (or never, once the task is
    /// gone with its session), marking every notice so far seen: with the
    /// last write (its version and value) when every notice since the last
    /// seen carried one (the watcher need not read the entry to know it),
    /// `None` when the entry must be read. A notice may arrive after a read
    /// that already saw its write: the caller tells it by its version.
    pub(crate) async fn changed(&mut self) -> Option<Written> {
        if self.notices.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        let heard = self.notices.borrow_and_update().clone();
        let seen = std::mem::replace(&mut self.seen, heard.count);
        match heard.written {
            Some((since, write)) if since <= seen + 1 => Some(write),
            _ => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Unlisten(self.id));
    }
}

impl Notices {
    /// Starts the task (it connects when a watcher first asks); the handle
    /// aborts it.
    pub(crate) fn start<D: Dialect>(
        dialect: Arc<D>,
        interval: Duration,
        timeout: Duration,
    ) -> (Self, tokio::task::AbortHandle) {
        let (commands, receiver) = mpsc::unbounded_channel();
        let task = Task {
            dialect,
            interval,
            timeout,
            listener: None,
            channels: HashMap::new(),
            idle: false,
        };
        let handle = tokio::spawn(task.run(receiver)).abort_handle();
        (Notices { commands }, handle)
    }

    /// Subscribes to entry `id`'s notices; returns once the server listens
    /// (or at once when another watcher of this session listens already).
    ///
    /// # Errors
    ///
    /// The connection could not be made or would not listen; `None` when
    /// the task is gone (the session is over).
    pub(crate) async fn subscribe(&self, id: i64) -> Option<DbResult<Subscription>> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(Command::Listen(id, reply)).ok()?;
        let notices = answer.await.ok()?;
        Some(notices.map(|notices| {
            let seen = notices.borrow().count;
            Subscription {
                id,
                notices,
                seen,
                commands: self.commands.clone(),
            }
        }))
    }
}

struct Task<D: Dialect> {
    dialect: Arc<D>,
    interval: Duration,
    timeout: Duration,
    listener: Option<Box<dyn Listener>>,
    /// Each entry listened to: its watchers, and the count of its notices.
    channels: HashMap<i64, (usize, watch::Sender<Heard>)>,
    /// The connection listened to nothing at the last tick: it goes at the
    /// next if it still does (kept meanwhile for the next watch: a waiter
    /// of a busy lock watches one entry after another).
    idle: bool,
}

/// The next notice of `listener`, or never while there is none.
async fn next(listener: &mut Option<Box<dyn Listener>>) -> DbResult<Option<(i64, Option<Written>)>> {
    match listener {
        Some(listener) => listener.recv().await,
        None => std::future::pending().await,
    }
}

impl<D: Dialect> Task<D> {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        let mut ticks = tokio::time::interval(self.interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    None => return,
                    Some(Command::Listen(id, reply)) => {
                        let answer = self.listen(id).await;
                        let _ = reply.send(answer);
                    }
                    Some(Command::Unlisten(id)) => self.unlisten(id).await,
                },
                notice = next(&mut self.listener) => match notice {
                    Ok(Some((id, written))) => {
                        if let Some((_, heard)) = self.channels.get(&id) {
                            heard.send_modify(|heard| heard.add(written));
                        }
                    }
                    // Lost and made again by the driver (listening again
                    // to every channel): notices may have been missed.
                    Ok(None) => self.wake_all(),
                    Err(error) => self.broke(&error),
                },
                _ = ticks.tick() => self.prove().await,
            }
        }
    }

    /// Every watcher reads its entry again.
    fn wake_all(&self) {
        for (_, heard) in self.channels.values() {
            heard.send_modify(|heard| heard.add(None));
        }
    }

    /// The connection failed: given up (made again when needed), every
    /// watcher woken.
    fn broke(&mut self, error: &dyn std::fmt::Display) {
        tracing::debug!(%error, "the connection that hears of entries' writes failed; making it again");
        self.listener = None;
        self.wake_all();
    }

    /// Makes the connection, listening to every channel, if there is none.
    async fn connect(&mut self) -> DbResult<()> {
        if self.listener.is_some() {
            return Ok(());
        }
        let made = async {
            let Some(mut listener) = self.dialect.listener().await? else {
                return Err(sqlx::Error::Configuration(
                    "this database engine has no notifications".into(),
                ));
            };
            for id in self.channels.keys() {
                listener.listen(*id).await?;
            }
            Ok(listener)
        };
        let listener = bounded(self.timeout, made).await?;
        self.listener = Some(listener);
        // Anything sent while there was no connection was missed.
        self.wake_all();
        Ok(())
    }

    async fn listen(&mut self, id: i64) -> DbResult<watch::Receiver<Heard>> {
        self.idle = false;
        if let Some((watchers, count)) = self.channels.get_mut(&id) {
            if self.listener.is_some() {
                *watchers += 1;
                return Ok(count.subscribe());
            }
        }
        self.connect().await?;
        if let Some((watchers, count)) = self.channels.get_mut(&id) {
            // Listened to again by the connect.
            *watchers += 1;
            return Ok(count.subscribe());
        }
        let listened = match self.listener.as_mut() {
            Some(listener) => bounded(self.timeout, listener.listen(id)).await,
            None => Err(sqlx::Error::PoolClosed),
        };
        if let Err(error) = listened {
            self.broke(&error);
            return Err(error);
        }
        let heard = watch::Sender::new(Heard::default());
        let receiver = heard.subscribe();
        self.channels.insert(id, (1, heard));
        Ok(receiver)
    }

    async fn unlisten(&mut self, id: i64) {
        let Some((watchers, _)) = self.channels.get_mut(&id) else {
            return;
        };
        *watchers -= 1;
        if *watchers > 0 {
            return;
        }
        self.channels.remove(&id);
        if let Some(listener) = self.listener.as_mut() {
            if let Err(error) = bounded(self.timeout, listener.unlisten(id)).await {
                self.broke(&error);
            }
        }
    }

    /// Each keepalive interval while anything is watched: a round trip on
    /// the connection (made again if it is missing or does not answer).
    /// Nothing watched for a whole interval: the connection goes until it
    /// is needed again.
    async fn prove(&mut self) {
        if self.channels.is_empty() {
            if std::mem::replace(&mut self.idle, true) {
                self.listener = None;
            }
            return;
        }
        self.idle = false;
        let proven = match self.listener.as_mut() {
            Some(listener) => bounded(self.timeout, listener.ping()).await,
            None => self.connect().await,
        };
        if let Err(error) = proven {
            self.broke(&error);
        }
    }
}

/// `work` within `timeout`, or a timeout error.
async fn bounded<T>(timeout: Duration, work: impl std::future::Future<Output = DbResult<T>>) -> DbResult<T> {
    match tokio::time::timeout(timeout, work).await {
        Ok(result) => result,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        ))),
    }
}
