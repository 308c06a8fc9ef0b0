#![doc = include_str!("lockline.md")]

#[macro_use]
mod output;
mod args;
mod backend;
mod check;
mod command_line;
mod completions;
mod elect;
mod exit;
mod group;
mod hold;
mod list;
mod lock;
mod metrics;
mod modes;
mod run;
mod secrets;
mod signals;

use std::process::ExitCode;
use std::time::Duration;

use crate::args::{parse, Action};
use crate::exit::USAGE_ERROR;
use crate::secrets::written_secrets;

/// How long `lockline` waits, on its way out, for its last lines to be
/// written; a stuck standard output or error cannot hold it up for longer.
pub(crate) const OUTPUT_TIMEOUT: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let written = written_secrets(&argv, |name| std::env::var(name).ok());
    let code = match parse(argv, |name| std::env::var(name).ok()) {
        Ok(Action::Run(args)) => {
            output::hide(args.secrets().into_iter().chain(written).collect());
            run::start(*args)
        }
        // Help and version on standard output, status 0 (1 if it cannot be
        // written).
        Ok(Action::Show(shown)) => {
            return if shown.print().is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Ok(Action::Completions(shell)) => {
            completions::print(shell);
            return ExitCode::SUCCESS;
        }
        Err(message) => {
            output::hide(written);
            note!("lockline: {message}");
            USAGE_ERROR
        }
    };
    output::finish(OUTPUT_TIMEOUT);
    ExitCode::from(code)
}
