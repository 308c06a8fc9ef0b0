//! Attacks on the notices of lock-mode entries: a notice of another
//! session's write carries the entry's version and the value written, and
//! a watcher answers from it with no read. No watcher may answer with a
//! value that is not the entry's committed value, none may be left waiting
//! after the entry changed to a value it wants or went. (The value block
//! after a crash is attacked in `faults_sql/value_block.rs`.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockline::backend::{AppendRequest, BackendSession, Conflicts, Entry, EntryKind, Queue, QueueUpdate};
use lockline::conformance::{bounded, until};
use lockline::{Client, LockMode, ResourceGuard, Session, SessionOptions};
use lockline_sql::Sql;
use lockline_testkit::TcpProxy;
use tokio::task::JoinHandle;

#[macro_use]
mod support;

use support::db::Db;

on_both!(
    a_long_value_written_by_another_session_answers_a_watch,
    a_watch_until_hears_another_sessions_grant_of_a_waiting_request,
    waiters_of_every_mode_with_conversions_all_get_the_lock,
    waiters_behind_waiting_and_settled_requests_hear_no_other_writer,
    a_waiter_behind_a_conversion_hears_other_writers_while_it_converts,
);

/// Notices exist on PostgreSQL alone.
mod postgres_notices {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_late_notice_of_an_older_write_does_not_answer_a_later_watch() {
        super::a_late_notice_of_an_older_write_does_not_answer_a_later_watch(super::Db::postgres()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn held_notices_of_an_unwanted_then_a_wanted_write_answer_the_wanted() {
        super::held_notices_of_an_unwanted_then_a_wanted_write_answer_the_wanted(super::Db::postgres()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn held_notices_of_an_unwanted_write_then_a_removal_answer_gone() {
        super::held_notices_of_an_unwanted_write_then_a_removal_answer_gone(super::Db::postgres()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_wanted_write_whose_notice_is_lost_still_answers_the_watch() {
        super::a_wanted_write_whose_notice_is_lost_still_answers_the_watch(super::Db::postgres()).await;
    }
}

/// MariaDB's slot-less wait and how an entry went.
mod mariadb_departures {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dead_entry_swept_before_the_waiter_reads_it_still_holds_back_for_the_lock_delay() {
        super::a_dead_entry_swept_before_the_waiter_reads_it_still_holds_back_for_the_lock_delay(super::Db::mariadb())
            .await;
    }
}

/// Far below anything but a wake (a server wait that missed its wake looks
/// again after a third of the owner's TTL, 10 s here).
const WAKE: Duration = Duration::from_secs(5);

fn options() -> SessionOptions {
    SessionOptions::new()
        .with_ttl(Duration::from_secs(30))
        .with_request_timeout(Duration::from_secs(4))
}

async fn open_with(url: String) -> Session {
    bounded("open a session", Client::new(Sql::new(url)).session_with(options()))
        .await
        .expect("session")
}

fn backend(session: &Session) -> &Arc<dyn BackendSession> {
    session.backend_session()
}

static ATTEMPTS: AtomicU64 = AtomicU64::new(0);

async fn append(session: &Session, dir: &str, value: &[u8]) -> Entry {
    let attempt = format!("n{}-{}", ATTEMPTS.fetch_add(1, Ordering::Relaxed), session.id());
    let request = AppendRequest {
        dir,
        kind: EntryKind::Dlm,
        attempt: &attempt,
        value,
        conflicts: Conflicts::All,
        nearest: 0,
    };
    bounded("append", backend(session).append(&request))
        .await
        .expect("append")
        .entry
}

async fn read(session: &Session, dir: &str) -> Queue {
    bounded("read the queue", backend(session).read_queue(dir))
        .await
        .expect("read the queue")
}

fn value_of(queue: &Queue, entry: &Entry) -> Option<Vec<u8>> {
    queue
        .slots
        .iter()
        .find(|s| s.entry.order == entry.order)
        .map(|s| s.value.clone())
}

/// Sets `entry` to `value` (or deletes it) from `session`, on the versions
/// of a fresh read.
async fn write(session: &Session, dir: &str, entry: &Entry, value: Option<&[u8]>) {
    let queue = read(session, dir).await;
    let unchanged: Vec<(&Entry, i64)> = queue.slots.iter().map(|s| (&s.entry, s.version)).collect();
    let set: Vec<(&Entry, &[u8])> = value.map(|v| (entry, v)).into_iter().collect();
    let delete: Vec<&Entry> = value.is_none().then_some(entry).into_iter().collect();
    let update = QueueUpdate {
        dir,
        unchanged: &unchanged,
        present: &[],
        set: &set,
        delete: &delete,
        block: None,
    };
    bounded("update the queue", backend(session).update_queue(&update))
        .await
        .expect("update the queue")
        .expect("applied");
}

type Watching = tokio::task::JoinHandle<lockline::Result<Option<Vec<u8>>>>;

/// `watch_value_until` of `entry` from `session`, as seen in `seen`.
fn watch_until(session: &Session, entry: &Entry, seen: &[u8], wanted: fn(&[u8]) -> bool) -> Watching {
    let backend = Arc::clone(backend(session));
    let (entry, seen) = (entry.clone(), seen.to_vec());
    tokio::spawn(async move { backend.watch_value_until(&entry, &seen, &wanted).await })
}

async fn woken(watching: Watching) -> Option<Vec<u8>> {
    tokio::time::timeout(WAKE, watching)
        .await
        .expect("the watch did not wake")
        .expect("the watch task")
        .expect("the watch")
}

/// Waits until `count` waits are blocked on the server's named locks.
async fn waiting(db: &Db, count: u64) {
    until("the watchers block on the server", || db.locks().waiting >= count).await;
}

/// A proxy in front of the database and a session whose every connection
/// goes through it, with one watch of `entry` (it wants nothing) that keeps
/// the session's listening connection listening to the entry's channel:
/// returns the proxy's number of that connection.
async fn proxied_listener(db: &Db, entry: &Entry, seen: &[u8]) -> (TcpProxy, Session, Watching, usize) {
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", db.port())).expect("proxy");
    let session = open_with(db.url_via(&proxy.address())).await;
    let before = db.locks().waiting;
    let listener = proxy.connections_accepted();
    let keeper = watch_until(&session, entry, seen, |_| false);
    waiting(db, before + 1).await;
    let listening = db.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockline notices'");
    assert_eq!(listening, 1, "one listening connection");
    (proxy, session, keeper, listener)
}

/// The stage of a notice attack: the entry's owner, another session that
/// writes it, the entry (appended by the owner under `dir`), and a watcher
/// session whose listening connection (`listener`) runs through `proxy`,
/// kept listening by the `keeper` watch.
struct Stage {
    owner: Session,
    writer: Session,
    dir: &'static str,
    entry: Entry,
    proxy: TcpProxy,
    watcher: Session,
    keeper: Watching,
    listener: usize,
}

async fn stage(db: &Db, dir: &'static str) -> Stage {
    let (owner, writer) = (open_with(db.url()).await, open_with(db.url()).await);
    let entry = append(&owner, dir, b"start").await;
    let (proxy, watcher, keeper, listener) = proxied_listener(db, &entry, b"start").await;
    Stage {
        owner,
        writer,
        dir,
        entry,
        proxy,
        watcher,
        keeper,
        listener,
    }
}

impl Stage {
    /// Returns once every notice the listening connection was sent so far
    /// has been handed to the watchers: a write to a marker entry, sent
    /// after them on the same connection, has answered its own watch.
    async fn notices_delivered(&self, db: &Db) {
        const MARKERS: &str = "attack/notice-marker";
        let marker = append(&self.owner, MARKERS, b"start").await;
        let before = db.locks().waiting;
        let marked = watch_until(&self.watcher, &marker, b"start", |v| v != b"start");
        waiting(db, before + 1).await;
        write(&self.writer, MARKERS, &marker, Some(b"go")).await;
        assert_eq!(woken(marked).await.as_deref(), Some(&b"go"[..]));
    }

    /// Once the notices let through have arrived, a watch that answered
    /// must have answered what the entry holds (or `also`).
    async fn answered_what_is_held(&self, db: &Db, watching: Watching, also: Option<&[u8]>) {
        self.notices_delivered(db).await;
        let now = value_of(&read(&self.owner, self.dir).await, &self.entry);
        if watching.is_finished() {
            let answer = woken(watching).await;
            assert!(
                answer == now || (also.is_some() && answer.as_deref() == also),
                "the watch answered {answer:?}, a value the entry does not hold (it holds {now:?})"
            );
        } else {
            watching.abort();
        }
    }
}

/// A notice is sent at commit and reaches the listening connection when it
/// does: here the notice of another session's write (`wanted`) is held on
/// the way while the entry's owner writes it again (`later`), and a new
/// watch of the entry starts from that committed value. The late notice
/// then reaches it: it must not answer `wanted`, a value the entry no
/// longer holds (before notices carried values, a notice made the watcher
/// read the entry).
async fn a_late_notice_of_an_older_write_does_not_answer_a_later_watch(db: Db) {
    let s = stage(&db, "attack/late-notice").await;
    s.proxy.freeze_answers(s.listener);
    write(&s.writer, s.dir, &s.entry, Some(b"wanted")).await;
    write(&s.owner, s.dir, &s.entry, Some(b"later")).await;
    // The keeper, woken by the owner's write, waits again.
    waiting(&db, 1).await;
    let committed = value_of(&read(&s.owner, s.dir).await, &s.entry).expect("there");
    assert_eq!(committed, b"later");
    let before = db.locks().waiting;
    let watching = watch_until(&s.watcher, &s.entry, &committed, |v| v.starts_with(b"wanted"));
    waiting(&db, before + 1).await;
    s.proxy.thaw_connection(s.listener);
    s.answered_what_is_held(&db, watching, None).await;
    s.keeper.abort();
}

/// Two writes of another session while the listening connection is held:
/// the first unwanted, the second wanted; their notices arrive together.
async fn held_notices_of_an_unwanted_then_a_wanted_write_answer_the_wanted(db: Db) {
    let s = stage(&db, "attack/two-notices").await;
    let watching = watch_until(&s.watcher, &s.entry, b"start", |v| v.starts_with(b"wanted"));
    waiting(&db, 2).await;
    s.proxy.freeze_answers(s.listener);
    write(&s.writer, s.dir, &s.entry, Some(b"unwanted")).await;
    write(&s.writer, s.dir, &s.entry, Some(b"wanted")).await;
    s.proxy.thaw_connection(s.listener);
    assert_eq!(woken(watching).await.as_deref(), Some(&b"wanted"[..]));
    // The other way round: wanted, then unwanted again, held together.
    let watching = watch_until(&s.watcher, &s.entry, b"wanted", |v| v.starts_with(b"wanted-2"));
    waiting(&db, 2).await;
    s.proxy.freeze_answers(s.listener);
    write(&s.writer, s.dir, &s.entry, Some(b"wanted-2")).await;
    write(&s.writer, s.dir, &s.entry, Some(b"unwanted-2")).await;
    s.proxy.thaw_connection(s.listener);
    // Woken by the wanted value: fine only if it answers what the entry
    // holds, or the wanted value it held.
    s.answered_what_is_held(&db, watching, Some(b"wanted-2")).await;
    s.keeper.abort();
}

/// An unwanted write of another session, then its removal, their notices
/// held and delivered together: the watch answers that the entry is gone.
async fn held_notices_of_an_unwanted_write_then_a_removal_answer_gone(db: Db) {
    let s = stage(&db, "attack/write-then-removal").await;
    let watching = watch_until(&s.watcher, &s.entry, b"start", |_| false);
    waiting(&db, 2).await;
    s.proxy.freeze_answers(s.listener);
    write(&s.writer, s.dir, &s.entry, Some(b"unwanted")).await;
    write(&s.writer, s.dir, &s.entry, None).await;
    s.proxy.thaw_connection(s.listener);
    assert_eq!(woken(watching).await, None, "the entry is gone");
    assert_eq!(woken(s.keeper).await, None, "the entry is gone");
}

/// The listening connection goes silent (no byte either way, nothing
/// closed) just before another session writes a wanted value: the notice
/// is lost, and the watch still answers once the connection is found dead
/// and made again (a keepalive interval and a request timeout).
async fn a_wanted_write_whose_notice_is_lost_still_answers_the_watch(db: Db) {
    let s = stage(&db, "attack/lost-notice").await;
    let watching = watch_until(&s.watcher, &s.entry, b"start", |v| v.starts_with(b"wanted"));
    waiting(&db, 2).await;
    s.proxy.freeze_connection(s.listener);
    write(&s.writer, s.dir, &s.entry, Some(b"unwanted")).await;
    write(&s.writer, s.dir, &s.entry, Some(b"wanted")).await;
    let bound = options().keepalive_interval() + options().request_timeout() + Duration::from_secs(3);
    let answer = tokio::time::timeout(bound, watching)
        .await
        .expect("the watch was left waiting after a wanted write whose notice was lost")
        .expect("task")
        .expect("watch");
    assert_eq!(answer.as_deref(), Some(&b"wanted"[..]));
    s.keeper.abort();
    s.proxy.thaw_connection(s.listener);
}

/// Values of 2000 bytes (the longest a notice carries) and of 2001 bytes
/// (a notice that carries none: the watcher reads the entry), written by
/// another session: each answers the watch, unwanted ones are watched past.
async fn a_long_value_written_by_another_session_answers_a_watch(db: Db) {
    let (owner, watcher, writer) = (
        open_with(db.url()).await,
        open_with(db.url()).await,
        open_with(db.url()).await,
    );
    let dir = "attack/long-values";
    let entry = append(&owner, dir, b"start").await;
    for len in [2000, 2001, 4000] {
        let unwanted = vec![b'u'; len];
        let wanted: Vec<u8> = std::iter::once(b'w')
            .chain(std::iter::repeat_n(0xff, len - 1))
            .collect();
        let seen = value_of(&read(&owner, dir).await, &entry).expect("there");
        let watching = watch_until(&watcher, &entry, &seen, |v| v.first() == Some(&b'w'));
        waiting(&db, 1).await;
        write(&writer, dir, &entry, Some(&unwanted)).await;
        write(&writer, dir, &entry, Some(&wanted)).await;
        // An answer to the unwanted write would be that value.
        assert_eq!(woken(watching).await, Some(wanted), "the wanted value of {len} bytes");
    }
}

/// An EX holder, and behind it waiters in every mode from sessions of
/// their own, two rounds of them; each holder writes the value block when
/// it may, converts (PR up to PW, EX down to PR, PW down to CR) and
/// releases. No waiter is left waiting: every one is granted within a
/// bound, and each grant of PW or EX finds the last value written.
async fn waiters_of_every_mode_with_conversions_all_get_the_lock(db: Db) {
    let name = "attack/mixed";
    let client = Client::new(Sql::new(db.url()));
    let holder_session = bounded("a session", client.session_with(options()))
        .await
        .expect("session");
    let mut holder = holder_session
        .resource(name)
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    holder.set_value(b"0").expect("set");
    let modes = [
        LockMode::Pr,
        LockMode::Cw,
        LockMode::Ex,
        LockMode::Pr,
        LockMode::Pw,
        LockMode::Cr,
        LockMode::Ex,
        LockMode::Pw,
        LockMode::Pr,
        LockMode::Nl,
    ];
    let waits = client.stats().waits;
    let mut tasks = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        let session = bounded("a session", client.session_with(options()))
            .await
            .expect("session");
        let resource = session.resource(name).expect("resource");
        tasks.push(tokio::spawn(async move {
            let mut guard = resource.lock(mode).await?;
            tokio::time::sleep(Duration::from_millis(30)).await;
            match mode {
                LockMode::Ex | LockMode::Pw => {
                    guard.set_value(format!("{i}").as_bytes())?;
                    if mode == LockMode::Ex {
                        guard.convert(LockMode::Pr).await?;
                    } else {
                        guard.convert(LockMode::Cr).await?;
                    }
                }
                LockMode::Pr if i == 0 => guard.convert(LockMode::Pw).await?,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            guard.release().await?;
            drop(session);
            Ok::<(), lockline::Error>(())
        }));
    }
    // All but the NL request (granted at once) wait behind the holder.
    bounded(
        "the waiters queue",
        client.wait_for_stats(|s| s.waits >= waits + modes.len() as u64 - 1),
    )
    .await;
    holder.release().await.expect("release");
    for (i, task) in tasks.into_iter().enumerate() {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .unwrap_or_else(|_| panic!("waiter {i} ({:?}) was left waiting", modes[i]))
            .expect("task")
            .unwrap_or_else(|e| panic!("waiter {i}: {e}"));
    }
    let last = holder_session
        .resource(name)
        .expect("resource")
        .lock(LockMode::Ex)
        .await
        .expect("lock");
    assert!(last.value().valid, "nobody lost a lock: {:?}", last.value());
}

/// How many waits hear other sessions' writes where they need not: on
/// PostgreSQL the listening connections of the test's sessions; on MariaDB
/// the watch slots ever taken of the requests that wait for EX (each
/// entry's `watchers`, which a slot's wait raises and nothing lowers; a
/// waiter behind a lock held takes a slot there, as its wait reads the
/// entry in the same call).
fn hearing(db: &Db) -> i64 {
    if db.is_postgres() {
        db.count("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'lockline notices'")
    } else {
        db.count("SELECT COALESCE(SUM(watchers), 0) FROM lockline_entries WHERE value LIKE 'dlm2 - EX %'")
    }
}

/// A session of its own for each contender, from one client.
async fn sessions(client: &Client, count: usize) -> Vec<Session> {
    let mut sessions = Vec::new();
    for _ in 0..count {
        sessions.push(
            bounded("a session", client.session_with(options()))
                .await
                .expect("session"),
        );
    }
    sessions
}

/// An EX holder and two EX requests behind it, each of a session of its
/// own: the first waits on a lock held in the mode it asked for, the second
/// on a request never granted. Another session writes either only to grant
/// it or mark it, which never lets a waiter behind it on, so neither waiter
/// hears such writes: on PostgreSQL no session keeps a listening connection
/// (and PostgreSQL signals none at each grant's notice); on MariaDB the
/// wait behind the waiting request takes no watch slot (and its grant wakes
/// no wait). Each is still
/// granted when the one before it leaves, well within the bound at which a
/// server wait looks again on its own.
async fn waiters_behind_waiting_and_settled_requests_hear_no_other_writer(db: Db) {
    let name = "attack/quiet-chain";
    let client = Client::new(Sql::new(db.url()));
    let [a, b, c]: [Session; 3] = sessions(&client, 3).await.try_into().expect("three");
    let held = locked(&a, name, LockMode::Ex).await;
    let before = db.locks().waiting;
    let second = requested(&b, name, LockMode::Ex);
    waiting(&db, before + 1).await;
    let third = requested(&c, name, LockMode::Ex);
    waiting(&db, before + 2).await;
    assert_eq!(hearing(&db), 0, "a waiter hears writes that cannot let it on");
    if !db.is_postgres() {
        // The successor waits on the holder with the watch procedure (a
        // slot), whose read in the same call keeps its handoff at one
        // round trip.
        let slots = db.count("SELECT watchers FROM lockline_entries ORDER BY id LIMIT 1");
        assert_eq!(slots, 1, "the successor's wait on the holder takes the procedure");
    }
    held.release().await.expect("release");
    let second = granted(second, "the second request, when the holder left").await;
    assert!(!third.is_finished(), "the third request waits for the second");
    assert_eq!(hearing(&db), 0, "the grant of the request it waits on is not heard");
    second.release().await.expect("release");
    let third = granted(third, "the third request, when the second left").await;
    third.release().await.expect("release");
    until("nothing left", || db.entries() == 0).await;
}

/// A waiter behind a conversion hears other writers while it converts,
/// and is let on by the conversion's grant: A and B hold CW, C asks for PR
/// and waits on B (CW blocks PR) hearing no other writer. B converts to PR,
/// which A's CW blocks: C is woken by B's own write, still blocked (B holds
/// CW until the conversion is granted), and now hears other writers
/// (PostgreSQL: it listens on B's channel; MariaDB: its wait holds a
/// watch slot of B's, as behind any lock held), since a conversion's grant
/// changes whom it blocks. A's
/// release lets B's conversion on (B grants it in its own write), which
/// lets C on: C is granted well within the bound at which a server wait
/// looks again on its own. B's conversion and C's request each hold PR at
/// the end, together.
async fn a_waiter_behind_a_conversion_hears_other_writers_while_it_converts(db: Db) {
    let name = "attack/converting-blocker";
    let client = Client::new(Sql::new(db.url()));
    let [a, b, c]: [Session; 3] = sessions(&client, 3).await.try_into().expect("three");
    let first = locked(&a, name, LockMode::Cw).await;
    let mut second = locked(&b, name, LockMode::Cw).await;
    let before = db.locks().waiting;
    let third = requested(&c, name, LockMode::Pr);
    waiting(&db, before + 1).await;
    // B's watch slots (MariaDB): raised by each slot's wait, never lowered.
    let slots_on_b = || db.count("SELECT watchers FROM lockline_entries ORDER BY id LIMIT 1 OFFSET 1");
    if db.is_postgres() {
        assert_eq!(hearing(&db), 0, "C waits on a lock held in the mode it asked for");
    } else {
        // On MariaDB a waiter behind a lock held holds a watch slot all
        // along (its wait reads the entry in the same call), so it hears
        // other sessions' writes of B, the conversion's grant among them.
        assert!(slots_on_b() >= 1, "C's wait behind B holds no watch slot of B's");
    }
    let converting = tokio::spawn(async move {
        second.convert(LockMode::Pr).await?;
        Ok::<_, lockline::Error>(second)
    });
    if db.is_postgres() {
        until("C hears other writers once the entry it waits on converts", || {
            hearing(&db) == 1
        })
        .await;
    }
    waiting(&db, before + 2).await;
    assert!(!third.is_finished(), "C waits while B holds CW");
    first.release().await.expect("release");
    let second = granted(converting, "B's conversion, when A left").await;
    let third = granted(third, "C, once B's conversion was granted").await;
    assert_eq!((second.mode(), third.mode()), (LockMode::Pr, LockMode::Pr));
    second.release().await.expect("release");
    third.release().await.expect("release");
    until("nothing left", || db.entries() == 0).await;
}

/// `session`'s lock of `name` in `mode`, granted at once.
async fn locked(session: &Session, name: &str, mode: LockMode) -> ResourceGuard {
    let resource = session.resource(name).expect("resource");
    bounded("a lock granted at once", resource.lock(mode))
        .await
        .expect("lock")
}

/// `session`'s request for `name` in `mode`, in a task of its own.
fn requested(session: &Session, name: &str, mode: LockMode) -> JoinHandle<lockline::Result<ResourceGuard>> {
    let resource = session.resource(name).expect("resource");
    tokio::spawn(async move { resource.lock(mode).await })
}

/// What a request or conversion in a task gave, within a wake of the event
/// that let it on (`what`).
async fn granted<T>(task: JoinHandle<lockline::Result<T>>, what: &str) -> T {
    tokio::time::timeout(WAKE, task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not granted within {WAKE:?}"))
        .expect("task")
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// `watch_value_until` answers any value its filter wants, whoever wrote
/// it: here another session's grant of a waiting EX request, which a
/// lock-mode waiter's watch of that entry (`watch_blocker_until`) may leave
/// unheard, is wanted by a filter that takes any change, and answers it
/// within a wake, not at the bound at which a server wait looks again on
/// its own.
async fn a_watch_until_hears_another_sessions_grant_of_a_waiting_request(db: Db) {
    let (owner, watcher, writer) = (
        open_with(db.url()).await,
        open_with(db.url()).await,
        open_with(db.url()).await,
    );
    let dir = "attack/any-change";
    // A waiting EX request and its grant, as lockline writes them.
    let waiting_ex: &'static [u8] = b"dlm2 - EX 0 128 0 0 0badf00d";
    let granted: &[u8] = b"dlm2 EX EX 0 0 0 0 cafebabe";
    let entry = append(&owner, dir, waiting_ex).await;
    let before = db.locks().waiting;
    let watching = watch_until(&watcher, &entry, waiting_ex, |value| {
        value != b"dlm2 - EX 0 128 0 0 0badf00d"
    });
    waiting(&db, before + 1).await;
    write(&writer, dir, &entry, Some(granted)).await;
    assert_eq!(woken(watching).await.as_deref(), Some(granted));
}

/// A waiter with a lock-delay behind a PR holder that loses its lock with
/// its connection must hold back for the delay, even when another
/// session's queue change sweeps the dead entry before the waiter reads it.
/// The waiter's owning connection is kept busy meanwhile: another
/// contender of its session appends to a name whose turn a superuser
/// connection holds, so that any read the waiter makes after its wake
/// comes after the sweep (E's down-conversion). A wait that reads the
/// entry in a round trip of its own (MariaDB's slot-less wait) would find
/// it gone and take the loss for a release; this waiter waits with the
/// watch procedure, which reads it in the same call (a waiter behind a lock
/// held always does, and one with a lock-delay does behind anything).
async fn a_dead_entry_swept_before_the_waiter_reads_it_still_holds_back_for_the_lock_delay(db: Db) {
    use sqlx::{Connection as _, Executor as _};
    let delay = Duration::from_secs(3);
    let name = "attack/swept-before-read";
    let other = "attack/turn-held";
    let client = Client::new(Sql::new(db.url()));
    let [e, a]: [Session; 2] = sessions(&client, 2).await.try_into().expect("two");
    let b = bounded("a session", client.session_with(options().with_lock_delay(delay)))
        .await
        .expect("session");
    let mut first = locked(&e, name, LockMode::Pr).await;
    let _lost = locked(&a, name, LockMode::Pr).await;
    let before = db.locks().waiting;
    let resource = b.resource(name).expect("resource");
    let waiter = tokio::spawn(async move {
        let guard = resource.lock(LockMode::Ex).await;
        (tokio::time::Instant::now(), guard)
    });
    waiting(&db, before + 1).await;
    // B's owning connection, held up by an append whose turn is taken.
    let mut superuser = bounded("connect", sqlx::mysql::MySqlConnection::connect(&db.url()))
        .await
        .expect("connect");
    let turn: String = sqlx::query_scalar("SELECT CONCAT('ll:bb29fb052a1f:n:', SHA1(?))")
        .bind(other.as_bytes())
        .fetch_one(&mut superuser)
        .await
        .expect("turn");
    let taken: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
        .bind(&turn)
        .fetch_one(&mut superuser)
        .await
        .expect("take the turn");
    assert_eq!(taken, 1);
    let before = db.locks().waiting;
    let held_up = requested(&b, other, LockMode::Ex);
    waiting(&db, before + 1).await;
    // A's connection ends: its PR is lost, not released.
    let conn = db.sql(&format!("SELECT conn FROM lockline_sessions WHERE id = '{}'", a.id()));
    let cut = tokio::time::Instant::now();
    db.end_connection(conn.trim());
    // E's down-conversion changes the queue, which deletes A's dead entry.
    bounded("convert", first.convert(LockMode::Nl)).await.expect("convert");
    superuser
        .execute("DO RELEASE_ALL_LOCKS()")
        .await
        .expect("give the turn back");
    let (when, guard) = tokio::time::timeout(delay + WAKE, waiter)
        .await
        .expect("B was granted")
        .expect("task");
    let guard = guard.expect("lock");
    assert!(
        when - cut >= delay,
        "granted {:?} after the holder's loss, inside the lock-delay",
        when - cut
    );
    guard.release().await.expect("release");
    granted(held_up, "the held-up request")
        .await
        .release()
        .await
        .expect("release");
}
