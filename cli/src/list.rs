//! `lockline list`: the queue of NAME on standard output, the holder
//! first, one line per contender (a lock-mode resource's in queue order,
//! see `modes.rs`).

use lockline::{Error, Session};

use crate::args::{Args, Mode, Rest};
use crate::exit::FAILURE;
use crate::hold::Held;
use crate::signals::StopSignals;
use crate::{modes, output, OUTPUT_TIMEOUT};

/// `list NAME`: nothing may follow NAME.
pub(crate) fn mode(mut rest: Rest) -> Result<Mode, String> {
    match rest.next() {
        Some(_) => Err("list takes NAME only".to_owned()),
        None => Ok(Mode::List),
    }
}

/// `list`: prints the queue of `NAME`, the holder first (a lock-mode
/// resource's in queue order, see [`modes::listing`]).
pub(crate) async fn list(args: &Args, session: &Session, signals: &mut StopSignals) -> lockline::Result<Held> {
    let read = async {
        let queue = session.queue(&args.name).await?;
        let modes = modes::listing(session, &args.name, &queue).await?;
        Ok::<_, Error>((queue, modes))
    };
    let (queue, modes) = tokio::select! {
        biased;
        signal = signals.recv() => return Ok(Held::Cancelled(signal)),
        read = read => read?,
    };
    let text = match modes {
        Some(text) => text,
        None => {
            let mut text = String::new();
            for contender in queue {
                let owner = contender.owner.as_deref().unwrap_or("-");
                text.push_str(&format!(
                    "{}\t{owner}\t{}\t{}",
                    contender.key,
                    contender.token,
                    contender.kind.label()
                ));
                // Next in line after a holder that lost the lock
                // involuntarily: not the holder yet, whatever its place.
                if let Some(until) = contender.delayed_until {
                    text.push_str(&format!("\tlock-delay until {}", output::utc(until)));
                }
                text.push('\n');
            }
            text
        }
    };
    output::output(text.into_bytes());
    // The listing is all `list` is for: a listing that could not be written
    // is a failure, not a success.
    let _ = tokio::task::spawn_blocking(|| output::finish(OUTPUT_TIMEOUT)).await;
    if output::stdout_has_failed() {
        note!("lockline: cannot write the queue of {:?} on standard output", args.name);
        return Ok(Held::Released(FAILURE));
    }
    Ok(Held::Released(0))
}
