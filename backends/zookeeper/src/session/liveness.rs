//! Whether a session is still live: the confirmations (answered `sync`s)
//! that move its loss deadline, the task that tracks its state, and its loss.

use super::*;

/// When the server last confirmed the session, and how long that lasts.
///
/// The leader expires a session `negotiated timeout` after the last activity
/// it heard of. A follower hears of the client's requests first and reports
/// them to the leader in its answers to the leader's pings, sent every half
/// `tickTime` (at most a quarter of the negotiated timeout, which is at least
/// two ticks). So lockline confirms with `sync`, which the server the client
/// is connected to can answer only through the leader (a follower cut off from
/// the leader answers no `sync`, while it would still answer reads), and takes
/// an answered `sync` sent at `t` as proof that the leader had heard of the
/// session's activity from a quarter timeout before `t`: the deadline counts
/// from the send time of the latest answered confirmation sent at least that
/// much earlier (DESIGN §6.9). The session's creation is the first
/// confirmation: the leader itself made it.
#[derive(Debug)]
pub(super) struct Liveness {
    confirmed: StdMutex<Confirmations>,
    /// `negotiated timeout - safety margin`.
    loss_deadline: Duration,
    /// How long the leader may take to hear of the session's activity at a
    /// follower: a quarter of the negotiated timeout.
    report_lag: Duration,
}

#[derive(Debug)]
struct Confirmations {
    /// What the deadline counts from.
    confirmed: Instant,
    /// Send times of answered confirmations not yet old enough to count,
    /// oldest first.
    recent: std::collections::VecDeque<Instant>,
}

impl Liveness {
    pub(super) fn new(opened: Instant, loss_deadline: Duration, report_lag: Duration) -> Self {
        Liveness {
            confirmed: StdMutex::new(Confirmations {
                confirmed: opened,
                recent: std::collections::VecDeque::new(),
            }),
            loss_deadline,
            report_lag,
        }
    }

    /// Records an answered `sync` sent at `sent`.
    fn confirm(&self, sent: Instant) {
        let mut c = lock(&self.confirmed);
        if c.recent.back().is_none_or(|last| sent > *last) {
            c.recent.push_back(sent);
        }
        // Everything sent a report lag before this answer now counts.
        let Some(horizon) = sent.checked_sub(self.report_lag) else {
            return;
        };
        while c.recent.front().is_some_and(|t| *t <= horizon) {
            if let Some(t) = c.recent.pop_front() {
                if t > c.confirmed {
                    c.confirmed = t;
                }
            }
        }
    }

    /// When the session must be taken as lost unless confirmed again.
    fn deadline(&self) -> Instant {
        lock(&self.confirmed).confirmed + self.loss_deadline
    }
}

/// Ends a lost session on the server: drops the client, so it sends
/// `closeSession` as soon as it reaches a server (a partition that heals
/// before the server's own expiry must not bring the session and its nodes
/// back), and calls on it fail with `SessionLost`.
pub(super) fn end(slot: &StdMutex<Option<Client>>) {
    drop(lock(slot).take());
}

impl ZkSession {
    /// A session past its loss deadline is lost, whatever the tracker has
    /// had time to notice (a process paused past the deadline runs its own
    /// requests before the tracker's timer): never sent a request on.
    pub(super) fn check_deadline(&self) -> Result<()> {
        let state = *self.state.borrow();
        if state.is_over() {
            let session = self.id.clone();
            return Err(match state {
                SessionState::Lost => Error::SessionLost { session },
                _ => Error::Closed { session },
            });
        }
        if Instant::now() >= self.liveness.deadline() {
            self.mark_lost("not confirmed within the loss deadline");
            return Err(Error::SessionLost {
                session: self.id.clone(),
            });
        }
        Ok(())
    }

    pub(super) fn mark_lost(&self, why: &str) {
        if advance(&self.state, SessionState::Lost) {
            tracing::warn!(session = %self.id, why, "ZooKeeper session lost");
        }
        end(&self.client);
    }

    pub(super) async fn confirm_with_server(&self) -> Result<SessionState> {
        let current = *self.state.borrow();
        if current.is_over() {
            return Ok(current);
        }
        if Instant::now() >= self.liveness.deadline() {
            self.mark_lost("not confirmed within the loss deadline");
            return Ok(SessionState::Lost);
        }
        let client = self.client()?;
        let sent = Instant::now();
        match client.sync("/").await {
            Ok(()) => self.liveness.confirm(sent),
            Err(error) => return Err(self.err(error)),
        }
        Ok(*self.state.borrow())
    }
}

/// A request in flight that confirms the session: its send time and answer.
type Ping = std::pin::Pin<Box<dyn std::future::Future<Output = std::result::Result<(), ZkError>> + Send>>;

/// Keeps the session's state: a confirming request (a `sync`, which goes
/// through the leader) every `interval`, whose answer moves the confirmation
/// forward (see [`Liveness`]); `Lost`
/// once the loss deadline passes from the last confirmation (whatever the
/// client library reports, which under a silent partition comes only after its
/// own connection timeout); `Suspended` while a confirmation is overdue or the
/// client is disconnected; `Lost` on expiry or failed authentication. A lost
/// session is ended on the server as soon as it can be reached.
pub(super) async fn track(
    client: Client,
    slot: Arc<StdMutex<Option<Client>>>,
    liveness: Arc<Liveness>,
    state: watch::Sender<SessionState>,
    interval: Duration,
) {
    let mut watcher = client.state_watcher();
    let mut over = state.subscribe();
    let retry = interval.min(Duration::from_millis(250));
    let mut next_ping = Instant::now() + interval;
    let mut ping: Option<(Instant, Ping)> = None;
    let ended = loop {
        let deadline = liveness.deadline();
        let overdue = ping.as_ref().map(|(sent, _)| *sent + interval);
        let idle = ping.is_none();
        let answer = async {
            match ping.as_mut() {
                Some((_, request)) => request.as_mut().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(deadline) => {
                if Instant::now() >= liveness.deadline() {
                    tracing::warn!(
                        loss_deadline = ?liveness.loss_deadline,
                        "ZooKeeper session not confirmed within the loss deadline; declaring it lost"
                    );
                    break SessionState::Lost;
                }
            }
            _ = over.wait_for(|s| s.is_over()) => break SessionState::Lost,
            next = watcher.changed() => match next {
                ZkState::SyncConnected | ZkState::ConnectedReadOnly => {
                    // Live again once a request confirms it; ask now.
                    next_ping = Instant::now();
                }
                ZkState::Disconnected => {
                    advance(&state, SessionState::Suspended);
                }
                ZkState::Closed => break SessionState::Closed,
                ZkState::AuthFailed => {
                    tracing::warn!("ZooKeeper rejected the session's credentials on reconnection; session lost");
                    break SessionState::Lost;
                }
                other => {
                    tracing::warn!(state = ?other, "ZooKeeper session expired");
                    break SessionState::Lost;
                }
            },
            answer = answer => {
                let sent = ping.take().map_or(deadline, |(sent, _)| sent);
                match answer {
                    Ok(_) => {
                        liveness.confirm(sent);
                        advance(&state, SessionState::Live);
                        next_ping = sent + interval;
                    }
                    Err(ZkError::SessionExpired) => break SessionState::Lost,
                    Err(ZkError::AuthFailed) => {
                        tracing::warn!("ZooKeeper rejected the session's credentials; session lost");
                        break SessionState::Lost;
                    }
                    Err(ZkError::ClientClosed) => break SessionState::Closed,
                    Err(error) => {
                        tracing::debug!(%error, "ZooKeeper session confirmation failed; retrying");
                        advance(&state, SessionState::Suspended);
                        next_ping = Instant::now() + retry;
                    }
                }
            }
            () = async {
                match overdue {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                // Unanswered for a whole interval: maybe lost. Keep waiting for
                // the answer (a late one still confirms its send time).
                advance(&state, SessionState::Suspended);
            }
            () = tokio::time::sleep_until(next_ping), if idle => {
                let confirming = client.clone();
                ping = Some((Instant::now(), Box::pin(async move { confirming.sync("/").await })));
            }
        }
    };
    advance(&state, ended);
    end(&slot);
}
