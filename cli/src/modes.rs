//! `lockline lock --mode MODE`: a [`Resource`](lockline::Resource) taken in
//! one of the six lock modes of a VMS-style lock manager, and what `list`
//! shows of such a resource.
//!
//! - `lock --mode MODE NAME [COMMAND...]` takes `NAME` in `MODE` (`NL`,
//!   `CR`, `CW`, `PR`, `PW` or `EX`, any case) and holds it exactly as the
//!   other recipes hold theirs (`lock.rs` takes every recipe and `hold.rs`
//!   holds it): the command runs in its own process group
//!   and dies with the lock, `LOCKLINE_SEQUENCER` names the mode
//!   (`lockline1:lock-PW:TOKEN:NAME`), the exit statuses are the same.
//!   Holders of compatible modes hold together (two `PR`, a `CR` beside a
//!   `PW`); a request waits for every earlier entry it is incompatible with.
//!   `-n` is one try (`try_lock`: a taken resource exits with the
//!   `--conflict-exit-code` status and leaves no entry behind), `--timeout`
//!   bounds the wait (`lock_timeout`, 124), `--timeout 0` is one try that
//!   exits 124, `--lock-delay` holds a request back after an involuntary
//!   loss. `--mode` is refused with `-s` and `--limit`, in a line naming
//!   both flags (a name is used by one recipe kind at a time).
//! - `list NAME`, when `NAME` holds lock-mode entries, prints them in queue
//!   order (a granted entry may follow a waiting one: an `NL` is granted
//!   past a waiting `EX`), one line each:
//!   `KEY<TAB>OWNER<TAB>TOKEN<TAB>lock-MODE<TAB>STATE`, where MODE is the
//!   mode held (asked for, while waiting), TOKEN the grant's fencing token
//!   (`-` while waiting) and STATE `granted`, `waiting` or `converting to
//!   MODE` (a holder asking for another mode, still holding the first).
//!   A request in lock-delay is listed as `waiting` (it marks nothing in
//!   its entry). Other names keep their four (or five) fields.

use lockline::{Contender, EntryKind, Error, FencingToken, LockMode, ModeContender, Session};

/// The listing of `name` when `queue` (its plain listing) holds lock-mode
/// entries: one more read, of the resource's contenders with their modes.
/// `None` for any other name, and when another recipe's contender is
/// queued beside them at this moment (the core refuses it, and it leaves
/// again): the plain listing is printed then.
pub(crate) async fn listing(session: &Session, name: &str, queue: &[Contender]) -> lockline::Result<Option<String>> {
    if !queue.iter().any(|contender| contender.kind == EntryKind::Dlm) {
        return Ok(None);
    }
    let contenders = match session.resource(name)?.contenders().await {
        Ok(contenders) => contenders,
        Err(Error::InvalidName { .. }) => return Ok(None),
        Err(error) => return Err(error),
    };
    Ok(Some(contenders.iter().map(line).collect()))
}

/// One contender's line, newline included.
fn line(contender: &ModeContender) -> String {
    fields(
        &contender.key,
        contender.session.as_deref(),
        contender.token,
        contender.granted,
        contender.requested,
    )
}

/// `KEY<TAB>OWNER<TAB>TOKEN<TAB>lock-MODE<TAB>STATE` and a newline, from a
/// contender's parts: `granted` the mode held (`None` while waiting),
/// `requested` the mode asked for (the held one when settled).
fn fields(
    key: &str,
    owner: Option<&str>,
    token: Option<FencingToken>,
    granted: Option<LockMode>,
    requested: LockMode,
) -> String {
    let owner = owner.unwrap_or("-");
    let token = token.map_or_else(|| "-".to_owned(), |token| token.to_string());
    let (mode, state) = match granted {
        Some(held) if held != requested => (held, format!("converting to {requested}")),
        Some(held) => (held, "granted".to_owned()),
        None => (requested, "waiting".to_owned()),
    };
    format!("{key}\t{owner}\t{token}\tlock-{mode}\t{state}\n")
}

#[cfg(test)]
mod tests {
    use lockline::{FencingToken, LockMode};

    use crate::args::{parse, Action, Args, Mode};
    use crate::lock::Recipe;

    fn args(line: &str) -> Result<Args, String> {
        match parse(line.split_whitespace().map(str::to_owned).collect(), |_| None)? {
            Action::Run(args) => Ok(*args),
            Action::Show(_) | Action::Completions(_) => Err("not a run".to_owned()),
        }
    }

    fn recipe(line: &str) -> Recipe {
        match args(line).unwrap_or_else(|error| panic!("{line}: {error}")).mode {
            Mode::Lock { recipe, .. } => recipe,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn mode_takes_the_six_modes_in_any_case() {
        for mode in LockMode::ALL {
            for written in [mode.label().to_owned(), mode.label().to_lowercase()] {
                let line = format!("lock --etcd http://a:1 --mode {written} x true");
                assert_eq!(recipe(&line), Recipe::LockMode(mode), "{line}");
            }
        }
        assert_eq!(
            recipe("lock --etcd http://a:1 --mode=Pw x"),
            Recipe::LockMode(LockMode::Pw)
        );
        // After NAME, the command's own flags.
        let parsed = args("lock --etcd http://a:1 x flock --mode EX y").expect("parse");
        assert_eq!(parsed.command(), ["flock", "--mode", "EX", "y"]);
        assert_eq!(recipe("lock --etcd http://a:1 x flock --mode EX y"), Recipe::Exclusive);
    }

    #[test]
    fn mode_goes_with_nonblock_timeout_and_lock_delay_as_the_mutex() {
        let one_try = args("lock --etcd http://a:1 --mode EX -n --conflict-exit-code 7 x true").expect("parse");
        assert_eq!(one_try.nonblock, Some(7));
        assert_eq!(
            recipe("lock --etcd http://a:1 -n --mode pr x"),
            Recipe::LockMode(LockMode::Pr)
        );
        let bounded = args("lock --etcd http://a:1 --mode CW --timeout 1.5 --lock-delay 2 x").expect("parse");
        assert_eq!(bounded.timeout.map(|t| t.as_millis()), Some(1500));
        assert_eq!(bounded.lock_delay.as_secs(), 2);
        let error = args("lock --etcd http://a:1 --mode EX -n --timeout 1 x").expect_err("-n with --timeout");
        assert!(
            error.contains("--nonblock and --timeout cannot be used together"),
            "{error}"
        );
    }

    #[test]
    fn a_mode_that_is_none_of_the_six_is_refused_naming_them() {
        for bad in ["XX", "exclusive", "P", "", "EX,PR", "-1"] {
            let line = format!("lock --etcd http://a:1 --mode={bad} x true");
            let error = args(&line).expect_err(&line);
            assert!(
                error.contains("--mode") && error.contains("NL, CR, CW, PR, PW or EX") && !error.contains('\n'),
                "{line}: {error}"
            );
        }
        let error = args("lock --etcd http://a:1 --mode").expect_err("no value");
        assert!(error.contains("--mode"), "{error}");
        // An option after it is not taken for its value (nor shown).
        let error = args("lock --etcd http://a:1 --mode --user=root:SECRET-9 x").expect_err("an option");
        assert!(error.contains("--mode") && !error.contains("SECRET-9"), "{error}");
    }

    #[test]
    fn mode_is_refused_with_shared_and_limit_naming_both_flags() {
        for (line, other) in [
            ("lock --etcd http://a:1 --mode PR -s x", "--shared"),
            ("lock --etcd http://a:1 -s --mode PR x", "--shared"),
            ("lock --etcd http://a:1 --shared --mode=PR x", "--shared"),
            ("lock --etcd http://a:1 --mode EX --limit 2 x", "--limit"),
            ("lock --etcd http://a:1 --limit=2 --mode EX x", "--limit"),
        ] {
            let error = args(line).expect_err(line);
            assert!(
                error.contains("--mode") && error.contains(other) && error.contains("cannot be used together"),
                "{line}: {error}"
            );
            assert!(!error.contains('\n'), "{line}: {error}");
        }
        for (line, says) in [
            ("elect --etcd http://a:1 --mode EX x p", "--mode is for lock"),
            ("list --etcd http://a:1 --mode EX x", "--mode is for lock"),
            (
                "check --etcd http://a:1 --mode EX lockline1:lock-EX:7:x",
                "--mode is for lock",
            ),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says), "{line}: {error}");
        }
    }

    #[test]
    fn check_takes_lock_mode_sequencers() {
        for mode in LockMode::ALL {
            let line = format!("check --etcd http://a:1 lockline1:lock-{mode}:7:jobs/x");
            let parsed = args(&line).expect(&line);
            let Mode::Check { sequencer } = &parsed.mode else {
                panic!("not check: {:?}", parsed.mode);
            };
            assert_eq!(sequencer.mode(), lockline::Mode::Lock(mode));
            assert_eq!(sequencer.token().get(), 7);
            assert_eq!(parsed.name, "jobs/x");
        }
        for bad in ["lockline1:lock-XX:7:x", "lockline1:lock-pw:7:x", "lockline1:lock-:7:x"] {
            let error = args(&format!("check --etcd http://a:1 {bad}")).expect_err(bad);
            assert!(error.contains("unknown mode"), "{bad}: {error}");
        }
    }

    #[test]
    fn a_line_shows_the_mode_held_or_asked_for_and_the_state() {
        use LockMode::*;
        let token = Some(FencingToken::new(42));
        let line = super::fields;
        assert_eq!(
            line("r/dlm/1f-a", Some("1f"), token, Some(Pr), Pr),
            "r/dlm/1f-a\t1f\t42\tlock-PR\tgranted\n"
        );
        assert_eq!(
            line("r/dlm/1f-a", Some("1f"), token, Some(Pr), Ex),
            "r/dlm/1f-a\t1f\t42\tlock-PR\tconverting to EX\n"
        );
        assert_eq!(
            line("r/dlm/2e-b", None, None, None, Cw),
            "r/dlm/2e-b\t-\t-\tlock-CW\twaiting\n"
        );
    }
}
