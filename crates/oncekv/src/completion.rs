//! `oncekv completion SHELL` and `oncekv man`: shell completion scripts
//! (`clap_complete`) and roff manual pages (`clap_mangen`), both generated
//! from the one clap definition of the command line, so they name exactly
//! the subcommands and flags the binary accepts.
//!
//! Everything is rendered into memory first and then written: a closed
//! standard output (`oncekv man | head`) ends the program quietly, and a
//! write that fails is an error with its path, never a panic.

use crate::exit;
use anyhow::Context;
use clap::{Args, Command};
use clap_complete::Shell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The name the scripts and pages give the program.
const BIN_NAME: &str = "oncekv";

const COMPLETION_AFTER_HELP: &str = "\
Install (one of):
  oncekv completion bash > ~/.local/share/bash-completion/completions/oncekv
  oncekv completion zsh  > \"${fpath[1]}/_oncekv\"     # a directory in $fpath
  oncekv completion fish > ~/.config/fish/completions/oncekv.fish
or, for the current shell only:
  source <(oncekv completion bash)";

const MAN_AFTER_HELP: &str = "\
Examples:
  oncekv man | man -l -                         # read it now
  oncekv man > /usr/local/share/man/man1/oncekv.1
  oncekv man --dir /usr/local/share/man/man1    # oncekv.1, oncekv-serve.1, ...";

/// Flags of `oncekv completion`.
#[derive(Debug, Args)]
#[command(after_help = COMPLETION_AFTER_HELP)]
pub struct CompletionArgs {
    /// The shell to print the completion script for.
    #[arg(value_enum)]
    shell: Shell,
}

/// Flags of `oncekv man`.
#[derive(Debug, Args)]
#[command(after_help = MAN_AFTER_HELP)]
pub struct ManArgs {
    /// Write one page per command and subcommand (oncekv.1,
    /// oncekv-serve.1, oncekv-user-add.1, ...) into DIR, created if
    /// missing, instead of printing the page of `oncekv` itself.
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

/// The completion script of `shell` for the command line `cli`.
pub fn completion_script(shell: Shell, mut cli: Command) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cli, BIN_NAME, &mut script);
    script
}

/// The roff manual page of the command line `cli` (section 1).
pub fn man_page(cli: Command) -> std::io::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cli.bin_name(BIN_NAME)).render(&mut page)?;
    Ok(page)
}

/// Writes a page for `cli` and each of its visible subcommands, at any
/// depth, into `dir`; returns the files written.
pub fn write_man_pages(cli: Command, dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create the directory {}", dir.display()))?;
    let mut cli = cli.bin_name(BIN_NAME).disable_help_subcommand(true);
    cli.build();
    let mut written = Vec::new();
    write_pages(cli, dir, &mut written)?;
    Ok(written)
}

fn write_pages(cli: Command, dir: &Path, written: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for sub in cli.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        write_pages(sub.clone(), dir, written)?;
    }
    let man = clap_mangen::Man::new(cli);
    let path = dir.join(man.get_filename());
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("cannot render {}", path.display()))?;
    std::fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))?;
    written.push(path);
    Ok(())
}

/// Runs `oncekv completion`: prints the script.
pub fn run_completion(args: &CompletionArgs, cli: Command) -> ExitCode {
    print(&completion_script(args.shell, cli))
}

/// Runs `oncekv man`: prints the page, or writes every page into `--dir`.
pub fn run_man(args: &ManArgs, cli: Command) -> ExitCode {
    match &args.dir {
        None => match man_page(cli) {
            Ok(page) => print(&page),
            Err(error) => {
                eprintln!("error: cannot render the manual page: {error}");
                exit::code(exit::ERROR)
            }
        },
        Some(dir) => match write_man_pages(cli, dir) {
            Ok(written) => {
                for path in written {
                    sayln!("{}", path.display());
                }
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("error: {error:#}");
                exit::code(exit::ERROR)
            }
        },
    }
}

/// Writes `bytes` to standard output; a closed one ends quietly, like
/// `say!`.
fn print(bytes: &[u8]) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    if stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .is_err()
    {
        std::process::exit(0);
    }
    ExitCode::SUCCESS
}
