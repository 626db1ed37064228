//! `mail-breaker completions bash|zsh|fish`: a completion script for the shell, on stdout.
//!
//! ```text
//! mail-breaker completions bash > /etc/bash_completion.d/mail-breaker
//! ```

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;

use crate::exit::Exit;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell.
    shell: ShellName,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum ShellName {
    Bash,
    Zsh,
    Fish,
}

pub fn print(args: &CompletionsArgs) -> Exit {
    let shell = match args.shell {
        ShellName::Bash => Shell::Bash,
        ShellName::Zsh => Shell::Zsh,
        ShellName::Fish => Shell::Fish,
    };
    let mut command = crate::Cli::command();
    clap_complete::generate(shell, &mut command, "mail-breaker", &mut std::io::stdout());
    Exit::Ok
}
