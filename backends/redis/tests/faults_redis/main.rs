//! The Redis backend when things go wrong: a restarted server, a silent
//! partition, cancelled acquires, bad input.
//!
//! One test binary, a module per family: `restarts`, `partitions` (silent
//! ones), `appends` (cancelled and retried), `refusals` (servers that cannot
//! be used, bad input), `lock_delay`, `releases` (tried again after a
//! cut-off first try), `frozen_connections` (one of a session's two
//! connections silent alone).

use std::time::{Duration, Instant};

use lockline::conformance::bounded;
use lockline::{Client, Error, Session, SessionOptions, SessionState};
use lockline_redis::Redis;
use lockline_testkit::{free_port, RedisOptions, RedisServer, TcpProxy};
use redis::AsyncCommands;

#[path = "../support/mod.rs"]
mod support;

mod appends;
mod frozen_connections;
mod lock_delay;
mod partitions;
mod refusals;
mod releases;
mod restarts;

fn options(ttl_ms: u64) -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_millis(ttl_ms))
        .with_connect_timeout(Duration::from_secs(2))
        .with_request_timeout(Duration::from_secs(1))
}

/// A proxy in front of `server`, and a client whose every request goes
/// through it.
fn through_a_proxy(server: &RedisServer) -> (TcpProxy, Client) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", server.port())).expect("proxy");
    let client = Client::new(Redis::new(format!("redis://{}", proxy.address())));
    (proxy, client)
}

/// A server, a proxy in front of it, and a session with `options` through
/// the proxy.
async fn session_behind_a_proxy(options: SessionOptions) -> (RedisServer, TcpProxy, Session) {
    let server = RedisServer::start().expect("start redis");
    let (proxy, far) = through_a_proxy(&server);
    let session = far.session_with(options).await.expect("session");
    (server, proxy, session)
}
