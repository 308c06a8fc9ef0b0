//! The two scale modes, run the same way on every backend; a backend
//! brings its client and its server's view ([`ScaleServer`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockline::{Client, MutexGuard, Session, SessionOptions};

use super::{CountingAlloc, CountingProxy, ScaleArgs};
use crate::latency::rss_kib;
use crate::BoxResult;

/// What a backend brings to the scale modes: its clients, and what its
/// server says at each step (each as the line, or the part of a line, the
/// program prints).
///
/// Every method is called from the program's main task, one at a time.
#[allow(async_fn_in_trait)] // Used by the examples' main tasks only, never spawned.
pub trait ScaleServer {
    /// A client connected straight to the server.
    fn client(&self) -> Client;

    /// The prefix of the many-locks mode's lock names (`scale/`).
    fn locks_prefix(&self) -> &str {
        "scale/"
    }

    /// The prefix of the many-sessions mode's lock names (`sessions/`).
    fn sessions_prefix(&self) -> &str {
        "sessions/"
    }

    /// The server's view once every lock is held: the whole line
    /// (`server: ...`).
    async fn locks_view(&mut self) -> BoxResult<String>;

    /// The line after the session holding every lock closed: `outcome` is
    /// `done` or `FAILED (why)`, `took` the close's time.
    async fn closed_line(&mut self, outcome: &str, took: Duration) -> BoxResult<String>;

    /// The server's `127.0.0.1:PORT`, for the byte-counting proxy.
    fn proxy_target(&self) -> String;

    /// A client connected through the proxy at `proxy` (`127.0.0.1:PORT`).
    fn proxied_client(&self, proxy: &str) -> Client;

    /// Called before the many sessions open (to count the server's state
    /// before them).
    async fn before_sessions(&mut self) -> BoxResult<()> {
        Ok(())
    }

    /// The server's view once every session holds its lock: the whole line.
    async fn sessions_view(&mut self, proxy: &CountingProxy) -> BoxResult<String>;

    /// Takes the server's keepalive counters at the window's start.
    async fn keepalive_start(&mut self) -> BoxResult<()>;

    /// The server's keepalive counters since [`keepalive_start`](Self::keepalive_start):
    /// the server's part of the keepalive line (`per_session_ttl` turns a
    /// count into a count per session per TTL), and more lines under it.
    async fn keepalive_end(&mut self, per_session_ttl: &dyn Fn(f64) -> f64) -> BoxResult<(String, Vec<String>)>;
}

/// Runs the modes `args` asks for: many locks on one session, then many
/// sessions.
///
/// # Errors
///
/// When the server or a session fails.
pub async fn run(server: &mut impl ScaleServer, args: &ScaleArgs, heap: &CountingAlloc) -> BoxResult<()> {
    if args.locks > 0 {
        many_locks(server, args, heap).await?;
    }
    if args.sessions > 0 {
        many_sessions(server, args).await?;
    }
    Ok(())
}

/// Takes `count` locks named `{prefix}{i}` with `in_flight` tasks, each taking
/// the next number until none is left; the guards in number order.
///
/// # Errors
///
/// The first acquire that fails.
pub async fn acquire_all(
    session: &Session,
    prefix: &str,
    count: usize,
    in_flight: usize,
) -> BoxResult<Vec<MutexGuard>> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..in_flight.min(count) {
        let (session, next, prefix) = (session.clone(), Arc::clone(&next), prefix.to_owned());
        workers.spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, lockline::Error>(held);
                }
                held.push((i, session.mutex(&format!("{prefix}{i}"))?.lock().await?));
            }
        });
    }
    let mut guards: Vec<Option<MutexGuard>> = Vec::with_capacity(count);
    guards.resize_with(count, || None);
    while let Some(done) = workers.join_next().await {
        for (i, guard) in done?? {
            guards[i] = Some(guard);
        }
    }
    Ok(guards.into_iter().flatten().collect())
}

fn per(total: f64, count: usize) -> f64 {
    total / count.max(1) as f64
}

/// Mode b: `--locks` locks held on one session; the time and rate, the
/// client's memory per held lock, the server's view, whether all are still
/// held after two keepalive intervals, and the close.
///
/// # Errors
///
/// When the session cannot be opened or an acquire fails.
pub async fn many_locks(server: &mut impl ScaleServer, args: &ScaleArgs, heap: &CountingAlloc) -> BoxResult<()> {
    let locks = args.locks;
    let options = SessionOptions::new().with_ttl(args.ttl);
    let client = server.client();
    let session = client.session_with(options.clone()).await?;
    println!(
        "== {locks} locks on one session (TTL {:?}, {} acquires in flight) ==",
        args.ttl, args.in_flight
    );
    let (rss_before, heap_before, blocks_before) = (rss_kib(), heap.live_bytes(), heap.live_blocks());
    let sizes_before = heap.live_blocks_by_size();
    let started = Instant::now();
    let prefix = server.locks_prefix().to_owned();
    let guards = acquire_all(&session, &prefix, locks, args.in_flight).await?;
    let took = started.elapsed();
    let (rss_after, heap_after, blocks_after) = (rss_kib(), heap.live_bytes(), heap.live_blocks());
    println!(
        "acquired {} locks in {took:.2?} ({:.0}/s)",
        guards.len(),
        guards.len() as f64 / took.as_secs_f64()
    );
    println!(
        "client RSS {rss_before} -> {rss_after} KiB: {:.2} KiB per held lock; live heap {:.0} bytes in {:.1} blocks per held lock",
        per(rss_after.saturating_sub(rss_before) as f64, locks),
        per(heap_after.saturating_sub(heap_before) as f64, locks),
        per(blocks_after.saturating_sub(blocks_before) as f64, locks),
    );
    println!(
        "  live heap blocks per held lock by size: {}",
        heap.growth_by_size(&sizes_before, locks, 0.05).join(", ")
    );
    println!(
        "  (a guard is {} bytes in the Vec of guards)",
        std::mem::size_of::<MutexGuard>()
    );
    println!("{}", server.locks_view().await?);
    // Two renewals, looked at halfway to the third (not during one).
    let waited = options.keepalive_interval() * 5 / 2;
    tokio::time::sleep(waited).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    println!(
        "after two keepalive intervals ({waited:.1?}): {held} of {locks} still held; client RSS {} KiB, live heap {:.0} bytes per held lock",
        rss_kib(),
        per(heap.live_bytes().saturating_sub(heap_before) as f64, locks),
    );
    let started = Instant::now();
    let closed = session.close().await;
    let took = started.elapsed();
    let outcome = closed.map_or_else(|e| format!("FAILED ({e})"), |()| "done".to_owned());
    println!("{}", server.closed_line(&outcome, took).await?);
    drop(guards);
    Ok(())
}

/// Mode c: `--sessions` sessions in one process, each holding one lock,
/// through a byte-counting proxy; the keepalive traffic per session per TTL.
///
/// # Errors
///
/// When a session cannot be opened or an acquire fails.
pub async fn many_sessions(server: &mut impl ScaleServer, args: &ScaleArgs) -> BoxResult<()> {
    let count = args.sessions;
    let options = SessionOptions::new().with_ttl(args.ttl);
    let proxy = CountingProxy::start(&server.proxy_target())?;
    let client = server.proxied_client(proxy.address());
    println!(
        "== {count} sessions, one lock each (TTL {:?}, keepalive every {:?}) ==",
        args.ttl,
        options.keepalive_interval()
    );
    server.before_sessions().await?;
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let prefix = server.sessions_prefix().to_owned();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.in_flight.min(count) {
        let (client, options, next, prefix) = (client.clone(), options.clone(), Arc::clone(&next), prefix.clone());
        workers.spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, lockline::Error>(held);
                }
                let session = client.session_with(options.clone()).await?;
                let guard = session.mutex(&format!("{prefix}{i}"))?.lock().await?;
                held.push((session, guard));
            }
        });
    }
    let mut held = Vec::with_capacity(count);
    while let Some(done) = workers.join_next().await {
        held.extend(done??);
    }
    println!(
        "opened {count} sessions and took a lock on each in {:.2?}",
        started.elapsed()
    );
    tokio::time::sleep(options.keepalive_interval()).await;
    println!("{}", server.sessions_view(&proxy).await?);
    server.keepalive_start().await?;
    let (up_before, down_before) = (proxy.bytes_to_server(), proxy.bytes_to_client());
    let window = args.ttl * args.ttls;
    tokio::time::sleep(window).await;
    let (up, down) = (
        proxy.bytes_to_server() - up_before,
        proxy.bytes_to_client() - down_before,
    );
    let ttls = window.as_secs_f64() / args.ttl.as_secs_f64();
    let per_session_ttl = |n: f64| n / count as f64 / ttls;
    let (server_part, more) = server.keepalive_end(&per_session_ttl).await?;
    println!(
        "keepalive per session per TTL (counted over {window:?}): {server_part}; client sent {:.0} bytes, received {:.0} bytes",
        per_session_ttl(up as f64),
        per_session_ttl(down as f64),
    );
    for line in more {
        println!("{line}");
    }
    let still = held.iter().filter(|(_, guard)| guard.is_held()).count();
    println!("{still} of {count} locks still held");
    let started = Instant::now();
    let closes = held.iter().map(|(session, _)| session.close());
    let failed: Vec<lockline::Error> = futures::future::join_all(closes)
        .await
        .into_iter()
        .filter_map(Result::err)
        .collect();
    println!(
        "closed {count} sessions (all at once) in {:.2?}; {} failed{}",
        started.elapsed(),
        failed.len(),
        failed.first().map(|e| format!(", the first: {e}")).unwrap_or_default()
    );
    Ok(())
}
