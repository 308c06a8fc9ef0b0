//! Values the server cannot take are refused before they are sent: MariaDB
//! closes the connection on a statement larger than its
//! `max_allowed_packet` (which would end the session and free its locks),
//! so lockline refuses larger values with `InvalidOptions`, leaving the
//! session and its locks as they were. PostgreSQL takes them.

use lockline::conformance::{bounded, values_too_large_are_refused};
use lockline::Client;
use lockline_sql::Sql;
use lockline_testkit::{MariaDbOptions, MariaDbServer};

mod support;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_refuses_values_above_its_packet_limit() {
    let server = MariaDbServer::start_with(&MariaDbOptions {
        innodb_flush_log_at_trx_commit: 2,
        settings: vec![("max-allowed-packet".to_owned(), "1M".to_owned())],
        ..MariaDbOptions::default()
    })
    .expect("start mariadb");
    server.create_database("lockline").expect("database");
    let client = Client::new(Sql::new(format!("{}/lockline", server.url())));
    values_too_large_are_refused(&client, "large/state").await;
    let session = bounded("session", client.session()).await.expect("session");
    assert_eq!(session.state(), lockline::SessionState::Live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_takes_values_of_megabytes() {
    let server = support::postgres();
    let client = Client::new(Sql::new(server.url()));
    let session = bounded("session", client.session()).await.expect("session");
    let huge = vec![b'v'; 3 << 20];
    let election = session.election("large/election").expect("election");
    let leadership = bounded("campaign", election.campaign(&huge)).await.expect("campaign");
    let leader = bounded("leader", election.leader())
        .await
        .expect("leader")
        .expect("a leader");
    assert_eq!(leader.value(), huge.as_slice());
    let guard = session.mutex("large/m").expect("mutex").lock().await.expect("lock");
    guard
        .write_if_held([lockline::Write::put("large/state", huge.clone())])
        .await
        .expect("write");
    assert_eq!(session.read("large/state").await.expect("read"), Some(huge));
    guard.release().await.expect("release");
    leadership.resign().await.expect("resign");
}
