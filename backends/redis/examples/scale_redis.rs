//! Scale of one session holding many locks, and of many sessions in one
//! process (issue 12, modes b and c), against a `redis-server` this program
//! starts itself.
//!
//! ```text
//! cargo run --release -p lockline-redis --example scale_redis [-- --locks 100000 --sessions 1000 --in-flight 64 --ttl 10 --ttls 2]
//! ```
//!
//! **Many locks on one session** (`--locks N`, default 100,000; 0 skips it):
//! one session acquires N mutexes `scale/0 .. scale/N-1`, `--in-flight`
//! (default 64) acquires at once, spread over 64 tasks that each take the
//! next number until none is left. Printed: the time and rate; the client's
//! resident memory (`VmRSS`) and live heap (a counting global allocator)
//! per held lock, measured just before the first acquire and just after the
//! last. Both include everything the program keeps per lock: the guard and
//! its slot in the `Vec` of guards, the core's per-hold state (its monitor
//! task, its loss channel, the same-session queue), and the backend's
//! per-entry tracking; the mutex handles are dropped once locked. They also
//! include allocator growth that is not per lock (the heap kept by glibc's
//! arenas and the tasks' buffers). Then the server's view: session keys,
//! client connections (`CLIENT LIST`), pub/sub channels; whether every lock
//! is still held after two keepalive intervals, and how long
//! `session.close()` takes (it deletes every entry).
//!
//! **Many sessions** (`--sessions M`, default 1,000; 0 skips it): one client
//! opens M sessions, each holding one lock, through a byte-counting proxy.
//! After one keepalive interval to settle, the server's
//! `total_commands_processed` and the bytes each way are counted over
//! `--ttls` TTLs and printed per session per TTL, with the commands behind
//! them (`INFO commandstats`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use lockline::{Client, MutexGuard, Session, SessionOptions};
use lockline_redis::Redis;
use lockline_testkit::scale::{CountingAlloc, CountingProxy, ScaleArgs};
use lockline_testkit::{rss_kib, RedisServer};

#[global_allocator]
static HEAP: CountingAlloc = CountingAlloc::new();

type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[tokio::main]
async fn main() -> BoxResult<()> {
    let args = ScaleArgs::from_env()?;
    let server = RedisServer::start()?;
    if args.locks > 0 {
        many_locks(&server, &args).await?;
    }
    if args.sessions > 0 {
        many_sessions(&server, &args).await?;
    }
    Ok(())
}

/// Takes `count` locks named `{prefix}{i}` with `in_flight` tasks, each taking
/// the next number until none is left; the guards in number order.
async fn acquire_all(session: &Session, prefix: &str, count: usize, in_flight: usize) -> BoxResult<Vec<MutexGuard>> {
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

/// Lines of `CLIENT LIST` other than the `redis-cli` asking.
fn connections(server: &RedisServer) -> BoxResult<Vec<String>> {
    Ok(server
        .cli(&["CLIENT", "LIST"])?
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .map(str::to_owned)
        .collect())
}

fn count_keys(server: &RedisServer, pattern: &str) -> BoxResult<usize> {
    Ok(server.cli(&["--scan", "--pattern", pattern])?.lines().count())
}

/// One `INFO` field.
fn info(server: &RedisServer, section: &str, field: &str) -> BoxResult<u64> {
    let text = server.cli(&["INFO", section])?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
        .ok_or_else(|| format!("no {field} in INFO {section}").into())
}

/// Calls per command from `INFO commandstats`.
fn command_calls(server: &RedisServer) -> BoxResult<Vec<(String, u64)>> {
    Ok(server
        .cli(&["INFO", "commandstats"])?
        .lines()
        .filter_map(|l| {
            let (name, stats) = l.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
            Some((name.to_owned(), calls))
        })
        .collect())
}

async fn many_locks(server: &RedisServer, args: &ScaleArgs) -> BoxResult<()> {
    let locks = args.locks;
    let options = SessionOptions::new().with_ttl(args.ttl);
    let client = Client::new(Redis::new(server.url()));
    let session = client.session_with(options.clone()).await?;
    println!(
        "== {locks} locks on one session (TTL {:?}, {} acquires in flight) ==",
        args.ttl, args.in_flight
    );
    let (rss_before, heap_before, blocks_before) = (rss_kib(), HEAP.live_bytes(), HEAP.live_blocks());
    let sizes_before = HEAP.live_blocks_by_size();
    let started = Instant::now();
    let guards = acquire_all(&session, "scale/", locks, args.in_flight).await?;
    let took = started.elapsed();
    let (rss_after, heap_after, blocks_after) = (rss_kib(), HEAP.live_bytes(), HEAP.live_blocks());
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
        HEAP.growth_by_size(&sizes_before, locks, 0.05).join(", ")
    );
    println!(
        "  (a guard is {} bytes in the Vec of guards)",
        std::mem::size_of::<MutexGuard>()
    );
    println!(
        "server: {} session key(s), {} client connection(s), {} pub/sub channel(s) subscribed",
        count_keys(server, "lockline:session:*")?,
        connections(server)?.len(),
        server
            .cli(&["PUBSUB", "CHANNELS"])?
            .lines()
            .filter(|l| !l.is_empty())
            .count(),
    );
    // Two renewals, looked at halfway to the third (not during one).
    let waited = options.keepalive_interval() * 5 / 2;
    tokio::time::sleep(waited).await;
    let held = guards.iter().filter(|g| g.is_held()).count();
    println!(
        "after two keepalive intervals ({waited:.1?}): {held} of {locks} still held; client RSS {} KiB, live heap {:.0} bytes per held lock",
        rss_kib(),
        per(HEAP.live_bytes().saturating_sub(heap_before) as f64, locks),
    );
    let started = Instant::now();
    let closed = session.close().await;
    println!(
        "session.close() {} in {:.2?}; keys left on the server: {} ({} of them the locks' fencing counters NAME:seq)",
        closed.map_or_else(|e| format!("FAILED ({e})"), |()| "done".to_owned()),
        started.elapsed(),
        server.cli(&["DBSIZE"])?.trim(),
        count_keys(server, "*:seq")?,
    );
    drop(guards);
    Ok(())
}

async fn many_sessions(server: &RedisServer, args: &ScaleArgs) -> BoxResult<()> {
    let count = args.sessions;
    let options = SessionOptions::new().with_ttl(args.ttl);
    let proxy = CountingProxy::start(&format!("127.0.0.1:{}", server.port()))?;
    let client = Client::new(Redis::new(format!("redis://{}", proxy.address())));
    println!(
        "== {count} sessions, one lock each (TTL {:?}, keepalive every {:?}) ==",
        args.ttl,
        options.keepalive_interval()
    );
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.in_flight.min(count) {
        let (client, options, next) = (client.clone(), options.clone(), Arc::clone(&next));
        workers.spawn(async move {
            let mut held = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<_, lockline::Error>(held);
                }
                let session = client.session_with(options.clone()).await?;
                let guard = session.mutex(&format!("sessions/{i}"))?.lock().await?;
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
    println!(
        "server: {} session keys, {} client connections",
        count_keys(server, "lockline:session:*")?,
        connections(server)?.len()
    );
    let commands_before = info(server, "stats", "total_commands_processed")?;
    let calls_before = command_calls(server)?;
    let (up_before, down_before) = (proxy.bytes_to_server(), proxy.bytes_to_client());
    let window = args.ttl * args.ttls;
    tokio::time::sleep(window).await;
    let (up, down) = (
        proxy.bytes_to_server() - up_before,
        proxy.bytes_to_client() - down_before,
    );
    let calls_after = command_calls(server)?;
    // The two INFO commandstats and the INFO stats asking are no keepalive.
    let commands = info(server, "stats", "total_commands_processed")? - commands_before - 3;
    let ttls = window.as_secs_f64() / args.ttl.as_secs_f64();
    let per_session_ttl = |n: u64| n as f64 / count as f64 / ttls;
    println!(
        "keepalive per session per TTL (counted over {window:?}): server counted {:.2} commands (those its scripts run included); client sent {:.0} bytes, received {:.0} bytes",
        per_session_ttl(commands),
        per_session_ttl(up),
        per_session_ttl(down),
    );
    let mut by_command: Vec<(String, u64)> = calls_after
        .iter()
        .filter(|(name, _)| !name.starts_with("info"))
        .map(|(name, after)| {
            let before = calls_before.iter().find(|(n, _)| n == name).map_or(0, |(_, b)| *b);
            (name.clone(), after - before)
        })
        .filter(|(_, delta)| *delta > 0)
        .collect();
    by_command.sort_by_key(|(_, delta)| std::cmp::Reverse(*delta));
    let breakdown: Vec<String> = by_command
        .iter()
        .map(|(name, delta)| format!("{name} {:.2}", per_session_ttl(*delta)))
        .collect();
    println!("  by command: {}", breakdown.join(", "));
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
