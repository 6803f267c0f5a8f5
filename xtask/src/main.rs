//! Project automation: `cargo xtask verify` runs every check CI runs
//! (format, lints, tests, docs); `cargo xtask fix` applies the automatic
//! fixes (format, clippy suggestions).

use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  verify   check formatting, run clippy with -D warnings, run every test,
           build the docs with warnings denied (what CI runs)
  fix      format the code and apply clippy's automatic fixes";

/// One cargo invocation: a name for the log, its arguments, extra environment.
type Step<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let steps: &[Step] = match task.as_deref() {
        Some("verify") => &[
            ("format", &["fmt", "--all", "--", "--check"], &[]),
            (
                "lints",
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--locked",
                    "--",
                    "-D",
                    "warnings",
                ],
                &[],
            ),
            ("tests", &["test", "--workspace", "--locked"], &[]),
            (
                "docs",
                &["doc", "--workspace", "--no-deps", "--locked"],
                &[("RUSTDOCFLAGS", "-D warnings")],
            ),
        ],
        Some("fix") => &[
            ("format", &["fmt", "--all"], &[]),
            (
                "lints",
                &[
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--fix",
                    "--allow-dirty",
                    "--allow-staged",
                ],
                &[],
            ),
        ],
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for (name, args, envs) in steps {
        eprintln!("==> {name}: cargo {}", args.join(" "));
        let status = Command::new(&cargo)
            .args(*args)
            .envs(envs.iter().copied())
            .status();
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("==> {name} failed ({status})");
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("==> {name}: could not run cargo: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    eprintln!("==> all steps passed");
    ExitCode::SUCCESS
}
