//! Everything a user holds can move into `tokio::spawn`: `Send + Sync + 'static`.

use lockline::{
    Client, ClientStats, Contender, Error, FencingToken, MemoryBackend, Mutex, MutexGuard, Session, SessionOptions,
    SessionState, Write,
};

fn send_sync_static<T: Send + Sync + 'static>() {}

#[test]
fn user_types_are_send_sync_static() {
    send_sync_static::<Client>();
    send_sync_static::<Session>();
    send_sync_static::<SessionOptions>();
    send_sync_static::<SessionState>();
    send_sync_static::<Mutex>();
    send_sync_static::<MutexGuard>();
    send_sync_static::<FencingToken>();
    send_sync_static::<Error>();
    send_sync_static::<Contender>();
    send_sync_static::<lockline::backend::Entry>();
    send_sync_static::<ClientStats>();
    send_sync_static::<MemoryBackend>();
    send_sync_static::<Write>();
    send_sync_static::<lockline::LeaderSelector>();
    send_sync_static::<lockline::Term>();
}

#[test]
fn futures_are_send() {
    fn send<T: Send>(_: &T) {}
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let client = Client::memory();
        send(&client.session());
        let session = client.session().await.expect("session");
        send(&session.lost());
        send(&session.close());
        let mutex = session.mutex("send").expect("mutex");
        send(&mutex.lock());
        send(&mutex.try_lock());
        send(&mutex.lock_timeout(std::time::Duration::from_secs(1)));
        let guard = mutex.lock().await.expect("lock");
        send(&guard.lost());
        send(&guard.release());
    });
}

#[tokio::test]
async fn a_guard_moves_into_a_task() {
    let session = Client::memory().session().await.expect("session");
    let guard = session.mutex("moved").expect("mutex").lock().await.expect("lock");
    let token = tokio::spawn(async move {
        let token = guard.token();
        guard.release().await.map(|()| token)
    })
    .await
    .expect("task")
    .expect("release");
    assert!(token.get() > 0);
}
