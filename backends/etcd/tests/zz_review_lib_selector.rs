//! Review probes of `LeaderSelector` on a real etcd: leaders paused past
//! their TTL, revoked, their entry deleted; shutdown with the cluster gone.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use lockline::{Client, LeaderSelector, SessionOptions, Term, Write};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

#[derive(Debug, Clone)]
struct Attempt {
    selector: usize,
    token: u64,
    sent: Instant,
    done: Instant,
    result: Result<(), String>,
}

type Log = Arc<StdMutex<Vec<Attempt>>>;

/// The work: a fenced write every 30 ms, each logged with its send and
/// completion time.
fn work(
    selector: usize,
    log: Log,
    elected: tokio::sync::mpsc::UnboundedSender<(usize, u64, String)>,
) -> impl FnMut(Term) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    move |term: Term| {
        let log = Arc::clone(&log);
        let _ = elected.send((selector, term.token().get(), term.session().id().to_owned()));
        Box::pin(async move {
            loop {
                let sent = Instant::now();
                let result = term
                    .write_if_held([Write::put(
                        "review/selector/owner",
                        format!("{selector}:{}", term.token()),
                    )])
                    .await
                    .map_err(|e| format!("{e:?}"));
                let failed = result.is_err();
                log.lock().unwrap().push(Attempt {
                    selector,
                    token: term.token().get(),
                    sent,
                    done: Instant::now(),
                    result,
                });
                if failed {
                    // A refused write: stop, as a careful work would.
                    std::future::pending::<()>().await;
                }
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
        })
    }
}

/// No successful write of a lower term was sent after a higher term's
/// write completed (the fence, observed from outside).
fn check_fence(log: &[Attempt]) -> Vec<String> {
    let mut problems = Vec::new();
    for w in log.iter().filter(|a| a.result.is_ok()) {
        for newer in log.iter().filter(|a| a.result.is_ok() && a.token > w.token) {
            if newer.done < w.sent {
                problems.push(format!(
                    "selector {} token {} wrote (sent {:?} after) selector {} token {} had written",
                    w.selector,
                    w.token,
                    w.sent - newer.done,
                    newer.selector,
                    newer.token
                ));
            }
        }
    }
    problems
}

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2))
}

/// Three selectors, each on its own current-thread runtime in its own
/// thread; the leader's runtime is blocked (a GC pause / SIGSTOP) for 5 s,
/// three times in a row. A new leader is elected meanwhile; the paused one,
/// on waking, must have its work dropped, its writes refused, and campaign
/// again (it must lead again later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaders_paused_past_their_ttl() {
    let cluster = EtcdCluster::start().expect("etcd");
    let log: Log = Arc::default();
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel();
    let mut pausers = Vec::new();
    let mut stops = Vec::new();
    let mut threads = Vec::new();
    for i in 0..3 {
        let (pause_tx, mut pause_rx) = tokio::sync::mpsc::unbounded_channel::<Duration>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        pausers.push(pause_tx);
        stops.push(stop_tx);
        let endpoints = cluster.endpoints();
        let (log, elected_tx) = (Arc::clone(&log), elected_tx.clone());
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
                tokio::spawn(async move {
                    while let Some(pause) = pause_rx.recv().await {
                        std::thread::sleep(pause);
                    }
                });
                let selector = LeaderSelector::new(Client::new(Etcd::new(endpoints)), "review/sel", format!("s{i}"))
                    .with_session_options(options())
                    .with_pause(Duration::from_millis(50));
                selector
                    .run(
                        async move {
                            stop_rx.await.ok();
                        },
                        work(i, log, elected_tx),
                    )
                    .await
            })
        }));
    }
    drop(elected_tx);
    let mut leaders = Vec::new();
    let (mut leader, mut token, _) = tokio::time::timeout(Duration::from_secs(20), elected.recv())
        .await
        .expect("a first leader")
        .expect("elected");
    leaders.push((leader, token));
    for _ in 0..3 {
        pausers[leader].send(Duration::from_secs(5)).expect("pause");
        let (next, next_token, _) = tokio::time::timeout(Duration::from_secs(20), elected.recv())
            .await
            .expect("a new leader while the old one is paused")
            .expect("elected");
        assert!(next_token > token);
        leaders.push((next, next_token));
        (leader, token) = (next, next_token);
        // Let the paused one wake and settle.
        tokio::time::sleep(Duration::from_secs(6)).await;
    }
    // The paused selectors campaign again: kill the current leader's
    // leadership by pausing it once more and see who comes back.
    let everyone_led: std::collections::HashSet<usize> = leaders.iter().map(|(l, _)| *l).collect();
    for stop in stops {
        let _ = stop.send(());
    }
    let mut outcomes = Vec::new();
    for t in threads {
        outcomes.push(t.join().expect("thread"));
    }
    let log = log.lock().unwrap().clone();
    let refused: Vec<&Attempt> = log.iter().filter(|a| a.result.is_err()).collect();
    eprintln!("leaders (selector, token): {leaders:?}");
    eprintln!("run outcomes: {outcomes:?}");
    for a in &refused {
        eprintln!("refused: selector {} token {}: {:?}", a.selector, a.token, a.result);
    }
    let problems = check_fence(&log);
    assert!(problems.is_empty(), "{problems:#?}");
    for outcome in &outcomes {
        assert!(outcome.is_ok(), "{outcome:?}");
    }
    assert!(everyone_led.len() >= 2, "{leaders:?}");
}

/// One selector alone; its leadership is ended from outside (lease revoked
/// with etcdctl; then its key deleted with etcdctl). Each time the work must
/// be dropped and the selector lead again (a new term), on a new session
/// after the revoke and on the same one after the delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_selector_comes_back_after_revoke_and_delete() {
    let cluster = EtcdCluster::start().expect("etcd");
    let log: Log = Arc::default();
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let selector = LeaderSelector::new(Client::new(Etcd::new(cluster.endpoints())), "review/lone", "me")
        .with_session_options(SessionOptions::new().with_ttl(Duration::from_secs(5)))
        .with_pause(Duration::from_millis(50));
    let running = tokio::spawn(selector.run(
        async move {
            stop_rx.await.ok();
        },
        work(0, Arc::clone(&log), elected_tx),
    ));
    let (_, t1, s1) = tokio::time::timeout(Duration::from_secs(10), elected.recv())
        .await
        .expect("term 1")
        .expect("e");
    let revoke = cluster
        .etcdctl(&cluster.endpoints())
        .args(["lease", "revoke", &s1])
        .output()
        .expect("etcdctl");
    assert!(revoke.status.success(), "{revoke:?}");
    let (_, t2, s2) = tokio::time::timeout(Duration::from_secs(15), elected.recv())
        .await
        .expect("term 2 after the revoke")
        .expect("e");
    eprintln!("term 1 token {t1} session {s1}; term 2 token {t2} session {s2}");
    assert_ne!(s1, s2, "a new session after the revoke");
    let key = format!("review/lone/{s2}");
    let del = cluster
        .etcdctl(&cluster.endpoints())
        .args(["del", &key])
        .output()
        .expect("etcdctl");
    assert!(del.status.success(), "{del:?}");
    let (_, t3, s3) = tokio::time::timeout(Duration::from_secs(15), elected.recv())
        .await
        .expect("term 3 after the delete")
        .expect("e");
    eprintln!("term 3 token {t3} session {s3}");
    assert!(t3 > t2);
    let _ = stop_tx.send(());
    let terms = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("run returns")
        .expect("task")
        .expect("run");
    assert_eq!(terms, 3);
    let problems = check_fence(&log.lock().unwrap());
    assert!(problems.is_empty(), "{problems:#?}");
}

/// Shutdown while the cluster cannot be reached (a silent partition): `run`
/// returns at most the request timeout after the shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_the_cluster_blackholed() {
    let cluster = EtcdCluster::start().expect("etcd");
    let proxy = TcpProxy::start(&cluster.endpoint(0).trim_start_matches("http://").to_owned()).expect("proxy");
    let (elected_tx, mut elected) = tokio::sync::mpsc::unbounded_channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let log: Log = Arc::default();
    let options = SessionOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_request_timeout(Duration::from_secs(2));
    let selector = LeaderSelector::new(
        Client::new(Etcd::new([format!("http://{}", proxy.address())])),
        "review/shutdown",
        "me",
    )
    .with_session_options(options);
    let running = tokio::spawn(selector.run(
        async move {
            stop_rx.await.ok();
        },
        work(0, log, elected_tx),
    ));
    tokio::time::timeout(Duration::from_secs(10), elected.recv())
        .await
        .expect("elected");
    proxy.blackhole();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let _ = stop_tx.send(());
    let result = tokio::time::timeout(Duration::from_secs(20), running).await;
    let took = started.elapsed();
    eprintln!("run after shutdown with the cluster blackholed: {result:?} after {took:?}");
    assert!(
        took < Duration::from_millis(2500),
        "promised at most the request timeout (2s), took {took:?}"
    );
    proxy.heal();
}

/// Two selectors; the leader's work returns by itself at once, every time.
/// The selector resigns, so leadership must alternate (FIFO), and each work
/// starts only after the other's ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_that_return_hand_over() {
    let cluster = EtcdCluster::start().expect("etcd");
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let order = Arc::new(StdMutex::new(Vec::new()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for i in 0..2 {
        let (inside, most, order) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&order));
        let mut stop = stop_rx.clone();
        let selector = LeaderSelector::new(
            Client::new(Etcd::new(cluster.endpoints())),
            "review/hand",
            format!("s{i}"),
        )
        .with_pause(Duration::from_millis(100));
        tasks.push(tokio::spawn(selector.run(
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            move |term: Term| {
                let (inside, most, order) = (Arc::clone(&inside), Arc::clone(&most), Arc::clone(&order));
                async move {
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    order.lock().unwrap().push(i);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(term);
                }
            },
        )));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_tx.send_replace(true);
    for t in tasks {
        t.await.expect("task").expect("run");
    }
    let order = order.lock().unwrap().clone();
    eprintln!("terms in order: {order:?}");
    assert_eq!(most.load(Ordering::SeqCst), 1);
    let repeats = order.windows(2).filter(|w| w[0] == w[1]).count();
    assert!(order.len() >= 6, "{order:?}");
    assert_eq!(
        repeats, 0,
        "the same selector led twice in a row although another was queued: {order:?}"
    );
}
