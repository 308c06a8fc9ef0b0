//! `lockline elect`: campaigning in an election with PROPOSAL as the value
//! (leading while a command runs is `hold.rs`'s, as for `lock`), and with
//! `-l` printing every leader until a signal.

use futures::StreamExt;
use lockline::{Error, Session};

use crate::args::{self, Args, Mode, Rest};
use crate::command_line::HoldingFlags;
use crate::exit::FAILURE;
use crate::hold::{Held, Holding};
use crate::output;
use crate::signals::StopSignals;

/// `elect NAME PROPOSAL [COMMAND...]`, or `elect --listen NAME`: what
/// follows NAME.
pub(crate) fn mode(mut rest: Rest, listen: bool) -> Result<Mode, String> {
    if listen {
        return match rest.next() {
            Some(_) => Err("elect --listen takes NAME only, no PROPOSAL or COMMAND".to_owned()),
            None => Ok(Mode::Listen),
        };
    }
    let proposal = rest
        .next()
        .ok_or_else(|| "elect needs PROPOSAL after NAME (or --listen)".to_owned())?;
    if proposal == "-l" || proposal == "--listen" {
        return Err(format!("{proposal} goes before NAME: elect {proposal} NAME"));
    }
    Ok(Mode::Elect {
        proposal,
        command: args::command(rest),
    })
}

/// `elect --listen` holds nothing: the flags of holding are refused.
pub(crate) fn refuse_holding_flags(holding: &HoldingFlags) -> Result<(), String> {
    if holding.print_key {
        return Err("--print-key is for lock and elect with a COMMAND".to_owned());
    }
    if holding.timeout.is_some() {
        return Err("--timeout is for lock and elect, not elect --listen".to_owned());
    }
    if holding.lock_delay.is_some() {
        return Err("--lock-delay is for lock and elect, not elect --listen".to_owned());
    }
    if holding.metrics.is_some() {
        return Err("--metrics is for lock and elect, not elect --listen".to_owned());
    }
    Ok(())
}

/// Campaigns with `proposal` as the value until leader, within `--timeout`
/// when given.
pub(crate) async fn campaign(args: &Args, session: &Session, proposal: &str) -> lockline::Result<Holding> {
    let election = session.election(&args.name)?;
    let leadership = match args.timeout {
        Some(timeout) => election.campaign_timeout(proposal.as_bytes(), timeout).await?,
        None => election.campaign(proposal.as_bytes()).await?,
    };
    Ok(Holding::Leader(leadership))
}

/// `elect --listen`: prints the leader's key and value on every change until
/// a signal.
pub(crate) async fn listen(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let election = session.election(&args.name)?;
    let changes = election.observe();
    tokio::pin!(changes);
    loop {
        let change = tokio::select! {
            biased;
            _ = signals.recv() => return Ok(Held::Released(0)),
            () = output::stdout_failed() => {
                note!("lockline: standard output is closed; no longer listening to {:?}", args.name);
                return Ok(Held::Released(FAILURE));
            }
            change = changes.next() => change,
        };
        match change {
            // No leader: nothing to print, as etcdctl.
            Some(Ok(None)) => {}
            Some(Ok(Some(leader))) => {
                let mut text = Vec::with_capacity(leader.key().len() + leader.value().len() + 2);
                text.extend_from_slice(leader.key().as_bytes());
                text.push(b'\n');
                text.extend_from_slice(leader.value());
                text.push(b'\n');
                output::output(text);
            }
            Some(Err(error)) => return Err(error),
            None => {
                return Err(Error::Closed {
                    session: session.id().to_string(),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::args::tests::args;

    #[test]
    fn parses_elect_listen_and_list() {
        let elect = args("elect --etcd http://a:1 --print-key jobs/leader node-a -- sh -c true").expect("parse");
        assert_eq!(
            elect.mode,
            crate::args::Mode::Elect {
                proposal: "node-a".into(),
                command: vec!["sh".into(), "-c".into(), "true".into()]
            }
        );
        assert!(elect.print_key);
        let bare = args("elect --zookeeper h:1 jobs/leader node-a").expect("parse");
        assert_eq!(
            bare.mode,
            crate::args::Mode::Elect {
                proposal: "node-a".into(),
                command: vec![]
            }
        );
        for line in [
            "elect -l --etcd http://a:1 jobs/leader",
            "elect --etcd http://a:1 --listen jobs/leader",
        ] {
            let listen = args(line).expect("parse");
            assert_eq!(listen.mode, crate::args::Mode::Listen, "{line}");
            assert_eq!(listen.name, "jobs/leader");
        }
        let list = args("list --etcd http://a:1 jobs/x").expect("parse");
        assert_eq!(list.mode, crate::args::Mode::List);
        // `--` between NAME and COMMAND is not the command.
        let lock = args("lock --etcd http://a:1 jobs/x -- echo hi").expect("parse");
        assert_eq!(lock.command(), ["echo", "hi"]);
        for line in [
            "elect --etcd http://a:1 jobs/leader",
            "elect -l --etcd http://a:1 jobs/leader node-a",
            "lock -l --etcd http://a:1 jobs/x",
            "list --etcd http://a:1 jobs/x extra",
            "list --etcd http://a:1 --print-key jobs/x",
            "list --etcd http://a:1 --timeout 1 jobs/x",
            "elect -l --etcd http://a:1 --timeout 1 jobs/x",
            "lock --etcd http://a:1 --print-key=yes jobs/x true",
        ] {
            assert!(args(line).is_err(), "accepted: {line}");
        }
    }
}
