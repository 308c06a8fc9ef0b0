//! A crowd on one lock, from several processes, against a Redis server this
//! program starts itself.
//!
//! ```text
//! cargo run --release -p lockline-redis --example crowd_redis [-- --seconds 5 --processes 4 --crowd 1000 --compare 16,64]
//! ```
//!
//! The program re-runs itself as child processes (`lockline_bench::Crowd`),
//! each running its share of the contenders (each its own client and
//! session), which take and release one lock with zero hold time. Measured
//! once every contender has queued: grants/s, wakeups per release (the
//! clients' `stats()`), and handoff latency (a grant's time minus the
//! previous holder's release start, from the grants of every process sorted
//! by fencing token). Each `--compare` count runs in one process and in
//! `--processes`, to show whether the one-process design of `bench_redis`
//! distorts; then `--crowd` contenders run in `--processes`, against the
//! largest `--compare` count.

use lockline::Client;
use lockline_bench::{run_plan, usage_exit, BoxResult, CrowdArgs, CrowdChild};
use lockline_redis::Redis;
use lockline_testkit::RedisServer;

fn main() -> BoxResult<()> {
    if let Some(child) = CrowdChild::from_env()? {
        let url = child.args.first().ok_or("crowd child: no Redis URL")?.clone();
        return child.contend(|| Client::new(Redis::new(url.clone())));
    }
    let (args, _) =
        CrowdArgs::from_env(&[], 0.0).unwrap_or_else(|message| usage_exit(&message, "crowd_redis", CrowdArgs::USAGE));
    let server = RedisServer::start()?;
    println!(
        "Redis crowd benchmark: redis-server on 127.0.0.1:{} (no persistence), {} s per measurement, \
         each contender its own client and session",
        server.port(),
        args.seconds
    );
    run_plan(&args, &[server.url()])?;
    Ok(())
}
