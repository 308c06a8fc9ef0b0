//! `lockline completions SHELL`: a completion script for SHELL, made from
//! the command line's own definition, on standard output.

use clap::CommandFactory;

use crate::command_line::Cli;

/// Prints the completion script for `shell`.
pub(crate) fn print(shell: clap_complete::Shell) {
    let mut stdout = std::io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "lockline", &mut stdout);
}
