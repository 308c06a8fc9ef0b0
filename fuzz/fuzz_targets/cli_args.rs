//! The command line's parsing (`cli/src/command_line.rs`: clap's definition,
//! the value parsers, the one-line error messages). Input: the arguments
//! after the program's name, separated by NUL bytes. Properties: no panic;
//! an error is one line; a secret (the value of `--password`, `--user`,
//! `--zk-auth`) never shows in it.
#![no_main]

#[allow(dead_code)]
#[path = "../../cli/src/command_line.rs"]
mod command_line;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};
use libfuzzer_sys::fuzz_target;

use command_line::Cli;

const SECRET_FLAGS: [&str; 3] = ["--password", "--user", "--zk-auth"];
const SENTINEL: &str = "Sentinel7Secret";

/// The one line the command line prints for `argv`, if it refuses it.
fn refusal(argv: &[String]) -> Option<String> {
    let args = std::iter::once("lockline".to_owned()).chain(argv.iter().cloned());
    let message = match Cli::command().try_get_matches_from(args) {
        Ok(matches) => Cli::from_arg_matches(&matches)
            .err()
            .map(|e| command_line::one_line(&e)),
        Err(error) if matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => None,
        Err(error) => Some(command_line::one_line(&error)),
    }?;
    assert!(!message.contains('\n'), "{message:?}");
    Some(message)
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if text.len() > 4096 {
        return;
    }
    let argv: Vec<String> = text.split('\0').map(str::to_owned).collect();
    refusal(&argv);
    // Every secret replaced by a sentinel: the sentinel is never shown.
    let mut hidden = argv.clone();
    let mut any = false;
    for i in 0..hidden.len() {
        let arg = hidden[i].clone();
        if let Some(flag) = SECRET_FLAGS.iter().find(|f| arg.starts_with(&format!("{f}="))) {
            hidden[i] = format!("{flag}={SENTINEL}");
            any = true;
        } else if SECRET_FLAGS.contains(&arg.as_str()) && i + 1 < hidden.len() {
            hidden[i + 1] = SENTINEL.to_owned();
            any = true;
        }
    }
    if any {
        if let Some(message) = refusal(&hidden) {
            assert!(!message.contains(SENTINEL), "{hidden:?}: {message}");
        }
    }
});
