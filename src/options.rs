//! Session options (TTL, safety margin, keepalive, timeouts, lock-delay)
//! and the states a session moves through.

use std::time::Duration;

use crate::{Error, Result};

/// The longest TTL accepted: one day. A lock whose holder may vanish for longer
/// than that before anyone notices is almost certainly a configuration mistake.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest TTL accepted: one second (etcd leases count whole seconds).
pub const MIN_TTL: Duration = Duration::from_secs(1);

/// The longest lock-delay accepted: one minute, as Chubby bounds it.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

/// How a session is kept alive and how quickly its loss is declared.
///
/// ```
/// use std::time::Duration;
/// use lockline::SessionOptions;
///
/// let options = SessionOptions::new()
///     .with_ttl(Duration::from_secs(5))
///     .with_safety_margin(Duration::from_secs(1));
/// assert_eq!(options.ttl(), Duration::from_secs(5));
/// assert!(options.validate().is_ok());
/// assert!(SessionOptions::new().with_ttl(Duration::ZERO).validate().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    ttl: Duration,
    safety_margin: Option<Duration>,
    keepalive_interval: Option<Duration>,
    connect_timeout: Duration,
    request_timeout: Duration,
    lock_delay: Duration,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            ttl: Duration::from_secs(10),
            safety_margin: None,
            keepalive_interval: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
            lock_delay: Duration::ZERO,
        }
    }
}

impl SessionOptions {
    /// The defaults: a 10 s TTL, a safety margin of a fifth of the TTL, a
    /// keepalive every third of the TTL, 5 s connect and request timeouts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the TTL: how long the server keeps the session's entries after the
    /// client stops renewing it (etcd lease TTL, rounded up to whole seconds;
    /// ZooKeeper session timeout). Between 1 s and 1 day.
    pub fn with_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the safety margin: a holder declares its locks lost when it has not
    /// confirmed its session for `ttl - safety_margin`, that long before the
    /// server could hand them to someone else. Must be shorter than the TTL.
    pub fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = Some(margin);
        self
    }

    /// Sets how often the session is renewed. Must leave room for at least one
    /// renewal before `ttl - safety_margin`.
    pub fn with_keepalive_interval(mut self, interval: Duration) -> Self {
        self.keepalive_interval = Some(interval);
        self
    }

    /// Sets how long opening a session may take before
    /// [`Error::Unavailable`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets how long one request to the server may take before it is given up.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the lock-delay (Chubby's, Consul's): a contender of this session
    /// that is next in line after a holder who lost its lock *involuntarily*
    /// (its session expired, was cut off or its process died) waits this
    /// long, counted from when it saw the holder's entry go, before it is
    /// granted, so that the old holder's requests still in flight drain
    /// first. A holder's clean release (`release()`, `resign()`, `close()`)
    /// hands on at once. Zero (the default) turns it off; at most
    /// [`MAX_LOCK_DELAY`]. A heuristic for resources that cannot check
    /// fencing tokens or sequencers: it bounds nothing if the old holder's
    /// requests take longer.
    ///
    /// It is the waiting contender's setting: give it to every session that
    /// takes the lock.
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// The lock-delay (zero unless set).
    pub fn lock_delay(&self) -> Duration {
        self.lock_delay
    }

    /// The TTL.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The safety margin (a fifth of the TTL unless set).
    pub fn safety_margin(&self) -> Duration {
        self.safety_margin.unwrap_or(self.ttl / 5)
    }

    /// The keepalive interval (a third of the TTL unless set).
    pub fn keepalive_interval(&self) -> Duration {
        self.keepalive_interval.unwrap_or(self.ttl / 3)
    }

    /// The connect timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// The request timeout.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// How long the session may go unconfirmed before its locks are declared
    /// lost: `ttl - safety_margin`.
    pub fn loss_deadline(&self) -> Duration {
        self.ttl.saturating_sub(self.safety_margin())
    }

    /// Checks that the options make sense together.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidOptions`] naming the first problem found.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(Error::InvalidOptions { reason });
        if self.ttl < MIN_TTL {
            return invalid(format!("ttl {:?} is shorter than the minimum of 1s", self.ttl));
        }
        if self.ttl > MAX_TTL {
            return invalid(format!("ttl {:?} is longer than the maximum of one day", self.ttl));
        }
        let margin = self.safety_margin();
        if margin >= self.ttl {
            return invalid(format!(
                "safety margin {margin:?} must be shorter than the ttl {:?}",
                self.ttl
            ));
        }
        let keepalive = self.keepalive_interval();
        if keepalive.is_zero() {
            return invalid("keepalive interval must not be zero".to_owned());
        }
        if keepalive >= self.loss_deadline() {
            return invalid(format!(
                "keepalive interval {keepalive:?} leaves no renewal before the loss deadline {:?} (ttl - safety margin)",
                self.loss_deadline()
            ));
        }
        if self.lock_delay > MAX_LOCK_DELAY {
            return invalid(format!(
                "lock-delay {:?} is longer than the maximum of one minute",
                self.lock_delay
            ));
        }
        for (what, value) in [
            ("connect timeout", self.connect_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if value.is_zero() || value > MAX_TTL {
                return invalid(format!("{what} {value:?} must be above zero and at most one day"));
            }
        }
        Ok(())
    }
}

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SessionState {
    /// Confirmed by the server recently enough: its locks are held.
    Live,
    /// Not confirmed for a while (connection lost) but not yet past the loss
    /// deadline: its locks may still be held. It becomes `Live` again when the
    /// same session is confirmed, or `Lost`.
    Suspended,
    /// Expired, revoked, or unconfirmed past the loss deadline: its locks must be
    /// assumed held by others. Final.
    Lost,
    /// Closed by its owner; its locks were released. Final.
    Closed,
}

impl SessionState {
    /// Whether the state is final (`Lost` or `Closed`).
    pub fn is_over(self) -> bool {
        matches!(self, SessionState::Lost | SessionState::Closed)
    }

    /// Whether a session in this state may move to `next`: `Lost` and
    /// `Closed` are final, `Suspended` is entered only from `Live`, and `Live`
    /// is re-entered only from `Suspended`.
    pub fn may_become(self, next: SessionState) -> bool {
        match next {
            SessionState::Lost | SessionState::Closed => !self.is_over(),
            SessionState::Suspended => self == SessionState::Live,
            SessionState::Live => self == SessionState::Suspended,
        }
    }
}
