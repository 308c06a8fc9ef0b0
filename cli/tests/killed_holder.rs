//! A `lockline` holder killed with SIGKILL is replaced within the session's
//! TTL + 1 s, with one wakeup, on etcd, ZooKeeper, Redis, PostgreSQL and
//! MariaDB.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockline::conformance::{bounded, spawn_queued};
use lockline::{Client, SessionOptions};
use lockline_etcd::Etcd;
use lockline_redis::Redis;
use lockline_sql::Sql;
use lockline_testkit::{EtcdCluster, MariaDbServer, PgOptions, PgServer, RedisServer, ZkEnsemble};
use lockline_zookeeper::ZooKeeper;

/// Starts `lockline lock <server...> --ttl 2 killed/lock`, queues a waiter on
/// `client`, kills the holder, and checks how soon the waiter holds.
async fn killed_holder_is_replaced(server: &[&str], client: Client, key_prefix: &str) {
    let ttl = Duration::from_secs(2);
    let mut holder = Command::new(env!("CARGO_BIN_EXE_lockline"))
        .arg("lock")
        .args(server)
        .args(["--ttl", "2", "killed/lock"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the holder");
    let mut first = String::new();
    BufReader::new(holder.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("the holder prints its key");
    assert!(first.starts_with(key_prefix), "{first:?}");

    let session = client
        .session_with(SessionOptions::new().with_ttl(Duration::from_secs(5)))
        .await
        .expect("session");
    let mutex = session.mutex("killed/lock").expect("mutex");
    let waiter = spawn_queued(&client, async move { mutex.lock().await }).await;

    let woken = client.stats().wakeups;
    holder.kill().expect("SIGKILL the holder");
    let killed_at = Instant::now();
    holder.wait().expect("reap");
    let guard = bounded("the waiter takes over", waiter)
        .await
        .expect("task")
        .expect("lock");
    let took = killed_at.elapsed();
    assert!(took <= ttl + Duration::from_secs(1), "took {took:?} after the kill");
    assert_eq!(client.stats().wakeups - woken, 1, "one wakeup for the one departure");
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd() {
    let cluster = EtcdCluster::start().expect("start etcd");
    let endpoints = cluster.endpoints().join(",");
    let client = Client::new(Etcd::new(cluster.endpoints()));
    killed_holder_is_replaced(&["--etcd", &endpoints], client, "killed/lock/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_zookeeper() {
    let ensemble = ZkEnsemble::start().expect("start ZooKeeper");
    let client = Client::new(ZooKeeper::new(ensemble.connect_string()));
    killed_holder_is_replaced(&["--zookeeper", &ensemble.connect_string()], client, "/killed/lock/_c_").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis() {
    let server = RedisServer::start().expect("start redis");
    let client = Client::new(Redis::new(server.url()));
    killed_holder_is_replaced(&["--redis", &server.url()], client, "{killed/lock}:e:").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres() {
    let options = PgOptions {
        durable: false,
        ..Default::default()
    };
    let server = PgServer::start_with(&options).expect("start PostgreSQL");
    let client = Client::new(Sql::new(server.url()));
    killed_holder_is_replaced(&["--postgres", &server.url()], client, "killed/lock/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_mariadb() {
    let server = MariaDbServer::start().expect("start MariaDB");
    server.create_database("cli").expect("create database");
    let url = format!("{}/cli", server.url());
    let client = Client::new(Sql::new(url.clone()));
    killed_holder_is_replaced(&["--mysql", &url], client, "killed/lock/").await;
}
