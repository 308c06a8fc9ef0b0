//! A contender in a process of its own, for tests that pause it (SIGSTOP)
//! past its session's timeout: it prints what it learns on resuming.
//!
//! ```text
//! pause_probe CONNECT NAME hold|wait TTL_MS
//! ```
//!
//! `hold` takes the lock, prints `held`, and after `lost()` prints
//! `release: <error kind>`; `wait` queues behind the current holder, prints
//! `queued`, then `lock: <error kind>` (or `lock: granted`).

use std::time::Duration;

use lockline::{Client, Error, SessionOptions};
use lockline_zookeeper::ZooKeeper;

fn kind(error: &Error) -> String {
    match error {
        Error::SessionLost { .. } => "SessionLost".into(),
        Error::LockLost { .. } => "LockLost".into(),
        other => format!("{other:?}"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [connect, name, role, ttl] = args.as_slice() else {
        return Err("usage: pause_probe CONNECT NAME hold|wait TTL_MS".into());
    };
    let ttl = Duration::from_millis(ttl.parse()?);
    let client = Client::new(ZooKeeper::new(connect.clone()));
    let session = client.session_with(SessionOptions::new().with_ttl(ttl)).await?;
    let mutex = session.mutex(name)?;
    match role.as_str() {
        "hold" => {
            let guard = mutex.lock().await?;
            println!("held");
            guard.lost().await;
            match guard.release().await {
                Ok(()) => println!("release: ok"),
                Err(error) => println!("release: {}", kind(&error)),
            }
        }
        "wait" => {
            let waiting = tokio::spawn(async move { mutex.lock().await });
            client.wait_for_stats(|s| s.waits >= 1).await;
            println!("queued");
            match waiting.await? {
                Ok(_) => println!("lock: granted"),
                Err(error) => println!("lock: {}", kind(&error)),
            }
        }
        other => return Err(format!("unknown role {other:?}").into()),
    }
    Ok(())
}
