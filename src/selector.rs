//! A leadership loop: run work while leader, stop it when leadership is lost,
//! campaign again (Curator's `LeaderSelector`, kazoo's `Election.run`).

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::{Client, Error, Leadership, Result, Session, SessionOptions};

/// The default pause before campaigning again.
const DEFAULT_PAUSE: Duration = Duration::from_secs(1);

/// Runs work while leader of an election, over and over, until shut down.
///
/// [`run`](Self::run) opens a session on its [`Client`], campaigns, and once
/// elected calls the work with a [`Term`]. The work's future is dropped
/// (cancelled) as soon as the leadership is lost ([`Leadership::lost`]:
/// session expired or not confirmed in time, entry deleted); after a pause the
/// selector campaigns again. A lost session is over for good, so the selector
/// opens a new one with the same [`SessionOptions`].
///
/// **When the work returns by itself**, the selector resigns and queues
/// again after the pause, as Curator's `LeaderSelector` with `autoRequeue`
/// does: leadership is held exactly as long as the work runs. To stop the
/// loop from inside the work, trigger the shutdown future.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lockline::Result<()> {
/// use lockline::{Client, LeaderSelector};
///
/// let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel();
/// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
/// let selector = LeaderSelector::new(Client::memory(), "scheduler", "node-a");
/// let running = tokio::spawn(selector.run(
///     async { stopped.await.ok(); },
///     move |term| {
///         let elected_tx = elected_tx.clone();
///         async move {
///             // The work: fence what it writes with term.token() or term.write_if_held(..).
///             elected_tx.send(term.token()).ok();
///             term.lost().await; // runs until lost or shut down
///         }
///     },
/// ));
/// let token = elected.recv().await.expect("elected");
/// println!("leading with token {token}");
/// stop.send(()).ok();
/// assert_eq!(running.await.expect("the selector's task")?, 1); // one term served
/// # Ok(()) }
/// ```
///
/// See `examples/leader_selector.rs` for a complete program.
#[derive(Clone)]
pub struct LeaderSelector {
    client: Client,
    name: String,
    value: Vec<u8>,
    options: SessionOptions,
    pause: Duration,
}

impl fmt::Debug for LeaderSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderSelector")
            .field("name", &self.name)
            .field("pause", &self.pause)
            .finish_non_exhaustive()
    }
}

/// One term of leadership, handed to the work of a [`LeaderSelector`].
///
/// Cheap to clone; dereferences to the [`Leadership`], so the whole guard
/// surface is there: [`token`](Leadership::token) to fence writes to other
/// resources, [`write_if_held`](Leadership::write_if_held) for the lock's own
/// store, [`lost`](Leadership::lost), [`proclaim`](Leadership::proclaim),
/// [`session`](Leadership::session).
///
/// Do not keep a clone after the work's future ends (in a spawned task,
/// say): the selector resigns when the last clone is dropped, and until then
/// the next campaign of this same session waits behind it.
#[derive(Clone)]
pub struct Term {
    number: u64,
    leadership: Arc<Leadership>,
}

impl fmt::Debug for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Term")
            .field("number", &self.number)
            .field("leadership", &self.leadership)
            .finish()
    }
}

impl Term {
    /// Which term of this selector it is: 1 for the first, counting every
    /// election won since [`LeaderSelector::run`] started.
    pub fn number(&self) -> u64 {
        self.number
    }
}

impl Deref for Term {
    type Target = Leadership;

    fn deref(&self) -> &Leadership {
        &self.leadership
    }
}

/// How a term ended.
enum Ending {
    Shutdown,
    Lost,
    Returned,
}

impl LeaderSelector {
    /// A selector for the election `name` on `client`'s cluster, proclaiming
    /// `value` while it leads, with default [`SessionOptions`] and a pause of
    /// one second. Nothing is checked or contacted until [`run`](Self::run).
    pub fn new(client: Client, name: &str, value: impl Into<Vec<u8>>) -> Self {
        LeaderSelector {
            client,
            name: name.to_owned(),
            value: value.into(),
            options: SessionOptions::default(),
            pause: DEFAULT_PAUSE,
        }
    }

    /// The options of every session the selector opens.
    pub fn with_session_options(mut self, options: SessionOptions) -> Self {
        self.options = options;
        self
    }

    /// How long to wait after a term ends, or after a campaign or a session
    /// failed for a reason that may pass, before campaigning again (default
    /// one second).
    pub fn with_pause(mut self, pause: Duration) -> Self {
        self.pause = pause;
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns, runs `work` while leader, and starts again, until
    /// `shutdown` resolves; returns the number of terms served: the number
    /// of times `work` was called.
    ///
    /// - Elected, the selector calls `work` with the [`Term`] and polls its
    ///   future until it returns, the leadership is lost, or `shutdown`
    ///   resolves, whichever comes first; the future is then dropped.
    /// - The work returned: resign, pause, campaign again. Leadership lost:
    ///   pause, campaign again (on a new session if the session is over).
    /// - Campaigns and sessions that fail for a reason that may pass
    ///   ([`Error::Unavailable`], a lost or closed session, a deleted entry)
    ///   are tried again after the pause.
    /// - Shutting down lets the next contender in line be elected; a selector
    ///   elected in the very instant its own `shutdown` comes (before that
    ///   future is ready) still serves a term, whose work is dropped at once.
    /// - Shut down: the work is dropped and the session closed, which ends
    ///   the leadership too. `run` returns once the server confirmed the
    ///   close, or after the request timeout when it cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropping the returned future drops the work and the selector's
    /// session: the leadership is resigned in the background and the session
    /// ends as when its handles are dropped. Prefer `shutdown`, which closes
    /// the session at once.
    ///
    /// # Errors
    ///
    /// Ends the loop with the error that cannot pass by retrying:
    /// [`Error::InvalidName`] for a name the backend cannot store,
    /// [`Error::InvalidOptions`] for session options that do not validate,
    /// [`Error::AuthenticationFailed`] and [`Error::PermissionDenied`], and
    /// other backend errors. A leader's work is dropped first.
    pub async fn run<S, W, F>(self, shutdown: S, mut work: W) -> Result<u64>
    where
        S: Future<Output = ()>,
        W: FnMut(Term) -> F,
        F: Future<Output = ()>,
    {
        // A name no session could use ends the loop at once, also while
        // the cluster cannot be reached.
        self.client.check_name(&self.name)?;
        self.options.validate()?;
        // Every select below polls `shutdown` first, and must see it when it
        // has come. A tokio future (a `watch` or `Notify` wait) answers
        // `Pending` once the task's cooperative budget is spent, even when it
        // is ready: a campaign that completed in that same poll would then be
        // taken for a term won before the shutdown.
        let shutdown = tokio::task::unconstrained(shutdown);
        tokio::pin!(shutdown);
        let mut terms = 0u64;
        let mut session: Option<Session> = None;
        let outcome = loop {
            let current = match session.as_ref().filter(|s| !s.state().is_over()) {
                Some(live) => live.clone(),
                None => {
                    // A lost session is over for good: its handles go, a new one is opened.
                    session = None;
                    let opened = tokio::select! {
                        biased;
                        () = &mut shutdown => break Ok(terms),
                        opened = self.client.session_with(self.options.clone()) => opened,
                    };
                    match opened {
                        Ok(opened) => {
                            session = Some(opened.clone());
                            opened
                        }
                        Err(error) if passes(&error) => {
                            tracing::debug!(name = %self.name, %error, "leader selector: no session; retrying");
                            if self.pause(shutdown.as_mut()).await {
                                break Ok(terms);
                            }
                            continue;
                        }
                        Err(error) => break Err(error),
                    }
                }
            };
            let campaign = async { current.election(&self.name)?.campaign(&self.value).await };
            let campaign = tokio::select! {
                biased;
                () = &mut shutdown => break Ok(terms),
                campaign = campaign => campaign,
            };
            let leadership = match campaign {
                Ok(leadership) => Arc::new(leadership),
                Err(error) if passes(&error) => {
                    tracing::debug!(name = %self.name, %error, "leader selector: campaign failed; retrying");
                    if self.pause(shutdown.as_mut()).await {
                        break Ok(terms);
                    }
                    continue;
                }
                Err(error) => break Err(error),
            };
            terms += 1;
            tracing::debug!(name = %self.name, term = terms, token = %leadership.token(), "leader selector: elected");
            let ending = {
                let running = work(Term {
                    number: terms,
                    leadership: Arc::clone(&leadership),
                });
                tokio::pin!(running);
                tokio::select! {
                    biased;
                    () = leadership.lost() => Ending::Lost,
                    () = &mut shutdown => Ending::Shutdown,
                    () = &mut running => Ending::Returned,
                }
                // The work's future is dropped here, before anything else.
            };
            // On shutdown closing the session (below) ends the leadership
            // too: one round trip, not two, when the cluster is unreachable.
            if matches!(ending, Ending::Returned) {
                if let Ok(leadership) = Arc::try_unwrap(leadership) {
                    if let Err(error) = leadership.resign().await {
                        tracing::debug!(name = %self.name, %error, "leader selector: resigning failed");
                    }
                }
                // Otherwise the work kept a `Term`: the last clone resigns on drop.
            }
            if matches!(ending, Ending::Shutdown) || self.pause(shutdown.as_mut()).await {
                break Ok(terms);
            }
        };
        if let Some(session) = session {
            if let Err(error) = session.close().await {
                tracing::debug!(name = %self.name, %error, "leader selector: closing its session failed");
            }
        }
        outcome
    }

    /// Waits the pause; `true` when `shutdown` came first.
    async fn pause(&self, shutdown: std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
        tokio::select! {
            biased;
            () = shutdown => true,
            () = tokio::time::sleep(self.pause) => false,
        }
    }
}

/// Whether a failed campaign or session may succeed when tried again.
fn passes(error: &Error) -> bool {
    error.is_transient()
        || matches!(
            error,
            Error::SessionLost { .. } | Error::Closed { .. } | Error::LockLost { .. }
        )
}
