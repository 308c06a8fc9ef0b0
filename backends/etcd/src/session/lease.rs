//! The session's lease: its keepalive, the loss it detects, the server's word
//! on the TTL left, and the revoke of a lost lease.

use super::*;

/// Why the keepalive stopped renewing.
enum Ending {
    /// No renewal confirmed for `ttl - safety margin`.
    Unconfirmed,
    /// The server answered with TTL ≤ 0: the lease is gone already.
    Expired,
    /// The session was declared lost elsewhere (a request found the lease gone).
    DeclaredLost,
}

/// Renews the lease every `keepalive_interval`; the session is `Suspended` as
/// soon as a renewal goes unanswered for a keepalive interval (or fails), and
/// `Lost` on a TTL ≤ 0 answer or when no renewal has been confirmed for
/// `ttl - safety_margin`, counted from the send time of the last renewal the
/// server answered.
///
/// Once lost the session stops renewing for good and revokes its lease as soon
/// as the server can be reached (DESIGN §6.11): a renewal sent before the loss
/// and delivered late could otherwise keep the lease, and the keys of a
/// session that already told its holders they lost, alive.
pub(super) async fn keep_alive(
    client: Client,
    lease: i64,
    options: SessionOptions,
    granted_at: Instant,
    state: watch::Sender<SessionState>,
) {
    let interval = options.keepalive_interval();
    let retry = interval.min(Duration::from_millis(250));
    let mut confirmed = granted_at;
    let mut stream = None;
    let mut wait = interval;
    let mut watched = state.subscribe();
    let ending = loop {
        let deadline = confirmed + options.loss_deadline();
        tokio::select! {
            biased;
            _ = watched.wait_for(|s| s.is_over()) => break Ending::DeclaredLost,
            () = tokio::time::sleep_until(deadline) => break Ending::Unconfirmed,
            () = tokio::time::sleep(wait) => {}
        }
        let sent = Instant::now();
        let outcome = {
            let renewal = async {
                if stream.is_none() {
                    stream = Some(client.lease_client().keep_alive(lease).await?);
                }
                let Some((keeper, responses)) = stream.as_mut() else {
                    return Ok(None);
                };
                keeper.keep_alive().await?;
                responses.message().await
            };
            let renewal = tokio::time::timeout(options.request_timeout(), renewal);
            tokio::pin!(renewal);
            // A renewal normally answers within milliseconds: one that takes a
            // whole keepalive interval means the server may be out of reach.
            let slow = sent + interval.min(options.request_timeout());
            tokio::select! {
                biased;
                outcome = &mut renewal => Some(outcome),
                () = tokio::time::sleep_until(deadline) => None,
                () = tokio::time::sleep_until(slow) => {
                    if advance(&state, SessionState::Suspended) {
                        tracing::debug!(lease = format!("{lease:x}"), "etcd keepalive unanswered; session suspended");
                    }
                    tokio::select! {
                        biased;
                        outcome = &mut renewal => Some(outcome),
                        () = tokio::time::sleep_until(deadline) => None,
                    }
                }
            }
        };
        match outcome {
            None => break Ending::Unconfirmed,
            Some(Ok(Ok(Some(response)))) if response.ttl() > 0 => {
                confirmed = sent;
                wait = interval;
                advance(&state, SessionState::Live);
            }
            Some(Ok(Ok(Some(_)))) => break Ending::Expired,
            Some(outcome) => {
                let why = match outcome {
                    Ok(Err(error)) => error.to_string(),
                    Ok(Ok(_)) => "keepalive stream ended".into(),
                    Err(_) => format!(
                        "no answer within the request timeout of {:?}",
                        options.request_timeout()
                    ),
                };
                tracing::debug!(lease = format!("{lease:x}"), why, "etcd keepalive failed; retrying");
                stream = None;
                wait = retry;
                advance(&state, SessionState::Suspended);
            }
        }
    };
    // Stop renewing, whatever happens next.
    drop(stream);
    match ending {
        Ending::Expired => {
            tracing::warn!(
                lease = format!("{lease:x}"),
                "etcd lease expired or revoked; session lost"
            );
            advance(&state, SessionState::Lost);
            return;
        }
        Ending::Unconfirmed => {
            tracing::warn!(
                lease = format!("{lease:x}"),
                deadline = ?options.loss_deadline(),
                "etcd lease not confirmed within ttl - safety margin; session lost"
            );
            advance(&state, SessionState::Lost);
        }
        Ending::DeclaredLost => {}
    }
    if *state.borrow() == SessionState::Lost {
        // Detached: dropping the session's last handle must not stop it.
        tokio::spawn(async move { revoke_lost_lease(&client, lease, &options).await });
    }
}

/// Revokes a lost session's lease, retrying with capped backoff until the
/// server confirms it (revoked now, or not found: expired or revoked before),
/// also after every handle of the session is dropped (a renewal sent before
/// the loss and delivered late would otherwise keep the lease a TTL longer).
async fn revoke_lost_lease(client: &Client, lease: i64, options: &SessionOptions) {
    let id = format!("{lease:x}");
    let mut backoff = Duration::from_millis(100);
    loop {
        let revoked = tokio::time::timeout(options.request_timeout(), client.lease_client().revoke(lease)).await;
        match revoked {
            Ok(Ok(_)) => {
                tracing::info!(lease = %id, "lost etcd session's lease revoked");
                return;
            }
            Ok(Err(error)) => match map(error, Some(&id)) {
                Error::SessionLost { .. } => {
                    tracing::debug!(lease = %id, "lost etcd session's lease already gone");
                    return;
                }
                // The user may not revoke it (revoking needs write on every
                // key on the lease): it expires within its TTL, unrenewed.
                error if error.is_refusal() => {
                    tracing::info!(lease = %id, %error, "the server refuses to revoke the lost lease; it expires unrenewed");
                    return;
                }
                error => tracing::debug!(lease = %id, %error, ?backoff, "revoking a lost etcd lease failed; retrying"),
            },
            Err(_) => tracing::debug!(
                lease = %id,
                timeout = ?options.request_timeout(),
                "revoking a lost etcd lease timed out; retrying"
            ),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(1));
    }
}

impl EtcdSession {
    /// [`BackendSession::confirm`], described there.
    pub(super) async fn confirm_lease(&self) -> Result<SessionState> {
        let current = *self.state.borrow();
        if current.is_over() {
            return Ok(current);
        }
        let mut leases = self.client.lease_client();
        let asked = tokio::time::timeout(self.request_timeout, leases.time_to_live(self.lease, None));
        let response = match asked.await {
            Ok(answered) => answered.map_err(|e| self.err(e))?,
            Err(_) => {
                return Err(Error::unavailable(
                    BACKEND,
                    format!(
                        "reading the TTL of lease {}: no answer within the request timeout of {:?}",
                        self.id, self.request_timeout
                    ),
                ))
            }
        };
        if response.ttl() <= 0 {
            self.mark_lost("the lease has no time left");
        }
        Ok(*self.state.borrow())
    }
}
