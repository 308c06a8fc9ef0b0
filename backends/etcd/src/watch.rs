//! One watch stream per session, multiplexing every watch the session opens.
//!
//! etcd watch streams carry any number of watches told apart by watch id; the
//! hub task owns the stream, assigns ids, and routes each response to the one
//! watch it belongs to. So 10,000 waiters of one session are 10,000 watch ids on
//! one gRPC stream, not 10,000 streams.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use etcd_client::{EventType, WatchClient, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponseStream};
use tokio::sync::mpsc;

/// What a watch reports.
#[derive(Debug)]
pub(crate) enum Signal {
    /// The server created the watch: every event after `revision` (the
    /// member's revision when it took the watch) follows.
    Created { revision: i64 },
    /// A key was written (the watched key, or one under the watched prefix).
    Put {
        key: Vec<u8>,
        create_revision: i64,
        value: Vec<u8>,
    },
    /// The key was deleted, at this revision.
    Delete { revision: i64 },
    /// The watch ended without an event (stream broken, watch canceled by the server).
    Broken(String),
}

enum Command {
    Watch {
        key: Vec<u8>,
        prefix: bool,
        puts: bool,
        signals: mpsc::UnboundedSender<Signal>,
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
}

/// The handle sessions use to open watches on their shared stream.
#[derive(Debug, Clone)]
pub(crate) struct Hub {
    commands: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
    /// Watch events received (for the benchmark's wakeup count).
    pub(crate) events: Arc<AtomicU64>,
}

/// One open watch; dropping it cancels the watch on the server.
#[derive(Debug)]
pub(crate) struct Watch {
    id: i64,
    signals: mpsc::UnboundedReceiver<Signal>,
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

impl Hub {
    /// Starts the hub task; it ends when every `Hub` and `Watch` is dropped.
    pub(crate) fn start(client: WatchClient) -> Self {
        let (commands, receiver) = mpsc::unbounded_channel();
        let events = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(client, receiver, Arc::clone(&events)));
        Hub {
            commands,
            next_id: Arc::new(AtomicU64::new(1)),
            events,
        }
    }

    /// Opens a watch on `key` from the current revision; with `puts` false the
    /// server filters out PUT events. The first signal is `Created` (or `Broken`).
    pub(crate) fn watch(&self, key: &str, puts: bool) -> Watch {
        self.open(key, false, puts)
    }

    /// Opens a watch on every key under `prefix`, PUT events included.
    pub(crate) fn watch_prefix(&self, prefix: &str) -> Watch {
        self.open(prefix, true, true)
    }

    /// Ends the current stream, so that the next watch opens a new one.
    pub(crate) fn reset(&self, reason: &str) {
        let _ = self.commands.send(Command::Reset {
            reason: reason.to_owned(),
        });
    }

    fn open(&self, key: &str, prefix: bool, puts: bool) -> Watch {
        let (signals, receiver) = mpsc::unbounded_channel();
        let id = i64::try_from(self.next_id.fetch_add(1, Ordering::Relaxed)).unwrap_or(i64::MAX);
        let command = Command::Watch {
            key: key.as_bytes().to_vec(),
            prefix,
            puts,
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

struct Stream {
    sender: WatchRequestSender,
    responses: WatchResponseStream,
}

async fn run(mut client: WatchClient, mut commands: mpsc::UnboundedReceiver<Command>, events: Arc<AtomicU64>) {
    let mut stream: Option<Stream> = None;
    let mut watchers: HashMap<i64, mpsc::UnboundedSender<Signal>> = HashMap::new();
    // Watches sent and not yet answered `created`, in the order sent: a
    // refused create comes back with watch id -1, and the server answers
    // creates in order.
    let mut pending: VecDeque<i64> = VecDeque::new();
    loop {
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
                Some(Command::Cancel { id }) => {
                    if watchers.remove(&id).is_some() {
                        if let Some(open) = stream.as_mut() {
                            if open.sender.cancel(id).await.is_err() {
                                break_stream(&mut stream, &mut watchers, &mut pending, "watch stream closed");
                            }
                        }
                    }
                }
                Some(Command::Watch { key, prefix, puts, signals, id }) => {
                    let mut options = WatchOptions::new().with_watch_id(id);
                    if prefix {
                        options = options.with_prefix();
                    }
                    if !puts {
                        options = options.with_filters([WatchFilterType::NoPut]);
                    }
                    let sent = match stream.as_mut() {
                        Some(open) => open.sender.watch(key, Some(options)).await.map_err(|e| e.to_string()),
                        None => match client.watch(key, Some(options)).await {
                            Ok(opened) => {
                                let (sender, responses) = opened.split();
                                stream = Some(Stream { sender, responses });
                                Ok(())
                            }
                            Err(error) => Err(error.to_string()),
                        },
                    };
                    match sent {
                        Ok(()) => {
                            watchers.insert(id, signals);
                            pending.push_back(id);
                        }
                        Err(reason) => {
                            let _ = signals.send(Signal::Broken(reason.clone()));
                            break_stream(&mut stream, &mut watchers, &mut pending, &reason);
                        }
                    }
                }
            },
            response = response => match response {
                Ok(Some(response)) => {
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
                            (EventType::Put, Some(kv)) => Signal::Put {
                                key: kv.key().to_vec(),
                                create_revision: kv.create_revision(),
                                value: kv.value().to_vec(),
                            },
                            (EventType::Put, None) => continue,
                            (EventType::Delete, kv) => Signal::Delete {
                                revision: kv.map_or(i64::MAX, |kv| kv.mod_revision()),
                            },
                        };
                        alive &= watcher.send(signal).is_ok();
                    }
                    if response.canceled() {
                        let reason = format!("watch canceled by the server: {}", response.cancel_reason());
                        let _ = watcher.send(Signal::Broken(reason));
                        watchers.remove(&id);
                    } else if !alive {
                        // Its `Watch` is gone (its cancel may still be queued
                        // behind this response): cancel it on the server now,
                        // or the server keeps sending it events.
                        watchers.remove(&id);
                        if let Some(open) = stream.as_mut() {
                            if open.sender.cancel(id).await.is_err() {
                                break_stream(&mut stream, &mut watchers, &mut pending, "watch stream closed");
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
    watchers: &mut HashMap<i64, mpsc::UnboundedSender<Signal>>,
    pending: &mut VecDeque<i64>,
    reason: &str,
) {
    *stream = None;
    pending.clear();
    for (_, watcher) in watchers.drain() {
        let _ = watcher.send(Signal::Broken(reason.to_owned()));
    }
}
