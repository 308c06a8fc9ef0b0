//! Waits on the server: each in a task of its own on a wait connection of
//! the session's bounded pool (nearest the head of its queue first), cut
//! short and cancelled on the server when its waiter goes away, bounded so
//! that a silent owner is judged (and ended) and a silent connection given
//! up; and the wait for a reset holder to hear it lost its lock.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use lockline::{Error, Result};
use tokio::sync::oneshot;

use super::Shared;
use crate::dialect::{DbResult, Dialect, Found, Purpose, Reaped, Turn, TurnRead, Waited, Watch, Watched};
use crate::error::{interrupted, map, timed_out};
use crate::pool::{Idle, Lease, Stop};

/// A wait-pool slot, given back without a connection when dropped unless
/// taken (`key` set to `None`): by a lease's future dropped while it opens
/// its connection, or by a wait task dropped before it gives the slot back
/// itself (with the runtime it runs on, also before its first poll: the
/// guard is made before the task and moved into it).
struct SlotBack<D: Dialect> {
    shared: Arc<Shared<D>>,
    key: Option<(i64, u64)>,
}

impl<D: Dialect> Drop for SlotBack<D> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.shared.waits.release(key, None);
        }
    }
}

impl<D: Dialect> Shared<D> {
    /// A wait connection for a waiter with `priority`, opened if the pool
    /// has room.
    ///
    /// Cancel safe: a waiter dropped while its connection is being opened
    /// gives the pool its slot back.
    pub(super) async fn lease(self: &Arc<Self>, priority: i64) -> Result<Lease<D::Conn>> {
        let mut lease = self.waits.acquire(priority).await.ok_or_else(|| self.over_error())?;
        if lease.conn.is_none() {
            let mut opening = SlotBack {
                shared: Arc::clone(self),
                key: Some(lease.key),
            };
            let timeout = self.options.connect_timeout();
            match tokio::time::timeout(timeout, self.dialect.connect(Purpose::Wait)).await {
                Ok(Ok((conn, server_id))) => {
                    opening.key = None;
                    lease.conn = Some(Idle { conn, server_id });
                }
                Ok(Err(error)) => return Err(map(self.doing("open a wait connection"), error)),
                Err(_) => return Err(timed_out(self.doing("open a wait connection"), timeout)),
            }
        }
        Ok(lease)
    }

    /// Waits on the server until the lock `on` names is free, on one wait
    /// connection, in a task of its own so that a waiter dropped midway
    /// still ends the server-side wait (cancel) and gets the connection back.
    /// `Ok(true)` when the entry went with its owner's connection or
    /// session (lost), `Ok(false)` when its owner released it.
    pub(super) async fn wait_on(self: &Arc<Self>, on: WaitOn, owner: &str, priority: i64) -> Result<bool> {
        self.wait_on_server(on, owner, priority, None, None).await
    }

    /// As [`wait_on`](Self::wait_on) on entry `id`'s guard, reading the
    /// waiter's `turn` in the wait's own statement; the turn as read, when
    /// the wait read it (a wait of a waiter without a wait connection, or
    /// one cut short, reads nothing: the waiter reads on its own).
    pub(super) async fn wait_on_turn(
        self: &Arc<Self>,
        id: i64,
        owner: &str,
        priority: i64,
        turn: Turn,
    ) -> Result<(bool, Option<TurnRead>)> {
        let slot: TurnSlot = Arc::new((turn, std::sync::Mutex::new(None)));
        let lost = self
            .wait_on_server(WaitOn::Guard(id), owner, priority, None, Some(&slot))
            .await?;
        let read = slot.1.lock().unwrap_or_else(PoisonError::into_inner).take();
        // With the reset grace, a read before the reset holder was
        // outlived is stale.
        Ok((lost, read.filter(|_| !(lost && self.reset_grace))))
    }

    /// With the reset grace: after `owner`'s entry `id` was freed with its
    /// owner's connection, waits until that owner has heard `lost()` (its
    /// session row is gone: it ends its session itself at its next
    /// heartbeat, after telling its holders) or its heartbeat has stood
    /// still for its TTL by our clock (then it is ended here). Its count is
    /// read a few times a TTL meanwhile: there is nothing on the server to
    /// block on once a connection is gone.
    pub(super) async fn outlive(self: &Arc<Self>, owner: &str, id: i64) -> Result<()> {
        loop {
            self.check_live()?;
            let beat = on_control!(self, "look at a reset holder's session", |d, conn| d
                .beat_of(conn, owner))?;
            let Some(beat) = beat else {
                return Ok(());
            };
            if self.silent(owner, beat) {
                let reaped = on_control!(self, "end a reset holder's session", |d, conn| d
                    .reap(conn, owner, id, beat.count))?;
                if reaped != Reaped::Renewed {
                    self.forget_beat(owner);
                    return Ok(());
                }
                continue;
            }
            tokio::time::sleep(self.wait_bound(owner)).await;
        }
    }

    /// Waits on the server (see [`wait_on`](Self::wait_on)); a lock-mode
    /// watch's wait also puts into `found` the entry as it read it after
    /// waking, and a wait on a guard into `turn` the waiter's turn, if it
    /// read them. With the reset grace, an entry lost with its owner's
    /// connection is waited past until that owner was told (see
    /// [`outlive`](Self::outlive)).
    pub(super) async fn wait_on_server(
        self: &Arc<Self>,
        on: WaitOn,
        owner: &str,
        priority: i64,
        found: Option<&FoundSlot>,
        turn: Option<&TurnSlot>,
    ) -> Result<bool> {
        let lost = loop {
            self.check_live()?;
            // While no wait connection is free, the overflow check looks at
            // the entry (with every other such waiter's, in one statement)
            // and says when it is gone: a waiter beyond the connections is
            // not stuck behind waits that may last long (another lock held
            // for hours, an election).
            let (key, gone, gone_lost) = self.register_overflow(on);
            let lease = tokio::select! {
                lease = self.lease(priority) => lease,
                () = gone.wait() => {
                    self.unregister_overflow(key);
                    break gone_lost.load(Ordering::SeqCst);
                }
            };
            self.unregister_overflow(key);
            let lease = lease?;
            let stop = Arc::new(Stop::default());
            let (tx, rx) = oneshot::channel();
            let task = WaitTask {
                shared: Arc::clone(self),
                on,
                owner: owner.to_owned(),
                stop: Arc::clone(&stop),
                found: found.cloned(),
                turn: turn.cloned(),
            };
            let slot = SlotBack {
                shared: Arc::clone(self),
                key: Some(lease.key),
            };
            tokio::spawn(task.run(lease, tx, slot));
            let _stop_on_drop = StopOnDrop(stop);
            match rx.await {
                Ok(TaskOutcome::Released) => break false,
                Ok(TaskOutcome::Lost) => break true,
                Ok(TaskOutcome::Preempted) => {}
                Ok(TaskOutcome::Failed(error)) => return Err(error),
                Err(_) => return Err(self.over_error()),
            }
        };
        if lost && self.reset_grace {
            if let WaitOn::Guard(id) | WaitOn::Watch(id, ..) = on {
                self.outlive(owner, id).await?;
            }
        }
        Ok(lost)
    }
}

/// What a wait blocks on.
#[derive(Debug, Clone, Copy)]
pub(super) enum WaitOn {
    /// An entry's guard: until it is gone.
    Guard(i64),
    /// An election entry's value version: until its owner writes it.
    Version(i64, i64),
    /// A lock-mode entry at a version, and its owner's value lock of an
    /// epoch: until anyone writes it, or it is gone. With `true` (quiet,
    /// MariaDB/MySQL): the owner's value lock alone, with no watch slot, so
    /// that another session's write neither wakes the wait nor is told to
    /// it: until the owner writes or removes it, or its connection ends
    /// (for an entry [`only_owner_unblocks`](lockline::backend::only_owner_unblocks)
    /// accepts).
    Watch(i64, Watched<()>, bool),
}

/// How one server-side wait ended: on its own, or stopped (and then
/// whether the statement finished cleanly after the cancel, if it finished).
enum Step {
    Done(DbResult<Waited>),
    /// No answer within the wait's bound and the request timeout.
    Silent,
    Stopped(Option<bool>),
}

enum TaskOutcome {
    Released,
    /// Free because its owner's connection or session ended.
    Lost,
    Preempted,
    Failed(Error),
}

/// Signals a wait task to stop when the waiter goes away.
struct StopOnDrop(Arc<Stop>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.signal();
    }
}

struct WaitTask<D: Dialect> {
    shared: Arc<Shared<D>>,
    on: WaitOn,
    owner: String,
    stop: Arc<Stop>,
    /// Where a lock-mode watch's wait puts the entry as it read it.
    found: Option<FoundSlot>,
    /// Where a wait on a guard that reads its waiter's turn puts the read.
    turn: Option<TurnSlot>,
}

/// A waiter's turn to read in its wait's own statement, and where the wait
/// puts what it read.
pub(super) type TurnSlot = Arc<(Turn, std::sync::Mutex<Option<TurnRead>>)>;

/// The entry as a watch's wait read it after waking (see
/// `Dialect::wait_watch`), for the watcher to take.
pub(super) type FoundSlot = Arc<std::sync::Mutex<Option<Found>>>;

impl<D: Dialect> WaitTask<D> {
    /// Waits on the lease's connection, gives the lease back and tells the
    /// waiter how the wait ended.
    ///
    /// The task runs on its waiter's runtime: dropped with it (the runtime
    /// shut down), `slot` gives its slot back, its connection closing with
    /// it.
    async fn run(self, mut lease: Lease<D::Conn>, reply: oneshot::Sender<TaskOutcome>, mut slot: SlotBack<D>) {
        let Some(mut idle) = lease.conn.take() else {
            return;
        };
        let (outcome, keep) = self.wait(&mut idle, &lease.preempt).await;
        slot.key = None;
        self.shared.waits.release(lease.key, keep.then_some(idle));
        let _ = reply.send(outcome);
    }

    /// Returns the outcome and whether the connection may be used again.
    ///
    /// Each server-side wait is bounded (see `Shared::wait_bound`), and so
    /// is the await of its answer, by that bound plus the request timeout:
    /// a wait connection that stops answering (a NAT forgot the flow) is
    /// given up and the wait asked again on a fresh one, instead of leaving
    /// its waiter — who may be next in line — deaf to the release.
    async fn wait(&self, idle: &mut Idle<D::Conn>, preempt: &Stop) -> (TaskOutcome, bool) {
        let shared = &self.shared;
        let dialect = &*shared.dialect;
        let request_timeout = shared.options.request_timeout();
        // Set once this wait ended the owner's session: what frees the
        // entry then is that end, not a release.
        let mut lost_by_reaping = false;
        loop {
            let stopped = async {
                tokio::select! {
                    () = self.stop.wait() => {}
                    () = preempt.wait() => {}
                }
            };
            let server_id = idle.server_id;
            let bound = shared.wait_bound(&self.owner);
            let bound_ms = i64::try_from(bound.as_millis()).unwrap_or(i64::MAX).max(1);
            let step = {
                let call = async {
                    match self.on {
                        WaitOn::Guard(id) => match &self.turn {
                            Some(slot) => {
                                let waited = dialect
                                    .wait_turn(&mut idle.conn, id, &self.owner, bound_ms, &slot.0)
                                    .await;
                                waited.map(|(waited, read)| {
                                    if let Some(read) = read {
                                        *slot.1.lock().unwrap_or_else(PoisonError::into_inner) = Some(read);
                                    }
                                    waited
                                })
                            }
                            None => dialect.wait(&mut idle.conn, id, &self.owner, bound_ms).await,
                        },
                        WaitOn::Version(id, version) => {
                            dialect
                                .wait_version(&mut idle.conn, id, version, &self.owner, bound_ms)
                                .await
                        }
                        // The owner's value lock of that epoch: the lock an
                        // election's value version takes on MariaDB/MySQL.
                        WaitOn::Watch(id, at, true) => {
                            dialect
                                .wait_version(&mut idle.conn, id, at.epoch, &self.owner, bound_ms)
                                .await
                        }
                        WaitOn::Watch(id, at, false) => {
                            let watch = Watch {
                                id,
                                at,
                                session: &shared.id,
                                owner: &self.owner,
                                bound_ms,
                            };
                            let watched = dialect.wait_watch(&mut idle.conn, &watch).await;
                            watched.map(|(waited, found)| {
                                if let (Some(slot), Some(found)) = (&self.found, found) {
                                    *slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(found);
                                }
                                waited
                            })
                        }
                    }
                };
                tokio::pin!(call);
                tokio::select! {
                    result = tokio::time::timeout(bound + request_timeout, &mut call) => match result {
                        Ok(result) => Step::Done(result),
                        Err(_) => Step::Silent,
                    },
                    () = stopped => {
                        // End the server-side wait, then read what it
                        // answered: a wait that ended on its own just before
                        // is harmless (it let go of what it took).
                        let cancelled = on_control!(shared, "cancel a wait", |d, conn| d.cancel(conn, server_id));
                        let finished = if cancelled.is_ok() {
                            tokio::time::timeout(request_timeout, &mut call).await.ok()
                        } else {
                            None
                        };
                        Step::Stopped(finished.map(|r| r.is_ok()))
                    }
                }
            };
            let waited = match step {
                Step::Done(waited) => waited,
                Step::Silent => return self.silent_connection(server_id),
                Step::Stopped(finished) => {
                    let usable = match finished {
                        Some(true) => true,
                        Some(false) => tokio::time::timeout(request_timeout, dialect.reset(&mut idle.conn))
                            .await
                            .is_ok_and(|r| r.is_ok()),
                        None => false,
                    };
                    let outcome = if self.stop.is_set() {
                        TaskOutcome::Failed(shared.over_error())
                    } else {
                        TaskOutcome::Preempted
                    };
                    return (outcome, usable && !shared.state.borrow().is_over());
                }
            };
            let beat = match waited {
                Ok(Waited::Released) if lost_by_reaping => return (TaskOutcome::Lost, true),
                Ok(Waited::Released) => return (TaskOutcome::Released, true),
                Ok(Waited::Lost) => return (TaskOutcome::Lost, true),
                Ok(Waited::TimedOut(beat)) => beat,
                // A writer's wake (MariaDB/MySQL): a watcher reads its
                // entry again; any other wait was hit by a wake meant for
                // this connection's watch before, and asks again.
                Ok(Waited::Interrupted) => {
                    if matches!(self.on, WaitOn::Watch(..)) {
                        return (TaskOutcome::Released, true);
                    }
                    continue;
                }
                Err(error) if interrupted(&error) && !self.stop.is_set() => {
                    let reset = tokio::time::timeout(request_timeout, dialect.reset(&mut idle.conn)).await;
                    if !reset.is_ok_and(|r| r.is_ok()) {
                        return (TaskOutcome::Preempted, false);
                    }
                    if matches!(self.on, WaitOn::Watch(..)) {
                        return (TaskOutcome::Released, true);
                    }
                    continue;
                }
                Err(error) => {
                    return (TaskOutcome::Failed(map(shared.doing("wait on a guard"), error)), false);
                }
            };
            // The owner did not let go within the bound: end it if its
            // heartbeat has not moved for its TTL by our clock.
            let reaped = match beat {
                Some(beat) if shared.silent(&self.owner, beat) => {
                    let id = match self.on {
                        WaitOn::Guard(id) | WaitOn::Version(id, _) | WaitOn::Watch(id, ..) => id,
                    };
                    let reaping = dialect.reap(&mut idle.conn, &self.owner, id, beat.count);
                    match tokio::time::timeout(request_timeout, reaping).await {
                        Ok(Ok(reaped)) => reaped,
                        Ok(Err(error)) if interrupted(&error) && !self.stop.is_set() => {
                            // A wake meant for this connection's watch
                            // before: look again, on a fresh connection.
                            return (TaskOutcome::Preempted, false);
                        }
                        Ok(Err(error)) => {
                            // Not reused: a statement that failed may have
                            // left a transaction (and its row locks) open.
                            return (
                                TaskOutcome::Failed(map(shared.doing("end a silent holder's session"), error)),
                                false,
                            );
                        }
                        Err(_) => return self.silent_connection(server_id),
                    }
                }
                Some(_) => Reaped::Renewed,
                // No session row: nothing to judge; wait again (a version
                // lock's owner is gone with it).
                None => Reaped::Gone,
            };
            match reaped {
                Reaped::Renewed => {}
                Reaped::Gone | Reaped::Ended => {
                    if reaped == Reaped::Ended {
                        tracing::info!(session = %shared.id, owner = %self.owner, "ended a session that stopped renewing");
                        lost_by_reaping = true;
                    }
                    shared.forget_beat(&self.owner);
                    // Its guard is free, or will be once the server has
                    // ended its connection: wait for that too.
                    if matches!(self.on, WaitOn::Version(..) | WaitOn::Watch(..)) {
                        return (TaskOutcome::Released, true);
                    }
                }
            }
        }
    }

    /// A wait connection that stopped answering: given up (never used
    /// again), and the wait asked again on a fresh one.
    fn silent_connection(&self, server_id: i64) -> (TaskOutcome, bool) {
        tracing::warn!(
            session = %self.shared.id,
            server_id,
            target = %self.shared.target,
            "a wait connection stopped answering; waiting again on a fresh one"
        );
        (TaskOutcome::Preempted, false)
    }
}
