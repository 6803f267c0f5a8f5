//! Project automation: `cargo xtask verify` runs every check CI runs
//! (format, lints, tests, docs); `cargo xtask fix` applies the automatic
//! fixes (format, clippy suggestions); `cargo xtask sim` runs a sweep of
//! seeded simulations (crates/oncekv-sim).

use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  verify   check formatting, run clippy with -D warnings, run every test,
           build the docs with warnings denied (what CI runs)
  fix      format the code and apply clippy's automatic fixes
  sim      run seeded simulations of a cluster under faults, optimised:
           cargo xtask sim --seeds 200 [--first 1]   a sweep
           cargo xtask sim --seed 17                 replay one seed
           (every flag: cargo xtask sim --help)";

/// One cargo invocation: a name for the log, its arguments, extra environment.
type Step<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    if task.as_deref() == Some("sim") {
        let status = Command::new(&cargo)
            .args([
                "run",
                "--quiet",
                "--release",
                "--package",
                "oncekv-sim",
                "--",
            ])
            .args(std::env::args().skip(2))
            .status();
        return match status {
            Ok(status) => ExitCode::from(status.code().map_or(1, |c| u8::try_from(c).unwrap_or(1))),
            Err(error) => {
                eprintln!("==> sim: could not run cargo: {error}");
                ExitCode::FAILURE
            }
        };
    }
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
