//! Attacks on sequencers, lock-delay and multi-locks against a real etcd:
//! sequencers (their text form and `check`), lock-delay at each step of a
//! handoff, and multi-locks cancelled at random points.

use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, Error, FencingToken, Mode, MutexGuard, Sequencer, Session, SessionOptions};
use lockline_etcd::Etcd;
use lockline_testkit::{EtcdCluster, TcpProxy};

mod support;

use support::{lock, new_client, queue, queue_timed, revoke_from, session};

fn options() -> SessionOptions {
    SessionOptions::new().with_ttl(Duration::from_secs(6))
}

fn delayed(delay: Duration) -> SessionOptions {
    options().with_lock_delay(delay)
}

fn unique(name: &str) -> String {
    format!("attacks/{name}-{}", uuid_like())
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A small deterministic generator (xorshift), so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A session of `client` holding a fresh lock named after `label`, and a
/// session of `waiting_client` with a lock-delay of `delay`.
async fn held_with_delayed_session(
    client: &Client,
    waiting_client: &Client,
    delay: Duration,
    label: &str,
) -> (Session, Session, String, MutexGuard) {
    let holder_session = session(client, options()).await;
    let waiting = session(waiting_client, delayed(delay)).await;
    let name = unique(label);
    let held = lock(&holder_session, &name).await;
    (holder_session, waiting, name, held)
}

/// Revokes `holder`'s lease and waits until the clients of `waiting` have
/// begun `delays` lock-delays in all.
async fn lose_into_delay(cluster: &EtcdCluster, holder: &Session, waiting: &Client, delays: u64) {
    revoke_from(cluster, holder).await;
    bounded(
        "the lock-delay begins",
        waiting.wait_for_stats(|s| s.lock_delays >= delays),
    )
    .await;
}

/// The text form never panics on arbitrary input, refuses what is not a
/// sequencer with `InvalidOptions`, and round-trips any name (unicode,
/// `%`, `:`, huge tokens) as visible ASCII.
#[test]
fn sequencer_text_survives_fuzzing() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let alphabet: Vec<char> = "lockline1:mutexreadwritepermit-leader%0123456789aAfFgG/ _.~+-üé😀\u{0}\n\t"
        .chars()
        .collect();
    for _ in 0..20_000 {
        let len = rng.below(40) as usize;
        let text: String = (0..len)
            .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
            .collect();
        for candidate in [
            text.clone(),
            format!("lockline1:mutex:1:{text}"),
            format!("lockline1:{text}"),
        ] {
            match candidate.parse::<Sequencer>() {
                Ok(parsed) => {
                    // Whatever parses prints back as visible ASCII and parses
                    // to the same sequencer.
                    let again = parsed.to_string();
                    assert!(again.bytes().all(|b| b.is_ascii_graphic()), "{again:?}");
                    assert_eq!(again.parse::<Sequencer>().expect("reparse"), parsed, "{candidate:?}");
                    assert!(!parsed.name().is_empty());
                }
                Err(Error::InvalidOptions { .. }) => {}
                Err(other) => panic!("{candidate:?}: refused with {other:?}, not InvalidOptions"),
            }
        }
    }
    // Huge inputs: a name of a megabyte, a token past u64, a permit count
    // past usize.
    let long = "ü".repeat(500_000);
    let sequencer = Sequencer::new(long.clone(), Mode::Mutex, FencingToken::new(u64::MAX));
    let text = sequencer.to_string();
    assert_eq!(text.parse::<Sequencer>().expect("parse a huge one"), sequencer);
    for bad in [
        format!("lockline1:mutex:{}0:a", u64::MAX),
        format!("lockline1:permit-{}0:1:a", usize::MAX),
        "lockline1:mutex:-1:a".to_owned(),
        "lockline1:mutex::a".to_owned(),
        "lockline1:Mutex:1:a".to_owned(),
        "lockline1:permit-:1:a".to_owned(),
        "lockline1:permit--1:1:a".to_owned(),
        "lockline1:mutex:1:%".to_owned(),
        "lockline1:mutex:1:%ü".to_owned(),
        "lockline1:mutex:1:%%41".to_owned(),
        "lockline1:mutex:1:a:b".to_owned(),
        "LOCKLINE1:mutex:1:a".to_owned(),
        " lockline1:mutex:1:a".to_owned(),
        "lockline1:mutex:1:a\n".to_owned(),
        "lockline1:mutex:1:%C3".to_owned(),
        "lockline1:mutex:1:%ED%A0%80".to_owned(),
    ] {
        assert!(
            matches!(bad.parse::<Sequencer>(), Err(Error::InvalidOptions { .. })),
            "{bad:?} must be refused: {:?}",
            bad.parse::<Sequencer>()
        );
    }
    // Random unicode names round-trip.
    for _ in 0..2_000 {
        let len = 1 + rng.below(12) as usize;
        let name: String = (0..len)
            .filter_map(|_| char::from_u32(rng.below(0x11_0000) as u32))
            .collect();
        if name.is_empty() {
            continue;
        }
        let permits = 1 + rng.below(5) as usize;
        for mode in [
            Mode::Mutex,
            Mode::Read,
            Mode::Write,
            Mode::Permit { permits },
            Mode::Leadership,
        ] {
            let sequencer = Sequencer::new(name.clone(), mode, FencingToken::new(rng.next()));
            let text = sequencer.to_string();
            assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text:?}");
            assert_eq!(text.parse::<Sequencer>().expect("parse"), sequencer, "{text}");
        }
    }
}

/// "a % not followed by two hex digits" is refused: `%+1` is not two hex
/// digits.
#[test]
fn a_percent_needs_two_hex_digits() {
    for bad in ["lockline1:mutex:1:%+1", "lockline1:mutex:1:a%+A"] {
        assert!(
            matches!(bad.parse::<Sequencer>(), Err(Error::InvalidOptions { .. })),
            "{bad:?} must be refused, got {:?}",
            bad.parse::<Sequencer>()
        );
    }
}

/// A sequencer of a unicode name, with `%` and `:` in it, is current while
/// held and not after, through its text form; and a forged sequencer (the
/// holder's token in another name, a token nobody has, another mode) is
/// never current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_refuse_forged_and_stale_sequencers() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let checker = new_client(&cluster);
    let s = session(&client, options()).await;
    let name = format!("attacks/ünï:cøde%20/{}", uuid_like());
    let guard = lock(&s, &name).await;
    let text = guard.sequencer().to_string();
    let parsed: Sequencer = text.parse().expect("parse");
    assert!(checker.check(&parsed).await.expect("check"));
    let token = guard.token().get();
    for forged in [
        Sequencer::new(format!("{name}x"), Mode::Mutex, guard.token()),
        Sequencer::new(&name, Mode::Mutex, FencingToken::new(token + 1)),
        Sequencer::new(&name, Mode::Mutex, FencingToken::new(token.saturating_sub(1))),
        Sequencer::new(&name, Mode::Write, guard.token()),
        Sequencer::new(&name, Mode::Read, guard.token()),
        Sequencer::new(&name, Mode::Permit { permits: 1 }, guard.token()),
    ] {
        assert!(
            !checker.check(&forged).await.expect("check"),
            "{forged} is not the holder's"
        );
    }
    guard.release().await.expect("release");
    assert!(!checker.check(&parsed).await.expect("check"), "released: stale");
    let again = lock(&s, &name).await;
    assert!(!checker.check(&parsed).await.expect("check"), "a later holder: stale");
    assert!(checker.check(&again.sequencer()).await.expect("check"));
    again.release().await.expect("release");
}

/// A waiter's permit sequencer is not current. The number of permits is
/// not stored on the server (every contender applies its own), so `check`
/// applies the count the sequencer names: a resource compares that count
/// with the semaphore's size it knows (documented with `Sequencer` and in
/// docs/sequencers.md); here the count is the semaphore's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiters_permit_sequencer_is_not_current() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let checker = new_client(&cluster);
    let (a, b) = (session(&client, options()).await, session(&client, options()).await);
    let name = unique("permits");
    let held = bounded("acquire", a.semaphore(&name, 1).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let waiter = {
        let semaphore = b.semaphore(&name, 1).expect("semaphore");
        spawn_queued(&client, async move { semaphore.acquire().await }).await
    };
    let queue = a.queue(&name).await.expect("queue");
    assert_eq!(queue.len(), 2, "{queue:?}");
    let waiting = queue[1].token;
    assert!(!waiter.is_finished());
    // The waiter holds nothing.
    let waiting = Sequencer::new(&name, Mode::Permit { permits: 1 }, waiting);
    assert!(
        !checker.check(&waiting).await.expect("check"),
        "{waiting}: a waiter of a semaphore of 1 was called current"
    );
    assert!(checker.check(&held.sequencer()).await.expect("check"));
    held.release().await.expect("release");
    let permit = bounded("the waiter", waiter).await.expect("task").expect("acquire");
    permit.release().await.expect("release");
}

/// While a contender is in lock-delay nobody holds the lock: `check` must
/// not call its token current.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_in_lock_delay_is_not_current() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let waiting_client = new_client(&cluster);
    let checker = new_client(&cluster);
    let delay = Duration::from_secs(3);
    let (holder_session, waiting, name, _held) =
        held_with_delayed_session(&client, &waiting_client, delay, "delay-check").await;
    let waiter = queue(&waiting_client, &waiting, &name).await;
    lose_into_delay(&cluster, &holder_session, &waiting_client, 1).await;
    let queue = waiting.queue(&name).await.expect("queue");
    assert_eq!(queue.len(), 1, "{queue:?}");
    assert!(queue[0].delayed_until.is_some() || waiter.is_finished(), "{queue:?}");
    let forged = Sequencer::new(&name, Mode::Mutex, queue[0].token);
    let current = checker.check(&forged).await.expect("check");
    let still_delayed = !waiter.is_finished();
    assert!(
        !(current && still_delayed),
        "check says {forged} is current while its contender is still in lock-delay (nobody holds)"
    );
    let _ = bounded("the waiter", waiter).await.expect("task").expect("lock");
}

/// A `lock_timeout` that runs out during the lock-delay is a `Timeout`, on
/// time, and leaves no entry (nor a mark) behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_during_the_delay_is_a_timeout_and_leaves_nothing() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let waiting_client = new_client(&cluster);
    let delay = Duration::from_secs(5);
    let (holder_session, waiting, name, _held) =
        held_with_delayed_session(&client, &waiting_client, delay, "delay-timeout").await;
    let timeout = Duration::from_millis(1500);
    let started = Instant::now();
    let waiter = {
        let mutex = waiting.mutex(&name).expect("mutex");
        spawn_queued(&waiting_client, async move { mutex.lock_timeout(timeout).await }).await
    };
    lose_into_delay(&cluster, &holder_session, &waiting_client, 1).await;
    match bounded("the waiter", waiter).await.expect("task") {
        Err(Error::Timeout { waited, .. }) => assert_eq!(waited, timeout),
        other => panic!("expected Timeout during the lock-delay, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took < timeout + Duration::from_secs(1),
        "the timeout ended {took:?} after the start"
    );
    bounded("flush", waiting.flush()).await;
    let left = waiting.queue(&name).await.expect("queue");
    assert!(left.is_empty(), "entries left behind: {left:?}");
    // And the lock is free to the next at once.
    let next = bounded("try", waiting.mutex(&name).expect("mutex").try_lock())
        .await
        .expect("try_lock");
    assert!(next.is_some(), "the lock is not free after the timed-out waiter left");
}

/// A waiter cancelled during its lock-delay hands on at once: the one behind
/// it (with a lock-delay of its own) is granted without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cancelled_during_its_delay_hands_on_at_once() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let first_client = new_client(&cluster);
    let second_client = new_client(&cluster);
    let delay = Duration::from_secs(4);
    let holder_session = session(&client, options()).await;
    let first = session(&first_client, delayed(delay)).await;
    let second = session(&second_client, delayed(delay)).await;
    let name = unique("delay-cancel");
    let _held = lock(&holder_session, &name).await;
    let first_waiter = queue(&first_client, &first, &name).await;
    let second_waiter = queue(&second_client, &second, &name).await;
    lose_into_delay(&cluster, &holder_session, &first_client, 1).await;
    // Nobody holds meanwhile: a try from a third session finds it taken.
    let third = session(&client, options()).await;
    assert!(bounded("try", third.mutex(&name).expect("mutex").try_lock())
        .await
        .expect("try_lock")
        .is_none());
    let cancelled_at = Instant::now();
    first_waiter.abort();
    assert!(first_waiter.await.is_err_and(|e| e.is_cancelled()));
    let guard = bounded("the second waiter", second_waiter)
        .await
        .expect("task")
        .expect("lock");
    assert!(
        cancelled_at.elapsed() < delay,
        "held back {:?} after a waiter gave up (a clean departure)",
        cancelled_at.elapsed()
    );
    assert_eq!(second_client.stats().lock_delays, 0, "{:?}", second_client.stats());
    guard.release().await.expect("release");
}

/// The waiter's own session lost during its lock-delay: `SessionLost`, no
/// grant, no entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiters_own_loss_during_the_delay_ends_the_wait() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let waiting_client = new_client(&cluster);
    let delay = Duration::from_secs(5);
    let (holder_session, waiting, name, _held) =
        held_with_delayed_session(&client, &waiting_client, delay, "delay-own-loss").await;
    let waiter = queue(&waiting_client, &waiting, &name).await;
    lose_into_delay(&cluster, &holder_session, &waiting_client, 1).await;
    let lost_at = Instant::now();
    revoke_from(&cluster, &waiting).await;
    match bounded("the waiter", waiter).await.expect("task") {
        Err(Error::SessionLost { .. } | Error::LockLost { .. }) => {}
        other => panic!("expected the waiter's loss, got {other:?}"),
    }
    assert!(lost_at.elapsed() < delay, "the loss was heard only after the delay");
    let observer = session(&client, options()).await;
    let left = observer.queue(&name).await.expect("queue");
    assert!(left.is_empty(), "{left:?}");
}

/// Read/write locks and semaphores with a lock-delay: the contenders next
/// after a lost writer (or permit) wait out the delay, and a semaphore's
/// bound holds meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rwlocks_and_semaphores_honour_the_delay() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let readers_client = new_client(&cluster);
    let delay = Duration::from_millis(2000);

    // A lost writer: two readers behind it both wait out the delay.
    let writer_session = session(&client, options()).await;
    let name = unique("rw-delay");
    let _w = bounded("write", writer_session.rwlock(&name).expect("rwlock").write())
        .await
        .expect("write");
    let mut readers = Vec::new();
    for _ in 0..2 {
        let reader = session(&readers_client, delayed(delay)).await;
        let lock = reader.rwlock(&name).expect("rwlock");
        readers.push(
            spawn_queued(&readers_client, async move {
                let guard = lock.read().await;
                (Instant::now(), guard)
            })
            .await,
        );
    }
    let lost_at = Instant::now();
    revoke_from(&cluster, &writer_session).await;
    for reader in readers {
        let (at, guard) = bounded("a reader", reader).await.expect("task");
        assert!(
            at - lost_at >= delay,
            "a reader was granted {:?} after the writer's loss",
            at - lost_at
        );
        guard.expect("read").release().await.expect("release");
    }

    // A semaphore of 2: one holder lost, the other keeps its permit; the
    // waiter waits out the delay, and a newcomer never makes three.
    let sem = unique("sem-delay");
    let lost = session(&client, options()).await;
    let kept = session(&client, options()).await;
    let _p1 = bounded("acquire", lost.semaphore(&sem, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let p2 = bounded("acquire", kept.semaphore(&sem, 2).expect("semaphore").acquire())
        .await
        .expect("acquire");
    let waiting = session(&readers_client, delayed(delay)).await;
    let waiter = {
        let semaphore = waiting.semaphore(&sem, 2).expect("semaphore");
        spawn_queued(&readers_client, async move {
            let permit = semaphore.acquire().await;
            (Instant::now(), permit)
        })
        .await
    };
    let lost_at = Instant::now();
    lose_into_delay(&cluster, &lost, &readers_client, 3).await;
    // A newcomer during the delay: p2 still holds and the delayed waiter is
    // ahead of it; it must not be granted.
    let newcomer = session(&client, options()).await;
    let tried = bounded("try", newcomer.semaphore(&sem, 2).expect("semaphore").try_acquire())
        .await
        .expect("try_acquire");
    assert!(tried.is_none(), "a newcomer got a third permit during the delay");
    let (at, permit) = bounded("the waiter", waiter).await.expect("task");
    assert!(at - lost_at >= delay, "granted {:?} after the loss", at - lost_at);
    permit.expect("acquire").release().await.expect("release");
    p2.release().await.expect("release");
}

/// A holder's release whose answer never comes back (the request reached
/// the server) is still a release: the waiter is not held back. And a close
/// racing the holder's own releases hands on at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cut_off_mid_request_and_a_racing_close_hand_on_at_once() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let proxy = TcpProxy::start(&cluster.endpoint(0).replace("http://", "")).expect("proxy");
    let far = Client::new(Etcd::new(vec![format!("http://{}", proxy.address())]));
    let waiting_client = new_client(&cluster);
    let delay = Duration::from_secs(4);
    let waiting = session(&waiting_client, delayed(delay)).await;

    let holder_session = session(
        &far,
        options()
            .with_ttl(Duration::from_secs(20))
            .with_request_timeout(Duration::from_secs(1)),
    )
    .await;
    let name = unique("cut-release");
    let held = lock(&holder_session, &name).await;
    let waiter = queue_timed(&waiting_client, &waiting, &name).await;
    proxy.set_responses_dropped(true);
    let released_at = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(3), held.release()).await;
    let (at, guard) = bounded("the waiter", waiter).await.expect("task");
    assert!(
        at - released_at < delay,
        "a release that reached the server was taken for a loss ({:?}; the release said {outcome:?})",
        at - released_at
    );
    assert_eq!(waiting_client.stats().lock_delays, 0);
    guard.expect("lock").release().await.expect("release");
    proxy.set_responses_dropped(false);

    // close() racing releases of the same session, several locks at once.
    let closing = session(&waiting_client, options()).await;
    let names: Vec<String> = (0..4).map(|i| unique(&format!("close-race-{i}"))).collect();
    let mut guards = Vec::new();
    for n in &names {
        guards.push(lock(&closing, n).await);
    }
    let other = new_client(&cluster);
    let mut waiters = Vec::new();
    for n in &names {
        let s = session(&other, delayed(delay)).await;
        let mutex = s.mutex(n).expect("mutex");
        waiters.push(
            spawn_queued(&other, async move {
                let guard = mutex.lock().await;
                (Instant::now(), guard, s)
            })
            .await,
        );
    }
    let let_go = Instant::now();
    let mut releases = Vec::new();
    for (i, guard) in guards.into_iter().enumerate() {
        if i % 2 == 0 {
            releases.push(tokio::spawn(async move {
                let _ = guard.release().await;
            }));
        } else {
            drop(guard);
        }
    }
    let _ = closing.close().await;
    for r in releases {
        r.await.expect("task");
    }
    for waiter in waiters {
        let (at, guard, _s) = bounded("a waiter", waiter).await.expect("task");
        assert!(
            at - let_go < delay,
            "a close racing releases was taken for a loss ({:?})",
            at - let_go
        );
        guard.expect("lock").release().await.expect("release");
    }
    assert_eq!(other.stats().lock_delays, 0, "{:?}", other.stats());
}

/// Multi-locks dropped at random points (while appending, waiting, holding
/// part) leave nothing held and no entry; two multi-locks over overlapping
/// names in opposite orders, with a third contender taking single names,
/// never deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_cancelled_at_random_points_leave_nothing() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let client = new_client(&cluster);
    let (a, b) = (session(&client, options()).await, session(&client, options()).await);
    let names: Vec<String> = (0..4).map(|i| unique(&format!("multi-{i}"))).collect();
    let mut rng = Rng(0xDEAD_BEEF_1234_5678);
    for round in 0..40 {
        // Sometimes another session holds one of the names for a while.
        let blocker = if rng.below(2) == 0 {
            let n = &names[rng.below(names.len() as u64) as usize];
            Some(lock(&b, n).await)
        } else {
            None
        };
        let mut picked: Vec<&String> = names.iter().filter(|_| rng.below(2) == 0).collect();
        if picked.is_empty() {
            picked.push(&names[0]);
        }
        if rng.below(2) == 0 {
            picked.reverse();
        }
        let multi = a.multi_lock(&picked).expect("multi_lock");
        let cut = Duration::from_micros(rng.below(40_000));
        match tokio::time::timeout(cut, multi.lock()).await {
            Ok(Ok(guard)) => {
                assert!(guard.is_held());
                if rng.below(2) == 0 {
                    guard.release().await.expect("release");
                } else {
                    drop(guard);
                }
            }
            Ok(Err(error)) => panic!("round {round}: {error:?}"),
            Err(_) => {}
        }
        bounded("flush", a.flush()).await;
        for n in &names {
            let left: Vec<_> = a
                .queue(n)
                .await
                .expect("queue")
                .into_iter()
                .filter(|c| c.owner.as_deref() == Some(a.id()))
                .collect();
            assert!(
                left.is_empty(),
                "round {round}: {n} keeps {left:?} after a cancel at {cut:?}"
            );
        }
        if let Some(blocker) = blocker {
            blocker.release().await.expect("release");
        }
    }

    // Opposite orders, overlapping names, plus single-name contention.
    let c = session(&client, options()).await;
    let run = |s: Session, names: Vec<String>| async move {
        let multi = s.multi_lock(&names).expect("multi_lock");
        for _ in 0..10 {
            let guard = multi.lock().await.expect("lock");
            guard.release().await.expect("release");
        }
    };
    let forward = tokio::spawn(run(a.clone(), names.clone()));
    let backward = tokio::spawn(run(b.clone(), names.iter().rev().cloned().collect()));
    let single = {
        let names = names.clone();
        tokio::spawn(async move {
            for i in 0..20 {
                let guard = c
                    .mutex(&names[i % names.len()])
                    .expect("mutex")
                    .lock()
                    .await
                    .expect("lock");
                guard.release().await.expect("release");
            }
        })
    };
    bounded("no deadlock", async {
        forward.await.expect("task");
        backward.await.expect("task");
        single.await.expect("task");
    })
    .await;
}
