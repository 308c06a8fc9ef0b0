//! A fenced transaction held open by a holder: a paused one cannot commit
//! after the next grant, a healthy one commits.

use super::*;

on_both!(
    a_paused_holder_cannot_commit_after_the_next_grant,
    a_healthy_holder_commits_its_fenced_transaction,
);

fn create_probe_table(db: &Db) {
    db.sql("CREATE TABLE probe_writes (token bigint NOT NULL)");
}

/// A holder paused (SIGSTOP) past its TTL with a fenced transaction open:
/// the next holder is granted meanwhile, and when the paused holder wakes
/// and commits, its commit is refused and nothing it wrote lands.
async fn a_paused_holder_cannot_commit_after_the_next_grant(db: Db) {
    create_probe_table(&db);
    let url = db.url();
    let (mut probe, first) = spawn_probe(&url, "fenced", "fenced", 2000);
    let stale: i64 = first
        .strip_prefix("ready ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    probe.signal(libc::SIGSTOP).expect("pause the holder");
    let client = Client::new(Sql::new(url));
    let session = client.session_with(options(2000)).await.expect("session");
    let next = bounded(
        "the next holder is granted",
        session.mutex("fenced").expect("mutex").lock(),
    )
    .await
    .expect("lock");
    assert!(next.token().get() > u64::try_from(stale).expect("token"));
    probe.signal(libc::SIGCONT).expect("resume the holder");
    probe.send_line("commit").expect("tell it to commit");
    let said = probe.line(Duration::from_secs(20)).expect("the probe's answer");
    let said = if said == "lost" {
        probe.line(Duration::from_secs(20)).expect("the probe's answer")
    } else {
        said
    };
    assert!(
        said.starts_with("refused: LockLost") || said.starts_with("refused: SessionLost"),
        "a paused holder's fenced commit must be refused, it said {said:?}"
    );
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM probe_writes WHERE token = {stale}")),
        0,
        "the stale holder's write landed"
    );
    next.release().await.expect("release");
}

/// A holder that keeps its lock commits its fenced transaction.
async fn a_healthy_holder_commits_its_fenced_transaction(db: Db) {
    create_probe_table(&db);
    let (mut probe, first) = spawn_probe(&db.url(), "healthy", "fenced", 10_000);
    let token: i64 = first
        .strip_prefix("ready ")
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("the probe said {first:?}"));
    probe.send_line("commit").expect("tell it to commit");
    assert_eq!(probe.line(Duration::from_secs(20)).as_deref(), Some("committed"));
    assert_eq!(
        db.count(&format!("SELECT count(*) FROM probe_writes WHERE token = {token}")),
        1
    );
}
