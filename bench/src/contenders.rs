//! lockline's side of a handoff benchmark: N contenders on one lock, each
//! its own client and session (as separate processes would be), their lock →
//! release loop, and what their clients counted.

use std::time::{Duration, Instant};

use lockline::{Client, Session, SessionOptions};

use crate::contest::{Contest, Sampling};
use crate::crowd::CrowdCounts;

/// Every benchmark session's TTL.
pub const SESSION_TTL: Duration = Duration::from_secs(10);

/// The grants, wakeups and releases `clients` counted, summed
/// ([`Client::stats`]).
pub fn counts(clients: &[Client]) -> CrowdCounts {
    clients.iter().fold(CrowdCounts::default(), |sum, client| {
        let stats = client.stats();
        CrowdCounts {
            grants: sum.grants + stats.grants,
            wakeups: sum.wakeups + stats.wakeups,
            releases: sum.releases + stats.releases,
        }
    })
}

/// N lockline contenders on one lock, each its own client and session.
#[derive(Debug)]
pub struct Contenders {
    clients: Vec<Client>,
    mutexes: Vec<lockline::Mutex>,
}

impl Contenders {
    /// Opens `n` contenders on the lock `name`: each gets a client from
    /// `client` and opens a session on it with a TTL of [`SESSION_TTL`], one
    /// after the other.
    ///
    /// # Errors
    ///
    /// When a session cannot be opened or the name is refused.
    pub async fn open(n: usize, name: &str, mut client: impl FnMut() -> Client) -> lockline::Result<Self> {
        let mut clients = Vec::new();
        let mut mutexes = Vec::new();
        for _ in 0..n {
            let client = client();
            let session = client.session_with(SessionOptions::new().with_ttl(SESSION_TTL)).await?;
            mutexes.push(session.mutex(name)?);
            clients.push(client);
        }
        Ok(Contenders { clients, mutexes })
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.mutexes.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.mutexes.is_empty()
    }

    /// Their mutexes, one per contender.
    pub fn mutexes(&self) -> &[lockline::Mutex] {
        &self.mutexes
    }

    /// Their clients.
    pub fn clients(&self) -> &[Client] {
        &self.clients
    }

    /// Starts every contender's loop: lock, [`granted`](crate::Contender::granted),
    /// [`releasing`](crate::Contender::releasing), release, until stopped.
    pub fn contest(&self, sampling: Sampling) -> Contest {
        let mut mutexes = self.mutexes.clone().into_iter();
        Contest::start(self.mutexes.len(), sampling, move |mut contender| {
            let mutex = mutexes.next().expect("one mutex per contender");
            async move {
                while contender.running() {
                    let started = Instant::now();
                    let guard = mutex.lock().await?;
                    contender.granted(started);
                    contender.releasing();
                    guard.release().await?;
                }
                Ok::<_, lockline::Error>(())
            }
        })
    }

    /// What their clients counted so far, summed.
    pub fn counts(&self) -> CrowdCounts {
        counts(&self.clients)
    }

    /// Client-counted wakeups per release so far.
    pub fn wakeups_per_release(&self) -> f64 {
        let counts = self.counts();
        counts.wakeups as f64 / counts.releases.max(1) as f64
    }

    /// Their sessions.
    pub fn sessions(&self) -> impl Iterator<Item = &Session> {
        self.mutexes.iter().map(lockline::Mutex::session)
    }

    /// Closes every session, one after the other.
    ///
    /// # Errors
    ///
    /// The first close that fails.
    pub async fn close(self) -> lockline::Result<()> {
        for mutex in &self.mutexes {
            mutex.session().close().await?;
        }
        Ok(())
    }
}
