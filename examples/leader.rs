//! Leader election with fencing: several candidates, one leader at a time doing
//! work stamped with its fencing token, and a leader that dies is replaced.
//!
//! ```text
//! cargo run --example leader
//! ```
//!
//! It runs on the in-process backend; on a server, build the `Client` from
//! `lockline_etcd::Etcd` or `lockline_zookeeper::ZooKeeper` instead: nothing
//! else changes.

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt;
use lockline::{Client, FencingToken, MemoryBackend, Session, SessionOptions};

/// A store that remembers the highest token it accepted and refuses older ones.
#[derive(Default)]
struct FencedStore {
    highest: StdMutex<Option<FencingToken>>,
}

impl FencedStore {
    fn write(&self, token: FencingToken, what: &str) -> bool {
        let mut highest = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if highest.is_some_and(|h| token < h) {
            println!("    store: REFUSED {what:?} from stale token {token}");
            return false;
        }
        *highest = Some(token);
        println!("    store: accepted {what:?} with token {token}");
        true
    }
}

async fn candidate(name: String, session: Session, store: Arc<FencedStore>) -> lockline::Result<()> {
    let election = session.election("demo/scheduler")?;
    let leadership = match election.campaign(name.as_bytes()).await {
        Ok(leadership) => leadership,
        Err(lockline::Error::SessionLost { .. }) => {
            println!("{name}: session lost while waiting to lead");
            return Ok(());
        }
        Err(error) => return Err(error),
    };
    println!("{name}: elected (token {})", leadership.token());
    for round in 1..=3 {
        tokio::select! {
            () = leadership.lost() => {
                println!("{name}: leadership lost; stopping work");
                return Ok(());
            }
            () = tokio::time::sleep(Duration::from_millis(20)) => {
                store.write(leadership.token(), &format!("{name} round {round}"));
            }
        }
    }
    println!("{name}: done, resigning");
    leadership.resign().await
}

#[tokio::main]
async fn main() -> lockline::Result<()> {
    let backend = MemoryBackend::new();
    let options = SessionOptions::new().with_ttl(Duration::from_secs(2));
    let store = Arc::new(FencedStore::default());

    // An observer that is not a candidate prints every change of leader.
    let observer = Client::new(backend.clone()).session().await?;
    let mut changes = Box::pin(observer.election("demo/scheduler")?.observe());
    let watcher = tokio::spawn(async move {
        while let Some(change) = changes.next().await {
            match change {
                Ok(Some(leader)) => println!("observer: leader is {}", String::from_utf8_lossy(leader.value())),
                Ok(None) => println!("observer: no leader"),
                Err(lockline::Error::Closed { .. }) => break,
                Err(error) => {
                    println!("observer: {error}");
                    break;
                }
            }
        }
    });

    let mut sessions = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..3 {
        let session = Client::new(backend.clone()).session_with(options.clone()).await?;
        sessions.push(session.clone());
        let name = format!("candidate-{i}");
        tasks.push(tokio::spawn(candidate(name, session, Arc::clone(&store))));
        tokio::task::yield_now().await;
    }

    // The first leader "dies": its session expires on the server.
    let mut leaders = Box::pin(observer.election("demo/scheduler")?.observe());
    let first = loop {
        match leaders.next().await {
            Some(Ok(Some(leader))) => break String::from_utf8_lossy(leader.value()).into_owned(),
            Some(Ok(None)) => continue,
            Some(Err(error)) => return Err(error),
            None => return Ok(()),
        }
    };
    tokio::time::sleep(Duration::from_millis(30)).await;
    println!("-- {first}'s session expires --");
    let index: usize = first.trim_start_matches("candidate-").parse().unwrap_or(0);
    backend.expire(sessions[index].id());

    for task in tasks {
        match task.await {
            Ok(result) => result?,
            Err(join) => eprintln!("a candidate panicked: {join}"),
        }
    }
    observer.close().await?;
    let _ = watcher.await;
    Ok(())
}
