//! Attacks on the EX request's window of the queue (`AppendRequest::nearest`,
//! Lua `window_of`), on a Redis node and a 3-master cluster, each started by
//! the test kit.
//!
//! Random queues of crafted lock-mode entries (settled NL holders mostly,
//! some other holders, waiting requests, conversions), with random entries'
//! hashes deleted (as an expiry leaves them: member still queued). Then:
//! - a raw append with a window of 4 must read exactly the suffix of the
//!   whole queue (at most 4 live entries before it, itself, those after),
//!   every slot as a whole read gives it;
//! - an EX `try_lock` / `lock_timeout` through the API must be granted
//!   exactly when every live entry is a settled NL holder.

use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{AppendRequest, BackendSession, Conflicts, EntryKind, Queue};
use lockline::conformance::bounded;
use lockline::{Client, Error, LockMode};
use lockline_redis::Redis;
use lockline_testkit::{RedisCluster, RedisServer};

mod support;

struct Rng(u64);
impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

const MODES: [&str; 6] = ["NL", "CR", "CW", "PR", "PW", "EX"];

/// A crafted state: `dlm2 <granted|-> <requested> 0 0 0 0 <nonce>`.
fn value(granted: Option<&str>, requested: &str) -> Vec<u8> {
    format!("dlm2 {} {} 0 0 0 0 0000abcd", granted.unwrap_or("-"), requested).into_bytes()
}

/// Deletes `key` on whichever node holds it.
async fn del(urls: &[String], key: &str) {
    for url in urls {
        let mut side = support::side(url).await;
        let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(key).query_async(&mut side).await;
    }
}

fn attempts(queue: &Queue) -> Vec<String> {
    queue.slots.iter().map(|s| s.entry.key.clone()).collect()
}

async fn run(backend: Redis, urls: Vec<String>, trials: usize, seed: u64) {
    let client = Client::new(backend);
    let crafter = bounded("session", client.session()).await.expect("session");
    let raw: Arc<dyn BackendSession> = Arc::clone(crafter.backend_session());
    let writer = bounded("session", client.session()).await.expect("session");
    let mut rng = Rng(seed);
    let mut grants = 0;
    let mut refusals = 0;
    for trial in 0..trials {
        let name = format!("win/{trial}");
        let len = rng.below(24);
        let mut live_states: Vec<(bool, bool)> = Vec::new(); // (live, settled NL)
        for i in 0..len {
            let (g, r) = match rng.below(20) {
                0..=13 => (Some("NL"), "NL"),
                14 | 15 => {
                    let m = MODES[1 + rng.below(5)];
                    (Some(m), m)
                }
                16 | 17 => (None, MODES[rng.below(6)]),
                _ => (Some("NL"), MODES[1 + rng.below(5)]),
            };
            let attempt = format!("t{trial}x{i}");
            let v = value(g, r);
            let request = AppendRequest {
                dir: &name,
                kind: EntryKind::Dlm,
                attempt: &attempt,
                value: &v,
                conflicts: Conflicts::All,
                nearest: 0,
            };
            bounded("append", raw.append(&request)).await.expect("append");
            let expire = rng.below(3) == 0;
            if expire {
                del(&urls, &format!("{{{name}}}:e:{attempt}")).await;
            }
            live_states.push((!expire, g.is_none_or(|g| g == "NL") && r == "NL"));
        }
        let blocked = live_states.iter().any(|&(live, nl)| live && !nl);

        // The raw window against the whole queue.
        if rng.below(2) == 0 {
            let attempt = format!("t{trial}probe");
            let v = value(None, "EX");
            let request = AppendRequest {
                dir: &name,
                kind: EntryKind::Dlm,
                attempt: &attempt,
                value: &v,
                conflicts: Conflicts::All,
                nearest: 4,
            };
            let appended = bounded("append", raw.append(&request)).await.expect("append");
            let window = appended.queue.expect("window");
            let whole = bounded("read", raw.read_queue(&name)).await.expect("read");
            let at = whole
                .slots
                .iter()
                .position(|s| s.entry == appended.entry)
                .expect("mine");
            let from = at.saturating_sub(4);
            assert_eq!(
                attempts(&window),
                attempts(&whole)[from..].to_vec(),
                "trial {trial}: the window is not the whole queue's suffix"
            );
            // Each slot as a read gives it, the appended one included (its
            // slot is built by the script that wrote it, not read back).
            assert_eq!(
                window.slots,
                whole.slots[from..].to_vec(),
                "trial {trial}: the window's slots are not the whole queue's"
            );
            assert_eq!(window.block, whole.block, "trial {trial}: the window's block");
            bounded("remove", raw.remove(&appended.entry)).await.expect("remove");
        }

        let resource = writer.resource(&name).expect("resource");
        let got = if rng.below(2) == 0 {
            bounded("try", resource.try_lock(LockMode::Ex)).await.expect("try_lock")
        } else {
            match bounded(
                "lock_timeout",
                resource.lock_timeout(LockMode::Ex, Duration::from_millis(150)),
            )
            .await
            {
                Ok(g) => Some(g),
                Err(Error::Timeout { .. }) => None,
                Err(e) => panic!("trial {trial}: {e}"),
            }
        };
        match got {
            Some(guard) => {
                let contenders = bounded("contenders", resource.contenders()).await.expect("contenders");
                assert!(
                    !blocked,
                    "trial {trial}: EX granted beside a live blocker: {:?} (crafted {live_states:?})",
                    contenders.iter().map(|c| (c.granted, c.requested)).collect::<Vec<_>>()
                );
                grants += 1;
                bounded("release", guard.release()).await.expect("release");
            }
            None => {
                assert!(
                    blocked,
                    "trial {trial}: EX refused with no blocker (crafted {live_states:?})"
                );
                refusals += 1;
            }
        }
    }
    eprintln!("grants {grants}, refusals {refusals}");
    assert!(grants > trials / 10 && refusals > trials / 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_random_queues_with_expired_entries() {
    let server = RedisServer::start().expect("start redis");
    run(Redis::new(server.url()), vec![server.url()], 300, 0x1234_5678_9abc_def1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_random_queues_with_expired_entries() {
    let cluster = RedisCluster::start(3).expect("start a cluster");
    run(
        Redis::cluster(cluster.urls()),
        cluster.urls(),
        150,
        0x0fed_cba9_8765_4321,
    )
    .await;
}

/// Live contenders: many NL holders (so EX requests queue behind more than
/// 4 entries), PR/CW/PW/EX requests with timeouts, some futures dropped,
/// and NL holders' entries deleted behind their backs (expired: the window
/// passes over them). A local set of holders, added after a grant returns
/// and removed before the release starts, is a subset of the server's
/// holders at every instant: two incompatible modes in it are a violation.
async fn live(backend: Redis, urls: Vec<String>, seed: u64, secs: u64) {
    use std::sync::Mutex;
    let client = Client::new(backend);
    let held: Arc<Mutex<Vec<(usize, LockMode)>>> = Arc::default();
    let violations: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Instant::now() + Duration::from_secs(secs);
    let grants = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for task in 0..10usize {
        let client = client.clone();
        let held = Arc::clone(&held);
        let violations = Arc::clone(&violations);
        let grants = Arc::clone(&grants);
        tasks.push(tokio::spawn(async move {
            let mut rng = Rng(seed ^ (task as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            let session = client.session().await.expect("session");
            let resource = session.resource("live").expect("resource");
            while Instant::now() < stop {
                let mode = match rng.below(10) {
                    0..=4 => LockMode::Nl,
                    5..=7 => LockMode::Ex,
                    8 => LockMode::Pr,
                    _ => [LockMode::Cw, LockMode::Pw, LockMode::Cr][rng.below(3)],
                };
                let how = rng.below(4);
                let got = match how {
                    0 => resource.try_lock(mode).await.map_err(|e| e.to_string()),
                    1 => {
                        // Dropped mid-wait.
                        match tokio::time::timeout(Duration::from_millis(rng.below(60) as u64), resource.lock(mode))
                            .await
                        {
                            Ok(r) => r.map(Some).map_err(|e| e.to_string()),
                            Err(_) => Ok(None),
                        }
                    }
                    _ => match resource
                        .lock_timeout(mode, Duration::from_millis(20 + rng.below(300) as u64))
                        .await
                    {
                        Ok(g) => Ok(Some(g)),
                        Err(Error::Timeout { .. }) => Ok(None),
                        Err(e) => Err(e.to_string()),
                    },
                };
                let guard = match got {
                    Ok(Some(g)) => g,
                    Ok(None) => continue,
                    Err(e) => {
                        // An NL request the chaos below deleted once the
                        // server had granted it, before its acquire
                        // returned: lost (`SessionLost`, `LockLost`).
                        if mode == LockMode::Nl && (e.contains("lost") || e.contains("deleted by someone else")) {
                            continue;
                        }
                        violations
                            .lock()
                            .unwrap()
                            .push(format!("task {task} {mode}: error {e}"));
                        continue;
                    }
                };
                grants.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                {
                    let mut h = held.lock().unwrap();
                    for &(other, m) in h.iter() {
                        if !m.compatible(mode) {
                            violations
                                .lock()
                                .unwrap()
                                .push(format!("task {task} granted {mode} beside task {other} in {m}"));
                        }
                    }
                    h.push((task, mode));
                }
                let hold = if mode == LockMode::Nl {
                    100 + rng.below(400)
                } else {
                    rng.below(15)
                };
                tokio::time::sleep(Duration::from_millis(hold as u64)).await;
                held.lock().unwrap().retain(|&(t, _)| t != task);
                let _ = guard.release().await;
            }
        }));
    }
    // Chaos: NL holders' entries expire (hash deleted, member left queued).
    let chaos = {
        let urls = urls.clone();
        let client = client.clone();
        tokio::spawn(async move {
            let session = client.session().await.expect("session");
            let resource = session.resource("live").expect("resource");
            let mut rng = Rng(seed ^ 0xc4a0);
            while Instant::now() < stop {
                tokio::time::sleep(Duration::from_millis(30 + rng.below(50) as u64)).await;
                let Ok(queue) = resource.contenders().await else {
                    continue;
                };
                let nls: Vec<_> = queue
                    .iter()
                    .filter(|c| c.granted == Some(LockMode::Nl) && c.requested == LockMode::Nl)
                    .collect();
                if nls.is_empty() {
                    continue;
                }
                let victim = nls[rng.below(nls.len())];
                del(&urls, &victim.key).await;
            }
        })
    };
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("a task hung")
            .expect("task");
    }
    chaos.await.expect("chaos");
    let v = violations.lock().unwrap().clone();
    eprintln!("grants {}", grants.load(std::sync::atomic::Ordering::Relaxed));
    assert!(v.is_empty(), "{v:#?}");
}

use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_live_contenders() {
    let server = RedisServer::start().expect("start redis");
    live(Redis::new(server.url()), vec![server.url()], 7, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_live_contenders() {
    let cluster = RedisCluster::start(3).expect("start a cluster");
    live(Redis::cluster(cluster.urls()), cluster.urls(), 8, 10).await;
}
