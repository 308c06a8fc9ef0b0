//! A leadership loop: three workers each run a `LeaderSelector`; whoever
//! leads runs the work, and when its session is killed the work is dropped
//! and another worker takes over, until the program shuts them all down.
//!
//! ```text
//! cargo run --example leader_selector
//! ```
//!
//! It runs on the in-process backend; on a server, build the `Client` from
//! `lockline_etcd::Etcd` or `lockline_zookeeper::ZooKeeper` instead.

use std::time::Duration;

use lockline::{Client, LeaderSelector, MemoryBackend, Session, Term, Write};

async fn run() -> lockline::Result<()> {
    let store = MemoryBackend::new();
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel::<(String, Session)>();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for worker in ["worker-a", "worker-b", "worker-c"] {
        let selector = LeaderSelector::new(Client::new(store.clone()), "/jobs/scheduler", worker)
            .with_pause(Duration::from_millis(10));
        let mut stopped = stopped.clone();
        let elected_tx = elected_tx.clone();
        let calls = calls.clone();
        let shutdown = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        workers.push(tokio::spawn(selector.run(shutdown, move |term: Term| {
            let elected_tx = elected_tx.clone();
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                println!("{worker}: term {} with token {}", term.number(), term.token());
                // The work: state only the current leader may change.
                let written = term.write_if_held([Write::put("/jobs/scheduler-owner", worker)]).await;
                if written.is_ok() {
                    let _ = elected_tx.send((worker.to_owned(), term.session().clone()));
                }
                // Runs until leadership is lost or the selector shuts down.
                std::future::pending::<()>().await;
            }
        })));
    }
    drop(elected_tx);
    let reader = Client::new(store.clone()).session().await?;
    let mut leaders = Vec::new();
    for _ in 0..3 {
        let (leader, session) = elected.recv().await.expect("a leader");
        let owner = reader.read("/jobs/scheduler-owner").await?.unwrap_or_default();
        assert_eq!(owner, leader.as_bytes());
        println!("  {leader} leads; killing its session");
        leaders.push(leader);
        store.expire(session.id()); // the next worker takes over
    }
    let (last, _) = elected.recv().await.expect("a leader after the third kill");
    println!("  {last} leads; shutting down");
    stop.send_replace(true);
    let mut terms = 0;
    for worker in workers {
        terms += worker.await.expect("worker task")?;
    }
    println!("{terms} terms served");
    // Four terms were announced. When the last leader shuts down, the next in
    // line may be elected before its own shutdown signal reaches it: that
    // term is served (and its work dropped at once) and counted too.
    assert!((4..=6).contains(&terms), "{terms} terms");
    assert_eq!(terms, calls.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(reader.election("/jobs/scheduler")?.leader().await?, None);
    Ok(())
}

#[tokio::main]
async fn main() -> lockline::Result<()> {
    run().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_killed_leader_is_replaced() {
    run().await.expect("the example runs");
}
