//! N contenders on one resource, each its own client and session, and the
//! contests they run: in EX, or in the mixed workload's modes.

use std::sync::Arc;
use std::time::Instant;

use lockline::{Client, Error, LockMode, Resource, Session, SessionOptions};

use crate::contenders::{counts, SESSION_TTL};
use crate::contest::{Contest, Sampling};

use super::mixed::{mixed_contender, MixedCounts};
use super::workload::Dice;

/// N contenders on one resource, each its own client and session.
pub(super) struct ResourceContenders {
    clients: Vec<Client>,
    sessions: Vec<Session>,
    resources: Vec<Resource>,
}

impl ResourceContenders {
    /// Opens `n` contenders on the resource `name`, each with a client from
    /// `client` and a session on it, one after the other.
    pub(super) async fn open(n: usize, name: &str, client: &mut dyn FnMut() -> Client) -> lockline::Result<Self> {
        let mut opened = ResourceContenders {
            clients: Vec::new(),
            sessions: Vec::new(),
            resources: Vec::new(),
        };
        for _ in 0..n {
            let client = client();
            let session = client.session_with(SessionOptions::new().with_ttl(SESSION_TTL)).await?;
            opened.resources.push(session.resource(name)?);
            opened.sessions.push(session);
            opened.clients.push(client);
        }
        Ok(opened)
    }

    /// Client-counted wakeups per release so far.
    pub(super) fn wakeups_per_release(&self) -> f64 {
        let counted = counts(&self.clients);
        counted.wakeups as f64 / counted.releases.max(1) as f64
    }

    /// Closes every session, one after the other.
    pub(super) async fn close(self) -> lockline::Result<()> {
        for session in &self.sessions {
            session.close().await?;
        }
        Ok(())
    }

    /// Starts every contender's loop in EX: lock, [`granted`](crate::Contender::granted),
    /// [`releasing`](crate::Contender::releasing), release, until stopped.
    pub(super) fn ex_contest(&self) -> Contest {
        let mut each = self.resources.clone().into_iter();
        Contest::start(self.resources.len(), Sampling::Window, move |mut contender| {
            let resource = each.next().expect("one resource per contender");
            async move {
                while contender.running() {
                    let started = Instant::now();
                    let guard = resource.lock(LockMode::Ex).await?;
                    contender.granted(started);
                    contender.releasing();
                    guard.release().await?;
                }
                Ok::<_, Error>(())
            }
        })
    }

    /// Starts every contender's loop of the mixed workload, each with its
    /// dice for `seed`, counting into `counts`.
    pub(super) fn mixed_contest(&self, seed: u64, counts: &Arc<MixedCounts>) -> Contest {
        let mut each = self.resources.clone().into_iter();
        let counts = Arc::clone(counts);
        Contest::start(self.resources.len(), Sampling::Window, move |contender| {
            let resource = each.next().expect("one resource per contender");
            let dice = Dice::new(seed, contender.who());
            mixed_contender(contender, resource, dice, Arc::clone(&counts))
        })
    }
}
