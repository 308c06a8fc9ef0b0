//! `lockline lock`: the lock it takes (a mutex; `-s` the read side of a
//! read/write lock, `--limit N` a permit of a semaphore of N, `--mode MODE`
//! a lock mode, see `modes.rs`), `-n`'s one try and its status, and waiting
//! in line. Holding it while a command runs is `hold.rs`'s, as for `elect`.

use std::time::Duration;

use lockline::{Error, LockMode, Session};

use crate::args::{self, Args, Mode, Rest};
use crate::command_line::LockArgs;
use crate::exit::DEFAULT_CONFLICT;
use crate::hold::Holding;

/// Which lock `lock` takes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Recipe {
    /// Exclusive: a mutex (etcd's Go layout, Curator's mutex).
    Exclusive,
    /// `--shared`: the read side of a read/write lock.
    Shared,
    /// `--limit N`: a permit of a semaphore of N.
    Limit(usize),
    /// `--mode MODE`: a resource in one of the six lock modes.
    LockMode(LockMode),
}

/// The recipe `lock` takes and `-n`'s status (`None`: not one try).
pub(crate) fn recipe(lock: &LockArgs) -> Result<(Recipe, Option<u8>), String> {
    // clap refuses two of them together.
    let recipe = match (lock.shared, lock.limit, lock.mode) {
        (true, _, _) => Recipe::Shared,
        (false, Some(permits), _) => Recipe::Limit(permits),
        (false, None, Some(mode)) => Recipe::LockMode(mode),
        (false, None, None) => Recipe::Exclusive,
    };
    let nonblock = match (lock.nonblock, lock.conflict_exit_code) {
        (true, code) => Some(code.unwrap_or(DEFAULT_CONFLICT)),
        (false, Some(_)) => return Err("--conflict-exit-code is the status of -n/--nonblock: give -n too".to_owned()),
        (false, None) => None,
    };
    Ok((recipe, nonblock))
}

/// `lock NAME [COMMAND...]`: what follows NAME is the command.
pub(crate) fn mode(rest: Rest, recipe: Recipe) -> Mode {
    Mode::Lock {
        command: args::command(rest),
        recipe,
    }
}

/// Waits in line for the lock `recipe` names, as `args` say; `None` when
/// `--nonblock` found the lock taken (no entry is left behind).
pub(crate) async fn acquire(args: &Args, session: &Session, recipe: Recipe) -> lockline::Result<Option<Holding>> {
    let name = &args.name;
    // One try: `--nonblock`, or `--timeout 0` (which answers 124).
    if args.nonblock.is_some() || args.timeout == Some(Duration::ZERO) {
        let held = match recipe {
            Recipe::Exclusive => session.mutex(name)?.try_lock().await?.map(Holding::Lock),
            Recipe::Shared => session.rwlock(name)?.try_read().await?.map(Holding::Read),
            Recipe::Limit(permits) => session
                .semaphore(name, permits)?
                .try_acquire()
                .await?
                .map(Holding::Permit),
            Recipe::LockMode(mode) => session.resource(name)?.try_lock(mode).await?.map(Holding::Mode),
        };
        return match (held, args.nonblock) {
            (Some(held), _) => Ok(Some(held)),
            (None, Some(_)) => Ok(None),
            (None, None) => Err(Error::Timeout {
                name: name.clone(),
                waited: Duration::ZERO,
                held_by_this_session: false,
            }),
        };
    }
    let wait = async {
        Ok::<_, Error>(match recipe {
            Recipe::Exclusive => Holding::Lock(session.mutex(name)?.lock().await?),
            Recipe::Shared => Holding::Read(session.rwlock(name)?.read().await?),
            Recipe::Limit(permits) => Holding::Permit(session.semaphore(name, permits)?.acquire().await?),
            Recipe::LockMode(mode) => Holding::Mode(session.resource(name)?.lock(mode).await?),
        })
    };
    match (recipe, args.timeout) {
        (_, None) => wait.await.map(Some),
        (Recipe::Exclusive, Some(timeout)) => {
            Ok(Some(Holding::Lock(session.mutex(name)?.lock_timeout(timeout).await?)))
        }
        (Recipe::LockMode(mode), Some(timeout)) => Ok(Some(Holding::Mode(
            session.resource(name)?.lock_timeout(mode, timeout).await?,
        ))),
        // Dropping the wait removes its entry, as any cancelled acquire.
        (_, Some(timeout)) => match tokio::time::timeout(timeout, wait).await {
            Ok(held) => held.map(Some),
            Err(_) => Err(Error::Timeout {
                name: name.clone(),
                waited: timeout,
                held_by_this_session: false,
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::Recipe;
    use crate::args::tests::args;
    use crate::args::Mode;

    #[test]
    fn lock_takes_one_recipe_and_nonblock_its_status() {
        let recipe = |line: &str| match args(line).expect(line).mode {
            Mode::Lock { recipe, .. } => recipe,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(recipe("lock --etcd http://a:1 x"), Recipe::Exclusive);
        assert_eq!(recipe("lock --etcd http://a:1 -s x"), Recipe::Shared);
        assert_eq!(recipe("lock --shared --etcd http://a:1 x true"), Recipe::Shared);
        assert_eq!(recipe("lock --etcd http://a:1 --limit 3 x"), Recipe::Limit(3));
        assert_eq!(recipe("lock --etcd http://a:1 --limit=1 -n x"), Recipe::Limit(1));
        let nonblock = |line: &str| args(line).expect(line).nonblock;
        assert_eq!(nonblock("lock --etcd http://a:1 x"), None);
        assert_eq!(nonblock("lock --etcd http://a:1 -n x"), Some(1));
        assert_eq!(nonblock("lock --etcd http://a:1 -sn x"), Some(1));
        assert_eq!(
            nonblock("lock --etcd http://a:1 --nonblock --conflict-exit-code 7 x"),
            Some(7)
        );
        // After NAME, the command's own flags.
        let parsed = args("lock --etcd http://a:1 x flock -s -n y").expect("parse");
        assert_eq!(parsed.command(), ["flock", "-s", "-n", "y"]);
        assert_eq!(parsed.nonblock, None);
        for (line, says) in [
            (
                "lock --etcd http://a:1 -s --limit 2 x",
                "--shared and --limit cannot be used together",
            ),
            ("lock --etcd http://a:1 --limit 0 x", "from 1 to"),
            ("lock --etcd http://a:1 --limit 10001 x", "from 1 to"),
            (
                "lock --etcd http://a:1 -n --timeout 1 x",
                "--nonblock and --timeout cannot be used together",
            ),
            ("lock --etcd http://a:1 --conflict-exit-code 7 x", "give -n too"),
            (
                "lock --etcd http://a:1 -n --conflict-exit-code -1 x",
                "--conflict-exit-code",
            ),
            ("elect --etcd http://a:1 -n x p", "-n is for lock"),
            ("list --etcd http://a:1 --shared x", "--shared is for lock"),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says) && !error.contains('\n'), "{line}: {error}");
        }
    }
}
