//! A session's wait connections: bounded, given to the waiters nearest the
//! heads of their queues first.
//!
//! Waiting on a guard blocks a connection on the server, so a session with
//! many waiters would need as many connections. It keeps at most `max`; a
//! waiter asks with a priority (the order of the entry it waits on: smaller
//! is nearer the head) and the smallest asks are served first. When every
//! connection is busy and a waiter nearer the head asks, the busy wait
//! farthest from the head is preempted (its server-side wait cancelled, its
//! waiter asks again). So the contender next in line always has a connection
//! and the queue moves, whatever its length.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};

use tokio::sync::{oneshot, Notify};

/// A flag set once, that tasks wait for: a busy wait that must give its
/// connection up, one of a session's own entries found gone.
#[derive(Debug, Default)]
pub(crate) struct Stop {
    set: AtomicBool,
    notify: Notify,
}

impl Stop {
    pub(crate) fn signal(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    pub(crate) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

/// One wait connection, with its server-side id.
#[derive(Debug)]
pub(crate) struct Idle<C> {
    pub(crate) conn: C,
    pub(crate) server_id: i64,
}

/// What a waiter gets: a connection to wait on (or the right to open one),
/// and the signal that it must give it up.
#[derive(Debug)]
pub(crate) struct Lease<C> {
    pub(crate) conn: Option<Idle<C>>,
    pub(crate) key: (i64, u64),
    pub(crate) preempt: Arc<Stop>,
}

struct State<C> {
    idle: Vec<Idle<C>>,
    /// Connections open or being opened (idle ones included).
    open: usize,
    queue: BTreeMap<(i64, u64), oneshot::Sender<Lease<C>>>,
    busy: BTreeMap<(i64, u64), Arc<Stop>>,
    next: u64,
    closed: bool,
}

/// The pool (see the module docs).
pub(crate) struct WaitPool<C> {
    max: usize,
    state: std::sync::Mutex<State<C>>,
}

impl<C> std::fmt::Debug for WaitPool<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state();
        f.debug_struct("WaitPool")
            .field("max", &self.max)
            .field("open", &state.open)
            .field("idle", &state.idle.len())
            .field("queued", &state.queue.len())
            .field("busy", &state.busy.len())
            .finish()
    }
}

/// Gives its place back if the waiter goes before it is served.
struct Queued<'a, C> {
    pool: &'a WaitPool<C>,
    key: (i64, u64),
    rx: oneshot::Receiver<Lease<C>>,
}

impl<C> Drop for Queued<'_, C> {
    fn drop(&mut self) {
        self.pool.state().queue.remove(&self.key);
        // A lease sent just before: hand it on.
        self.rx.close();
        if let Ok(lease) = self.rx.try_recv() {
            self.pool.give_back(lease);
        }
    }
}

impl<C> WaitPool<C> {
    pub(crate) fn new(max: usize) -> Self {
        WaitPool {
            max: max.max(1),
            state: std::sync::Mutex::new(State {
                idle: Vec::new(),
                open: 0,
                queue: BTreeMap::new(),
                busy: BTreeMap::new(),
                next: 0,
                closed: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<C>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A lease for a waiter with `priority` (smaller first). Its `conn` is
    /// `None` when the waiter is to open a new connection itself (and call
    /// [`release`](Self::release) without one if it cannot). `None` once the
    /// pool is closed.
    ///
    /// Cancel safe: a waiter dropped while queued gives its place back.
    pub(crate) async fn acquire(&self, priority: i64) -> Option<Lease<C>> {
        let queued = {
            let mut state = self.state();
            if state.closed {
                return None;
            }
            let key = (priority, state.next);
            state.next += 1;
            let preempt = Arc::new(Stop::default());
            if let Some(conn) = state.idle.pop() {
                state.busy.insert(key, Arc::clone(&preempt));
                return Some(Lease {
                    conn: Some(conn),
                    key,
                    preempt,
                });
            }
            if state.open < self.max {
                state.open += 1;
                state.busy.insert(key, Arc::clone(&preempt));
                return Some(Lease {
                    conn: None,
                    key,
                    preempt,
                });
            }
            // Full: the busy wait farthest from the head gives way to one
            // nearer the head.
            if let Some((_, stop)) = state.busy.last_key_value().filter(|(k, _)| **k > key) {
                stop.signal();
            }
            let (tx, rx) = oneshot::channel();
            state.queue.insert(key, tx);
            Queued { pool: self, key, rx }
        };
        let mut queued = queued;
        (&mut queued.rx).await.ok()
    }

    /// Returns a lease's connection (or, with `None`, its slot) to the pool:
    /// to the queued waiter nearest the head, or to the idle list.
    pub(crate) fn release(&self, key: (i64, u64), conn: Option<Idle<C>>) {
        let mut state = self.state();
        state.busy.remove(&key);
        let Some(conn) = conn else {
            state.open = state.open.saturating_sub(1);
            // A slot freed: the first queued waiter may open one.
            if let Some((key, tx)) = state.queue.pop_first() {
                state.open += 1;
                let preempt = Arc::new(Stop::default());
                state.busy.insert(key, Arc::clone(&preempt));
                if let Err(lease) = tx.send(Lease {
                    conn: None,
                    key,
                    preempt,
                }) {
                    state.busy.remove(&lease.key);
                    state.open -= 1;
                }
            }
            return;
        };
        if state.closed {
            state.open = state.open.saturating_sub(1);
            return;
        }
        let mut conn = Some(conn);
        while let Some((key, tx)) = state.queue.pop_first() {
            let preempt = Arc::new(Stop::default());
            state.busy.insert(key, Arc::clone(&preempt));
            match tx.send(Lease {
                conn: conn.take(),
                key,
                preempt,
            }) {
                Ok(()) => return,
                Err(mut lease) => {
                    state.busy.remove(&lease.key);
                    conn = lease.conn.take();
                }
            }
        }
        if let Some(conn) = conn {
            state.idle.push(conn);
        }
    }

    /// A lease given back unused.
    fn give_back(&self, lease: Lease<C>) {
        self.release(lease.key, lease.conn);
    }

    /// Closes the pool: every busy wait is told to stop, idle connections
    /// are returned for closing, queued waiters get `None`.
    pub(crate) fn close(&self) -> Vec<Idle<C>> {
        let mut state = self.state();
        state.closed = true;
        for stop in state.busy.values() {
            stop.signal();
        }
        state.queue.clear();
        let idle = std::mem::take(&mut state.idle);
        state.open = state.open.saturating_sub(idle.len());
        idle
    }

    /// Connections open now (busy or idle).
    #[allow(dead_code)]
    pub(crate) fn open_count(&self) -> usize {
        self.state().open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(id: i64) -> Idle<i64> {
        Idle {
            conn: id,
            server_id: id,
        }
    }

    #[tokio::test]
    async fn serves_the_nearest_to_the_head_first_and_preempts_the_farthest() {
        let pool = Arc::new(WaitPool::<i64>::new(2));
        let a = pool.acquire(10).await.expect("lease");
        assert!(a.conn.is_none(), "the first waiters open connections");
        let b = pool.acquire(20).await.expect("lease");
        // Full. A waiter farther from the head than both queues without
        // preempting anyone.
        let far = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.acquire(30).await.map(|l| l.key.0) }
        });
        tokio::task::yield_now().await;
        assert!(!a.preempt.is_set() && !b.preempt.is_set());
        // One nearer the head preempts the farthest busy wait (20).
        let near = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.acquire(5).await.map(|l| (l.key.0, l.conn.map(|c| c.conn))) }
        });
        while !b.preempt.is_set() {
            tokio::task::yield_now().await;
        }
        assert!(!a.preempt.is_set());
        pool.release(b.key, Some(idle(2)));
        assert_eq!(near.await.expect("join"), Some((5, Some(2))));
        pool.release(a.key, Some(idle(1)));
        assert_eq!(far.await.expect("join"), Some(30));
    }

    #[tokio::test]
    async fn a_waiter_dropped_while_queued_gives_its_place_back() {
        let pool = WaitPool::<i64>::new(1);
        let a = pool.acquire(1).await.expect("lease");
        {
            let queued = pool.acquire(2);
            tokio::pin!(queued);
            assert!(futures::poll!(queued.as_mut()).is_pending());
        }
        pool.release(a.key, Some(idle(7)));
        let again = pool.acquire(3).await.expect("lease");
        assert_eq!(again.conn.map(|c| c.conn), Some(7));
    }

    #[tokio::test]
    async fn a_failed_open_frees_its_slot_for_the_next() {
        let pool = Arc::new(WaitPool::<i64>::new(1));
        let a = pool.acquire(1).await.expect("lease");
        let next = tokio::spawn({
            let pool = Arc::clone(&pool);
            async move { pool.acquire(2).await.map(|l| l.conn.is_none()) }
        });
        tokio::task::yield_now().await;
        pool.release(a.key, None);
        assert_eq!(next.await.expect("join"), Some(true));
        assert_eq!(pool.open_count(), 1);
        assert!(pool.close().is_empty());
        assert!(pool.acquire(1).await.is_none());
    }
}
