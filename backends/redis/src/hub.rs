//! One pub/sub connection per session, shared by all of its waits.
//!
//! A waiter subscribes to the one channel it cares about (its predecessor's)
//! and is told of each message on it. The connection is re-made when it
//! breaks or stops answering pings; every channel still wanted is subscribed
//! again and every waiter is told to look again, since messages sent while
//! it was down are lost.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::PubSubSink;
use tokio::sync::watch;

use crate::error::{map, timed_out};

/// The pause after a failed connection attempt, doubled at each failure up
/// to [`RECONNECT_MAX_BACKOFF`]: a server back from a restart is
/// reconnected to within that. A connection that broke is made again at
/// once.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(25);
const RECONNECT_MAX_BACKOFF: Duration = Duration::from_millis(250);

/// What was heard on a channel: how many messages, and whether one of them
/// said the entry is gone (a release publishes `gone`, a removal with a lost
/// session or a reaping `lost`, each only once the entry is deleted: the
/// server's own word).
#[derive(Debug, Clone, Default)]
pub(crate) struct Heard {
    count: u64,
    gone: bool,
    /// Whether the message that said so said `lost`: the entry went with
    /// its owner's session, not by a release.
    lost: bool,
    /// The attempt id a release named as now holding (`gone <attempt>`).
    head: Option<String>,
    /// The queue a lock-mode hand-over left, as its message carried it
    /// (`gone ~ <queue>`, see `UPDATE_QUEUE`), still packed.
    queue: Option<Arc<[u8]>>,
    /// The entry's value as the last message said it was written (`value
    /// <version> <value>`), with its version, if that message was the last
    /// one heard.
    written: Option<(u64, Arc<[u8]>)>,
}

/// What one message on an entry's channel says (see `Heard`).
#[derive(Default)]
struct Message {
    gone: bool,
    lost: bool,
    head: Option<String>,
    queue: Option<Arc<[u8]>>,
    written: Option<(u64, Arc<[u8]>)>,
}

impl Message {
    /// `gone [<head>]`, `lost`, `gone ~ <queue>` (a lock-mode hand-over),
    /// `value <version> <value>` (a lock-mode update's write), or anything
    /// else (a change: look).
    fn parse(payload: &[u8]) -> Message {
        if let Some(queue) = payload.strip_prefix(b"gone ~ ") {
            return Message {
                gone: true,
                queue: Some(Arc::from(queue)),
                ..Message::default()
            };
        }
        if let Some(rest) = payload.strip_prefix(b"value ") {
            let written = rest.iter().position(|&b| b == b' ').and_then(|space| {
                let version = std::str::from_utf8(&rest[..space]).ok()?.parse().ok()?;
                Some((version, Arc::from(&rest[space + 1..])))
            });
            return Message {
                written,
                ..Message::default()
            };
        }
        let payload = String::from_utf8_lossy(payload);
        let mut words = payload.split(' ');
        let word = words.next();
        let lost = word == Some("lost");
        let gone = lost || word == Some("gone");
        let head = words.next().filter(|_| gone).map(str::to_owned);
        Message {
            gone,
            lost,
            head,
            ..Message::default()
        }
    }
}

struct Channel {
    users: usize,
    messages: watch::Sender<Heard>,
}

pub(crate) struct Hub {
    /// One client per server the connection may be made to, tried in turn
    /// from the last one that worked: a cluster publishes every message on
    /// every node, so any node will do.
    clients: Vec<redis::Client>,
    current: std::sync::atomic::AtomicUsize,
    target: String,
    request_timeout: Duration,
    ping_every: Duration,
    /// How long a ping may go unanswered before the connection is given up
    /// and made again (see `session::probe_timeout`).
    ping_timeout: Duration,
    channels: std::sync::Mutex<HashMap<String, Channel>>,
    /// The connection's sending half while connected; also serialises
    /// subscribes and unsubscribes so that they reach the server in order.
    sink: tokio::sync::Mutex<Option<PubSubSink>>,
    /// Bumped each time the connection is made again (or lost): waiters
    /// look again, as a message may have been missed.
    generation: watch::Sender<u64>,
    /// Channels nobody wants any more, unsubscribed in batches by the
    /// connection's task.
    retired: std::sync::Mutex<Vec<String>>,
    retire: tokio::sync::Notify,
    /// Told when a request on the connection went unanswered: the
    /// connection is given up and made again at once, not at the next ping.
    stuck: tokio::sync::Notify,
    /// The generation of the connection found stuck: a report about a
    /// connection already made again is ignored.
    stuck_generation: std::sync::atomic::AtomicU64,
}

/// One waiter's interest in one channel; unsubscribes when the last is dropped.
pub(crate) struct Subscription {
    hub: Arc<Hub>,
    channel: String,
    messages: watch::Receiver<Heard>,
    generation: watch::Receiver<u64>,
}

impl Subscription {
    /// Whether a message said the entry is gone (released or lost).
    pub(crate) fn heard_gone(&self) -> bool {
        self.messages.borrow().gone
    }

    /// Whether a message said the entry was lost with its owner's session.
    pub(crate) fn heard_lost(&self) -> bool {
        self.messages.borrow().lost
    }

    /// The attempt the release named as holding now, if it named one.
    pub(crate) fn announced_head(&self) -> Option<String> {
        self.messages.borrow().head.clone()
    }

    /// The queue, still packed, that a lock-mode hand-over's message said
    /// it left, if one did.
    pub(crate) fn handed_queue(&self) -> Option<Arc<[u8]>> {
        self.messages.borrow().queue.clone()
    }

    /// The value the last message heard said was written, with its
    /// version, if the last message said one.
    pub(crate) fn written(&self) -> Option<(u64, Arc<[u8]>)> {
        self.messages.borrow().written.clone()
    }

    /// Resolves on the next message on the channel, or when the connection
    /// was made again (a message may have been lost): look again.
    pub(crate) async fn changed(&mut self) {
        tokio::select! {
            changed = self.messages.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
            changed = self.generation.changed() => {
                if changed.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.hub.channels.lock().unwrap_or_else(PoisonError::into_inner);
            match channels.get_mut(&self.channel) {
                Some(channel) if channel.users > 1 => {
                    channel.users -= 1;
                    false
                }
                Some(_) => {
                    channels.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last {
            self.hub
                .retired
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(std::mem::take(&mut self.channel));
            self.hub.retire.notify_one();
        }
    }
}

impl Hub {
    pub(crate) fn new(
        clients: Vec<redis::Client>,
        target: String,
        request_timeout: Duration,
        ping_every: Duration,
        ping_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Hub {
            clients,
            current: std::sync::atomic::AtomicUsize::new(0),
            target,
            request_timeout,
            ping_every,
            ping_timeout,
            channels: std::sync::Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            generation: watch::Sender::new(0),
            retired: std::sync::Mutex::new(Vec::new()),
            retire: tokio::sync::Notify::new(),
            stuck: tokio::sync::Notify::new(),
            stuck_generation: std::sync::atomic::AtomicU64::new(u64::MAX),
        })
    }

    /// Subscribes to `channel`. Once this returns, a message published on the
    /// channel reaches the subscription (or the connection is down, and its
    /// return bumps the generation). A check made after this call therefore
    /// misses nothing.
    ///
    /// # Errors
    ///
    /// `Unavailable` when the server did not confirm within the request timeout.
    pub(crate) async fn subscribe(self: &Arc<Self>, channel: &str) -> lockline::Result<Subscription> {
        let (messages, first) = {
            let mut channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
            match channels.get_mut(channel) {
                Some(existing) => {
                    existing.users += 1;
                    (existing.messages.subscribe(), false)
                }
                None => {
                    let sender = watch::Sender::new(Heard::default());
                    let receiver = sender.subscribe();
                    channels.insert(
                        channel.to_owned(),
                        Channel {
                            users: 1,
                            messages: sender,
                        },
                    );
                    (receiver, true)
                }
            }
        };
        let subscription = Subscription {
            hub: Arc::clone(self),
            channel: channel.to_owned(),
            messages,
            generation: self.generation.subscribe(),
        };
        // A channel already subscribed was confirmed for its first user
        // (or will be on reconnection, which bumps the generation).
        if first {
            let mut sink = self.sink.lock().await;
            // The connection the sink belongs to (made again only under this lock).
            let generation = *self.generation.borrow();
            if let Some(sink) = sink.as_mut() {
                match tokio::time::timeout(self.request_timeout, sink.subscribe(channel)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => {
                        if crate::conn::is_broken(&error) {
                            self.report_stuck(generation);
                        }
                        return Err(map("SUBSCRIBE", &self.target, error));
                    }
                    Err(_) => {
                        // Unanswered: the connection may have been silently
                        // forgotten on the way. Make it again (every wanted
                        // channel subscribed anew, every waiter looking again).
                        self.report_stuck(generation);
                        return Err(timed_out("SUBSCRIBE", &self.target, self.request_timeout));
                    }
                }
            }
        }
        Ok(subscription)
    }

    /// Has the connection of `generation` made again, unless it already was.
    fn report_stuck(&self, generation: u64) {
        self.stuck_generation
            .store(generation, std::sync::atomic::Ordering::SeqCst);
        self.stuck.notify_one();
    }

    /// Unsubscribes, in one command, the channels retired since the last
    /// time that nobody wants again meanwhile.
    async fn unsubscribe_retired(&self) {
        let mut sink = self.sink.lock().await;
        let retired: Vec<String> = {
            let wanted = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
            let mut retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
            retired.drain(..).filter(|c| !wanted.contains_key(c)).collect()
        };
        if retired.is_empty() {
            return;
        }
        if let Some(sink) = sink.as_mut() {
            let _ = tokio::time::timeout(self.request_timeout, sink.unsubscribe(&retired)).await;
        }
    }

    /// Keeps the connection up until the task is aborted: connects,
    /// subscribes every wanted channel, relays messages, pings, and starts
    /// over when the connection breaks or a ping goes unanswered.
    pub(crate) async fn run(self: Arc<Self>) {
        let mut backoff = RECONNECT_BACKOFF;
        loop {
            match self.connect().await {
                Ok(stream) => {
                    backoff = RECONNECT_BACKOFF;
                    self.relay(stream).await;
                    *self.sink.lock().await = None;
                    self.generation.send_modify(|g| *g += 1);
                    // Broken after it worked (a restart, a failover): try
                    // again at once.
                    continue;
                }
                Err(error) => tracing::debug!(%error, "pub/sub connection failed"),
            }
            *self.sink.lock().await = None;
            self.generation.send_modify(|g| *g += 1);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_MAX_BACKOFF);
        }
    }

    /// Connects to the first server that answers, starting from the one
    /// that worked last.
    async fn open(&self) -> lockline::Result<redis::aio::PubSub> {
        use std::sync::atomic::Ordering;
        let start = self.current.load(Ordering::Relaxed);
        let mut failure = None;
        for step in 0..self.clients.len() {
            let index = (start + step) % self.clients.len();
            let connect = self.clients[index].get_async_pubsub();
            match tokio::time::timeout(self.request_timeout, connect).await {
                Ok(Ok(pubsub)) => {
                    self.current.store(index, Ordering::Relaxed);
                    return Ok(pubsub);
                }
                Ok(Err(error)) => failure = Some(map("pub/sub connect", &self.target, error)),
                Err(_) => failure = Some(timed_out("pub/sub connect", &self.target, self.request_timeout)),
            }
        }
        Err(failure.unwrap_or_else(|| timed_out("pub/sub connect", &self.target, self.request_timeout)))
    }

    async fn connect(&self) -> lockline::Result<redis::aio::PubSubStream> {
        let pubsub = self.open().await?;
        let (mut sink, stream) = pubsub.split();
        let mut slot = self.sink.lock().await;
        let wanted: Vec<String> = self
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        for batch in wanted.chunks(512) {
            match tokio::time::timeout(self.request_timeout, sink.subscribe(batch)).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => return Err(map("SUBSCRIBE", &self.target, error)),
                Err(_) => return Err(timed_out("SUBSCRIBE", &self.target, self.request_timeout)),
            }
        }
        *slot = Some(sink);
        // Everything subscribed again: whoever waits looks again. Bumped
        // before the sink is let go, so that a request made on this
        // connection reads this connection's generation.
        self.generation.send_modify(|g| *g += 1);
        drop(slot);
        Ok(stream)
    }

    async fn relay(&self, mut stream: redis::aio::PubSubStream) {
        let mut ping = tokio::time::interval(self.ping_every);
        ping.tick().await;
        loop {
            tokio::select! {
                message = stream.next() => {
                    let Some(message) = message else { return };
                    let channels = self.channels.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(channel) = channels.get(message.get_channel_name()) {
                        let message = Message::parse(message.get_payload_bytes());
                        channel.messages.send_modify(|heard| {
                            heard.count += 1;
                            heard.gone |= message.gone;
                            heard.lost |= message.lost;
                            if message.head.is_some() {
                                heard.head = message.head;
                            }
                            if message.queue.is_some() {
                                heard.queue = message.queue;
                            }
                            // Only while the last message is the one that
                            // said it: a later write without it may have
                            // changed the value again.
                            heard.written = message.written;
                        });
                    }
                }
                () = self.retire.notified() => self.unsubscribe_retired().await,
                () = self.stuck.notified() => {
                    let stuck = self.stuck_generation.load(std::sync::atomic::Ordering::SeqCst);
                    if stuck == *self.generation.borrow() {
                        tracing::debug!(target = %self.target, "a request on the pub/sub connection went unanswered; reconnecting");
                        return;
                    }
                }
                _ = ping.tick() => {
                    // A round trip on this very connection, bounded: one a
                    // middlebox silently forgot is replaced within a
                    // keepalive interval and the ping timeout, inside the
                    // loss deadline (DESIGN rule 18).
                    let sink = self.sink.lock().await.clone();
                    let Some(mut sink) = sink else { return };
                    let answered = tokio::time::timeout(self.ping_timeout, sink.ping::<redis::Value>()).await;
                    if !matches!(answered, Ok(Ok(_))) {
                        tracing::debug!(target = %self.target, "pub/sub connection did not answer a ping; reconnecting");
                        return;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Message;

    #[test]
    fn a_message_says_gone_lost_a_head_a_queue_or_a_value() {
        let gone = Message::parse(b"gone");
        assert!(gone.gone && !gone.lost && gone.head.is_none() && gone.queue.is_none());
        assert_eq!(Message::parse(b"gone next").head.as_deref(), Some("next"));
        let lost = Message::parse(b"lost");
        assert!(lost.gone && lost.lost);
        let handed = Message::parse(b"gone ~ q1 0 0");
        assert!(handed.gone && !handed.lost && handed.head.is_none());
        assert_eq!(handed.queue.as_deref(), Some(&b"q1 0 0"[..]));
        let written = Message::parse(b"value 12 granted EX, blocks PR");
        assert!(!written.gone);
        let (version, value) = written.written.expect("a value");
        assert_eq!((version, &*value), (12, &b"granted EX, blocks PR"[..]));
        // A write that did not say its value, or said it badly: a change
        // to look at.
        for payload in [&b"value"[..], b"value x y", b"value 12", b"other"] {
            let message = Message::parse(payload);
            assert!(!message.gone && message.written.is_none(), "{payload:?}");
        }
    }
}
