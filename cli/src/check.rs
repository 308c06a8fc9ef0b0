//! `lockline check`: whether a holder's sequencer is still current, in the
//! exit status (0 or 1, as `test`), and with `--verbose` on standard output.

use lockline::{Error, Sequencer, Session};

use crate::args::{Args, Mode, Rest};
use crate::exit::NOT_CURRENT;
use crate::group::signal_status;
use crate::output;
use crate::signals::StopSignals;

/// `check SEQUENCER`: `sequencer` well formed, and nothing after it. A
/// malformed one is refused before anything is contacted.
pub(crate) fn mode(sequencer: &str, mut rest: Rest) -> Result<Mode, String> {
    if rest.next().is_some() {
        return Err("check takes SEQUENCER only".to_owned());
    }
    let sequencer = sequencer.parse::<Sequencer>().map_err(|error| match error {
        Error::InvalidOptions { reason } => format!("check: {reason}"),
        other => format!("check: {other}"),
    })?;
    Ok(Mode::Check { sequencer })
}

/// `check`: asks the server whether `sequencer` is current; 0 if it is,
/// [`NOT_CURRENT`] if not, quietly unless `--verbose`.
pub(crate) async fn check(
    args: &Args,
    session: &Session,
    sequencer: &Sequencer,
    signals: &mut StopSignals,
) -> lockline::Result<u8> {
    let current = tokio::select! {
        biased;
        // It only reads: nothing to undo.
        signal = signals.recv() => return Ok(signal_status(signal)),
        current = session.check(sequencer) => current?,
    };
    if args.verbose {
        let answer: &[u8] = if current { b"current\n" } else { b"not current\n" };
        output::output(answer.to_vec());
    }
    Ok(if current { 0 } else { NOT_CURRENT })
}

#[cfg(test)]
mod tests {
    use crate::args::tests::args;

    #[test]
    fn check_takes_one_well_formed_sequencer_and_the_server_options() {
        let parsed = args("check --etcd http://a:1 lockline1:mutex:7:jobs/run%201").expect("parse");
        let crate::args::Mode::Check { sequencer } = &parsed.mode else {
            panic!("not check: {:?}", parsed.mode);
        };
        assert_eq!(sequencer.name(), "jobs/run 1");
        assert_eq!(sequencer.token().get(), 7);
        assert_eq!(parsed.name, "jobs/run 1");
        assert!(!parsed.verbose && parsed.command().is_empty());
        let verbose = args("check --verbose --postgres postgres://db/a -- lockline1:leader:9:e").expect("parse");
        assert!(verbose.verbose);
        for (line, says) in [
            ("check --etcd http://a:1", "SEQUENCER is required"),
            (
                "check --etcd http://a:1 lockline1:mutex:7:x extra",
                "check takes SEQUENCER only",
            ),
            ("check --etcd http://a:1 jobs/x", "not a lockline sequencer"),
            ("check --etcd http://a:1 lockline2:mutex:7:x", "version"),
            ("check --etcd http://a:1 lockline1:mutex:seven:x", "not a number"),
            ("check --etcd http://a:1 lockline1:exclusive:7:x", "unknown mode"),
            ("check --etcd http://a:1 lockline1:mutex:7:", "the name is empty"),
            (
                "check --etcd http://a:1 --ttl 3 lockline1:mutex:7:x",
                "--ttl is for lock, elect and list",
            ),
            (
                "check --etcd http://a:1 --timeout 3 lockline1:mutex:7:x",
                "--timeout is for lock and elect",
            ),
            (
                "check --etcd http://a:1 --kill-after 3 lockline1:mutex:7:x",
                "--kill-after is for lock and elect",
            ),
            (
                "check --etcd http://a:1 --lock-delay 3 lockline1:mutex:7:x",
                "--lock-delay is for lock and elect",
            ),
            (
                "check --etcd http://a:1 --print-key lockline1:mutex:7:x",
                "--print-key is for lock and elect",
            ),
            ("check --etcd http://a:1 -l lockline1:mutex:7:x", "-l is for elect"),
            ("lock --etcd http://a:1 --verbose x", "--verbose is for check"),
            (
                "check --etcd http://a:1 --verbose=yes lockline1:mutex:7:x",
                "unexpected value",
            ),
        ] {
            let error = args(line).expect_err(line);
            assert!(error.contains(says), "{line}: {error}");
        }
    }
}
