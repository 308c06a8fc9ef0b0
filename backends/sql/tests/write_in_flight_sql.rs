//! A fenced write whose connection breaks before its answer: the writes may
//! or may not have been applied, so the caller must be told `Unavailable`
//! (as `write_if_held` documents), never a loss that says nothing was
//! written.
//!
//! The holder's connections run through a proxy that lets the write reach
//! the server and throws its answer away; once the write has landed, the
//! proxy cuts every connection. The client then knows nothing of the
//! outcome, and the test knows the write landed.

use std::time::Duration;

use lockline::conformance::{bounded, until};
use lockline::{Client, Error, SessionOptions, Write};
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;

#[macro_use]
mod support;

use support::db::Db;

// PostgreSQL only: there the fenced write is one statement, sent whole, so
// it lands with its answer thrown away. On MariaDB it is several statements
// of one transaction, each waiting for the answer to the one before; the
// answer the test drops stops it before it lands. The code that decides the
// answer is shared by both engines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_answer_is_cut_off_is_reported_as_unknown() {
    the_write_is_reported_as_unknown(Db::postgres()).await;
}

async fn the_write_is_reported_as_unknown(db: Db) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let options = SessionOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_request_timeout(Duration::from_secs(8));
    let client = Client::new(Sql::new(db.url_via(&proxy.address())));
    let session = client.session_with(options).await.expect("session");
    let guard = session.mutex("inflight").expect("mutex").lock().await.expect("lock");
    // Once first, so that the statement is prepared: the second goes out
    // whole without waiting for an answer.
    guard
        .write_if_held([Write::put("inflight-state", "first")])
        .await
        .expect("the first write");
    proxy.set_responses_dropped(true);
    let write = guard.write_if_held([Write::put("inflight-state", "second")]);
    let cut = async {
        // The server's own table is the only sign that the write landed.
        until("the write lands on the server", || {
            db.count(&format!(
                "SELECT count(*) FROM lockline_data WHERE value = {}",
                second(&db)
            )) > 0
        })
        .await;
        proxy.block();
    };
    let (written, ()) = bounded("the write's answer", async { tokio::join!(write, cut) }).await;
    assert!(
        matches!(written, Err(Error::Unavailable { .. })),
        "a write whose answer was cut off must say it may have been applied, said {written:?}"
    );
    // What the test knows and the client did not: the write landed.
    let reader = Client::new(Sql::new(db.url())).session().await.expect("session");
    assert_eq!(
        reader.read("inflight-state").await.expect("read").as_deref(),
        Some(&b"second"[..])
    );
}

/// The value `second` as a PostgreSQL literal.
fn second(_db: &Db) -> &'static str {
    "'\\x7365636f6e64'::bytea"
}
