//! Fenced writes: state guarded by a lock, written to the lock's own store
//! only while the lock is still held, so a holder that was paused past its
//! session's end and wakes up cannot overwrite its successor's work.
//!
//! ```text
//! cargo run --example fenced_writes
//! ```
//!
//! It runs on the in-process backend; on a server, build the `Client` from
//! `lockline_etcd::Etcd` (one `Txn` comparing the holder's create revision) or
//! `lockline_zookeeper::ZooKeeper` (one `multi` beginning with a `check` of the
//! holder's node; keys are then absolute paths such as `/reports/state`).

use lockline::{Client, Error, MemoryBackend, Write};

const LOCK: &str = "/reports/nightly";
const STATE: &str = "/reports/state";
const LAST: &str = "/reports/last-holder";

async fn run() -> lockline::Result<()> {
    let store = MemoryBackend::new();
    let (first, second) = (
        Client::new(store.clone()).session().await?,
        Client::new(store.clone()).session().await?,
    );

    // The first worker takes the lock and records its progress, fenced.
    let stale = first.mutex(LOCK)?.lock().await?;
    stale
        .write_if_held([
            Write::put(STATE, "step 1 of 3"),
            Write::put(LAST, format!("first (token {})", stale.token())),
        ])
        .await?;
    println!("first worker wrote {:?}", text(first.read(STATE).await?));

    // It stalls (a GC pause, a stopped VM); its session expires and the
    // second worker, queued behind it, takes over.
    let waiting = second.mutex(LOCK)?;
    let takeover = tokio::spawn(async move { waiting.lock().await });
    store.expire(first.id());
    let newer = takeover.await.map_err(|e| Error::backend("memory", e))??;
    newer
        .write_if_held([
            Write::put(STATE, "restarted: step 1 of 3"),
            Write::put(LAST, format!("second (token {})", newer.token())),
        ])
        .await?;

    // The first worker wakes up and carries on where it left off: refused,
    // and nothing of its batch is written.
    let late = stale
        .write_if_held([Write::put(STATE, "step 2 of 3"), Write::delete(LAST)])
        .await;
    println!("the stalled worker's write: {late:?}");
    assert!(matches!(late, Err(Error::SessionLost { .. })));
    let state = text(second.read(STATE).await?);
    let last = text(second.read(LAST).await?);
    println!("state {state:?}, last holder {last:?}");
    assert_eq!(state, "restarted: step 1 of 3");
    assert!(last.starts_with("second"));

    newer.release().await?;
    second.close().await
}

fn text(value: Option<Vec<u8>>) -> String {
    String::from_utf8_lossy(&value.unwrap_or_default()).into_owned()
}

#[tokio::main]
async fn main() -> lockline::Result<()> {
    run().await
}

#[tokio::test]
async fn a_stalled_holder_writes_nothing() {
    run().await.expect("the example runs");
}
