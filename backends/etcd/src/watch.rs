//! One watch stream per session, multiplexing every watch the session opens.
//!
//! etcd watch streams carry any number of watches told apart by watch id; the
//! hub task owns the stream, assigns ids, and routes each response to the one
//! watch it belongs to. So 10,000 waiters of one session are 10,000 watch ids on
//! one gRPC stream, not 10,000 streams.
//!
//! The stream proves itself alive on its own, whatever the transport does
//! (DESIGN rule 18): while it carries a watch and has been silent for a
//! probe interval, the hub asks the server for a progress notification
//! (etcd's `WatchProgressRequest`, answered at once on the same stream);
//! heard nothing within the request timeout, the stream is taken for dead
//! and ended, and every watch on it ends with `Broken`, so its waiters read
//! again and watch anew, on a stream the balancer opens on a live
//! connection. A connection a middlebox silently forgot (no reset, packets
//! dropped) thus costs a waiter at most a probe interval and a request
//! timeout, even without HTTP/2 keepalive in the connect options. Every
//! await of the hub on the stream is bounded by the request timeout too.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How the reason of a [`Signal::Broken`] begins when the server canceled the
/// watch (history compacted away, a refused create), not the stream.
pub(crate) const WATCH_CANCELED: &str = "watch canceled by the server";

/// What a watch reports.
#[derive(Debug)]
pub(crate) enum Signal {
    /// The server created the watch: every event after `revision` (the
    /// member's revision when it took the watch) follows.
    Created { revision: i64 },
    /// A key was written (the watched key, or one under the watched prefix).
    /// Boxed, as is `Broken`'s reason: every watch has a channel of these,
    /// and a session may hold 100,000 locks, each watching its entry.
    Put(Box<Written>),
    /// The key was deleted, at this revision.
    Delete { revision: i64 },
    /// The watch ended without an event (stream broken, watch canceled by the server).
    Broken(Box<str>),
}

/// A written key, as a [`Signal::Put`] reports it.
#[derive(Debug)]
pub(crate) struct Written {
    pub(crate) key: Vec<u8>,
    pub(crate) create_revision: i64,
    /// The revision of this write.
    pub(crate) mod_revision: i64,
    pub(crate) value: Vec<u8>,
}

enum Command {
    Watch {
        key: Vec<u8>,
        prefix: bool,
        puts: bool,
        /// The first revision to report (0: the current one).
        start: i64,
        signals: SignalSender,
        id: i64,
    },
    Cancel {
        id: i64,
    },
    /// Ends the stream (every watch on it gets `Broken`); the next watch opens
    /// a new one, with the client's current token.
    Reset {
        reason: String,
    },
    /// Ends the stream for good (the session is closing): every watch on it,
    /// and every watch opened later, gets `Broken`. `done` is answered once
    /// the stream is dropped.
    Close {
        done: tokio::sync::oneshot::Sender<()>,
    },
}

/// The handle sessions use to open watches on their shared stream.
#[derive(Debug, Clone)]
pub(crate) struct Hub {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
    /// Watch events received (for the benchmark's wakeup count).
    pub(crate) events: Arc<AtomicU64>,
}

/// The signals of one watch, from the hub to its `Watch`: a queue that
/// allocates only for what it holds. A session holding 100,000 locks keeps
/// one per lock (each watches its entry), and tokio's channels allocate a
/// block of 32 slots up front.
#[derive(Debug, Default)]
struct Mailbox {
    state: std::sync::Mutex<MailboxState>,
    ready: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct MailboxState {
    signals: VecDeque<Signal>,
    sender_gone: bool,
    receiver_gone: bool,
}

impl Mailbox {
    fn state(&self) -> std::sync::MutexGuard<'_, MailboxState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The hub's end of a [`Mailbox`].
#[derive(Debug)]
struct SignalSender(Arc<Mailbox>);

/// A watch's end of a [`Mailbox`].
#[derive(Debug)]
struct SignalReceiver(Arc<Mailbox>);

fn mailbox() -> (SignalSender, SignalReceiver) {
    let mailbox = Arc::new(Mailbox::default());
    (SignalSender(Arc::clone(&mailbox)), SignalReceiver(mailbox))
}

impl SignalSender {
    /// Queues `signal`; gives it back when the watch is gone.
    fn send(&self, signal: Signal) -> Result<(), Signal> {
        {
            let mut state = self.0.state();
            if state.receiver_gone {
                return Err(signal);
            }
            state.signals.push_back(signal);
        }
        // One receiver: a permit is kept if it is not waiting yet.
        self.0.ready.notify_one();
        Ok(())
    }
}

impl Drop for SignalSender {
    fn drop(&mut self) {
        self.0.state().sender_gone = true;
        self.0.ready.notify_one();
    }
}

impl SignalReceiver {
    /// The next signal; `None` once the hub let go of the watch and every
    /// signal was taken.
    async fn recv(&mut self) -> Option<Signal> {
        loop {
            {
                let mut state = self.0.state();
                if let Some(signal) = state.signals.pop_front() {
                    return Some(signal);
                }
                if state.sender_gone {
                    return None;
                }
            }
            self.0.ready.notified().await;
        }
    }
}

impl Drop for SignalReceiver {
    fn drop(&mut self) {
        let mut state = self.0.state();
        state.receiver_gone = true;
        state.signals.clear();
    }
}

/// One open watch; dropping it cancels the watch on the server.
#[derive(Debug)]
pub(crate) struct Watch {
    id: i64,
    signals: SignalReceiver,
    commands: mpsc::UnboundedSender<Command>,
}

impl Watch {
    /// The next signal; `Broken` when the hub is gone.
    pub(crate) async fn next(&mut self) -> Signal {
        self.signals
            .recv()
            .await
            .unwrap_or_else(|| Signal::Broken("the session's watch stream has stopped".into()))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Cancel { id: self.id });
    }
}

/// How the hub proves its stream alive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Liveness {
    /// A stream that carries a watch and has been silent this long is
    /// probed (the session's keepalive interval).
    pub(crate) probe_after: Duration,
    /// How long a probe, a stream's opening or a request sent on it may go
    /// unanswered before the stream is taken for dead (the request timeout).
    pub(crate) answer_within: Duration,
}

impl Hub {
    /// Starts the hub task; it ends when every `Hub` and `Watch` is dropped.
    pub(crate) fn start(client: WatchClient, liveness: Liveness) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let events = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(client, receiver, Arc::clone(&events), liveness));
        Hub {
            commands,
            next_id: Arc::new(AtomicU64::new(1)),
            events,
        }
    }

    /// Opens a watch on `key` from the current revision; with `puts` false the
    /// server filters out PUT events. The first signal is `Created` (or `Broken`).
    pub(crate) fn watch(&self, key: &str, puts: bool) -> Watch {
        self.open(key, false, puts, 0)
    }

    /// Opens a watch on `key` that reports the DELETE events from revision
    /// `start` on (a past revision: the server replays them from its history,
    /// through its slower unsynced-watcher loop, or cancels the watch if that
    /// history was compacted away).
    pub(crate) fn watch_deletes_from(&self, key: &str, start: i64) -> Watch {
        self.open(key, false, false, start.max(1))
    }

    /// Opens a watch on every key under `prefix`, PUT events included.
    pub(crate) fn watch_prefix(&self, prefix: &str) -> Watch {
        self.open(prefix, true, true, 0)
    }

    /// Ends the stream for good, before the session's lease is revoked: the
    /// server then has no watcher of this session left to send the revoke's
    /// deletions to. A session holding 100,000 locks would otherwise be sent
    /// 100,000 small events at once, which the HTTP/2 layer takes for a flood
    /// of small frames and answers by closing the connection, the revoke's
    /// answer with it. Returns once the stream is dropped.
    pub(crate) async fn close(&self) {
        let (done, closed) = tokio::sync::oneshot::channel();
        if self.commands.send(Command::Close { done }).is_ok() {
            let _ = closed.await;
        }
    }

    /// Ends the current stream, so that the next watch opens a new one.
    pub(crate) fn reset(&self, reason: &str) {
        let _ = self.commands.send(Command::Reset {
            reason: reason.to_owned(),
        });
    }

    fn open(&self, key: &str, prefix: bool, puts: bool, start: i64) -> Watch {
        let (signals, receiver) = mailbox();
        let id = i64::try_from(self.next_id.fetch_add(1, Ordering::Relaxed)).unwrap_or(i64::MAX);
        let command = Command::Watch {
            key: key.as_bytes().to_vec(),
            prefix,
            puts,
            start,
            signals,
            id,
        };
        if let Err(mpsc::error::SendError(Command::Watch { signals, .. })) = self.commands.send(command) {
            let _ = signals.send(Signal::Broken("the session's watch stream has stopped".into()));
        }
        Watch {
            id,
            signals: receiver,
            commands: self.commands.clone(),
        }
    }
}

/// Why the watches of a closed session end.
const SESSION_CLOSED: &str = "the session was closed";

struct Stream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
    /// When the stream last brought anything (or was opened).
    heard: Instant,
    /// When the unanswered progress request was sent, if one was.
    probed: Option<Instant>,
}

impl Stream {
    /// When the stream must next be probed (or, probed, given up), while it
    /// carries a watch.
    fn due(&self, liveness: Liveness) -> Instant {
        match self.probed {
            None => self.heard + liveness.probe_after,
            Some(sent) => sent + liveness.answer_within,
        }
    }
}

/// Why a silent stream is ended.
fn silent(liveness: Liveness) -> String {
    format!(
        "the watch stream answered nothing within the request timeout of {:?}: its connection \
         may have gone silent; watching again on a new stream",
        liveness.answer_within
    )
}

/// Bounds one await of the hub on its stream by the request timeout.
async fn bounded<T>(
    liveness: Liveness,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(liveness.answer_within, call).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(silent(liveness)),
    }
}

async fn run(
    mut client: WatchClient,
    mut commands: mpsc::UnboundedReceiver<Command>,
    events: Arc<AtomicU64>,
    liveness: Liveness,
) {
    let mut stream: Option<Stream> = None;
    let mut watchers: HashMap<i64, SignalSender> = HashMap::new();
    // Watches sent and not yet answered `created`, in the order sent: a
    // refused create comes back with watch id -1, and the server answers
    // creates in order.
    let mut pending: VecDeque<i64> = VecDeque::new();
    let mut closed = false;
    loop {
        // Only a stream that carries a watch is probed: an idle one may stay
        // silent, and is probed as soon as a watch is sent on it.
        let due = stream
            .as_ref()
            .filter(|_| !watchers.is_empty())
            .map(|open| open.due(liveness));
        let probe = async {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let response = async {
            match stream.as_mut() {
                Some(stream) => stream.responses.message().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            command = commands.recv() => match command {
                None => return,
                Some(Command::Reset { reason }) => {
                    break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                }
                Some(Command::Close { done }) => {
                    closed = true;
                    break_stream(&mut stream, &mut watchers, &mut pending, SESSION_CLOSED);
                    let _ = done.send(());
                }
                Some(Command::Watch { signals, .. }) if closed => {
                    let _ = signals.send(Signal::Broken(SESSION_CLOSED.into()));
                }
                Some(Command::Cancel { id }) => {
                    if watchers.remove(&id).is_some() {
                        if let Some(open) = stream.as_mut() {
                            if let Err(reason) = bounded(liveness, open.sender.cancel(id)).await {
                                break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                            }
                        }
                    }
                }
                Some(Command::Watch { key, prefix, puts, start, signals, id }) => {
                    let mut options = WatchOptions::new().with_watch_id(id);
                    if start > 0 {
                        options = options.with_start_revision(start);
                    }
                    if prefix {
                        options = options.with_prefix();
                    }
                    if !puts {
                        options = options.with_filters([WatchFilterType::NoPut]);
                    }
                    let sent = match stream.as_mut() {
                        Some(open) => bounded(liveness, open.sender.watch(key, Some(options))).await,
                        None => match bounded(liveness, client.watch(key, Some(options))).await {
                            Ok(opened) => {
                                let (sender, responses) = opened.split();
                                stream = Some(Stream { sender, responses, heard: Instant::now(), probed: None });
                                Ok(())
                            }
                            Err(error) => Err(error),
                        },
                    };
                    match sent {
                        Ok(()) => {
                            watchers.insert(id, signals);
                            pending.push_back(id);
                        }
                        Err(reason) => {
                            let _ = signals.send(Signal::Broken(reason.clone().into()));
                            break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                        }
                    }
                }
            },
            () = probe => {
                let Some(open) = stream.as_mut() else { continue };
                if open.probed.is_some() {
                    let reason = silent(liveness);
                    tracing::debug!(%reason, "etcd watch stream silent");
                    break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                } else {
                    open.probed = Some(Instant::now());
                    if let Err(reason) = bounded(liveness, open.sender.request_progress()).await {
                        break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                    }
                }
            }
            response = response => match response {
                Ok(Some(response)) => {
                    // Anything heard proves the stream alive, a progress
                    // notification too (watch id -1, not a create: it then
                    // concerns no watch, and is dropped below).
                    if let Some(open) = stream.as_mut() {
                        open.heard = Instant::now();
                        open.probed = None;
                    }
                    let mut id = response.watch_id();
                    if response.created() {
                        if id == -1 {
                            // A create the server refused (permission denied):
                            // it is the oldest one not yet answered.
                            match pending.pop_front() {
                                Some(first) => id = first,
                                None => continue,
                            }
                        } else {
                            pending.retain(|p| *p != id);
                        }
                    }
                    let Some(watcher) = watchers.get(&id) else { continue };
                    let mut alive = true;
                    if response.created() {
                        // etcd answers a create with the revision it read just
                        // before registering the watch, which then starts
                        // one revision later. Without a header, claim nothing.
                        let revision = response.header().map_or(i64::MAX, |h| h.revision());
                        alive &= watcher.send(Signal::Created { revision }).is_ok();
                    }
                    for event in response.events() {
                        events.fetch_add(1, Ordering::Relaxed);
                        let signal = match (event.event_type(), event.kv()) {
                            (EventType::Put, Some(kv)) => Signal::Put(Box::new(Written {
                                key: kv.key().to_vec(),
                                create_revision: kv.create_revision(),
                                mod_revision: kv.mod_revision(),
                                value: kv.value().to_vec(),
                            })),
                            (EventType::Put, None) => continue,
                            (EventType::Delete, kv) => Signal::Delete {
                                revision: kv.map_or(i64::MAX, |kv| kv.mod_revision()),
                            },
                        };
                        alive &= watcher.send(signal).is_ok();
                    }
                    if response.canceled() {
                        let reason = format!("{WATCH_CANCELED}: {}", response.cancel_reason());
                        let _ = watcher.send(Signal::Broken(reason.into()));
                        watchers.remove(&id);
                    } else if !alive {
                        // Its `Watch` is gone (its cancel may still be queued
                        // behind this response): cancel it on the server now,
                        // or the server keeps sending it events.
                        watchers.remove(&id);
                        if let Some(open) = stream.as_mut() {
                            if let Err(reason) = bounded(liveness, open.sender.cancel(id)).await {
                                break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                            }
                        }
                    }
                }
                Ok(None) => {
                    break_stream(&mut stream, &mut watchers, &mut pending, "watch stream ended");
                }
                Err(error) => {
                    break_stream(&mut stream, &mut watchers, &mut pending, &error.to_string());
                }
            },
        }
    }
}

/// The stream is gone: every watch on it ends with `Broken`; the next watch
/// opens a new stream.
fn break_stream(
    stream: &mut Option<Stream>,
    watchers: &mut HashMap<i64, SignalSender>,
    pending: &mut VecDeque<i64>,
    reason: &str,
) {
    *stream = None;
    pending.clear();
    for (_, watcher) in watchers.drain() {
        let _ = watcher.send(Signal::Broken(reason.into()));
    }
}
