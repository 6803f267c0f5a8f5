//! Project automation: `cargo xtask verify` runs every check CI runs
//! (format, lints, tests, docs, then the Python client's tests);
//! `cargo xtask fix` applies the automatic fixes (format, clippy
//! suggestions); `cargo xtask sim` runs a sweep of
//! seeded simulations (crates/oncekv-sim); `cargo xtask build-bench`
//! builds the release binaries `oncekv` and `oncekv-bench` (with
//! `--target etcd`).
//!
//! A test that cannot run here for lack of root, etcd or fiu-utils is
//! skipped, and `verify` lists it at the end: the tests append a line to
//! the file `ONCEKV_SKIP_LOG` names (`<target>/oncekv-skipped.txt`). Under
//! `CI=true` such a test fails instead (`oncekv_harness::testing::
//! missing_dependency`).
//!
//! The `etcd` feature of `oncekv-bench` compiles etcd's protobuf files, which
//! needs `protoc`: these tasks point `PROTOC` at the binary that ships in
//! the `protoc-bin-vendored` crate, so nothing has to be installed.

mod tidy;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  verify   check formatting, run clippy with -D warnings, run every test,
           build the docs with warnings denied (what CI runs); with the
           etcd feature of oncekv-bench, and clippy once more without it;
           then the Python client's tests (clients/python/run-tests.sh);
           lists the tests skipped for lack of root, etcd or fiu-utils
           (with CI=true those fail instead)
  fix      format the code and apply clippy's automatic fixes
  build-bench
           build target/release/oncekv, and oncekv-bench with the etcd
           feature (oncekv-bench --target etcd; used by scripts/bench-*.sh)
  sim      run seeded simulations of a cluster under faults, optimised:
           cargo xtask sim --seeds 200 [--first 1]   a sweep
           cargo xtask sim --seed 17                 replay one seed
           (every flag: cargo xtask sim --help)";

/// One cargo invocation: a name for the log, its arguments, extra environment.
type Step<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);

/// The feature that CI compiles, lints, tests and documents besides the
/// defaults: `oncekv-bench --target etcd`, and the tests that drive oncekv
/// through etcd's Rust client.
const ETCD_FEATURE: &str = "oncekv-bench/etcd";

/// The environment variable through which the tests log their skips
/// (`oncekv_harness::testing::SKIP_LOG_ENV`).
const SKIP_LOG_ENV: &str = "ONCEKV_SKIP_LOG";

/// The file the tests of `verify` log their skips to, in the target
/// directory (`CARGO_TARGET_DIR`, as cargo reads it, else the workspace's
/// `target`); absolute, as the tests run in their packages' folders.
fn skip_log() -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => std::env::current_dir().unwrap_or_default().join(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    };
    target.join("oncekv-skipped.txt")
}

/// Prints the tests skipped for a missing dependency, if any.
fn print_skips(log: &Path) {
    if let Some(summary) = std::fs::read_to_string(log)
        .ok()
        .and_then(|text| skip_summary(log, &text))
    {
        eprint!("{summary}");
    }
}

/// The summary of the skips logged in `text` (read from `log`); `None`
/// if there are none.
fn skip_summary(log: &Path, text: &str) -> Option<String> {
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let count = match lines.len() {
        1 => "1 test".to_string(),
        n => format!("{n} tests"),
    };
    let mut summary = format!(
        "==> {count} skipped for a missing dependency (with CI=true these fail; {}):\n",
        log.display()
    );
    for line in lines {
        summary.push_str(&format!("    {line}\n"));
    }
    Some(summary)
}

/// The protoc binary shipped in the `protoc-bin-vendored` crate (or, on a
/// platform it has none for, the one `PROTOC` names).
fn protoc() -> Result<String, String> {
    match protoc_bin_vendored::protoc_bin_path() {
        Ok(path) => Ok(path.display().to_string()),
        Err(error) => match std::env::var("PROTOC") {
            Ok(protoc) if !protoc.is_empty() => Ok(protoc),
            _ => Err(format!(
                "no vendored protoc for this platform ({error}); set PROTOC to a protoc binary"
            )),
        },
    }
}

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
    let protoc = match task.as_deref() {
        Some("verify" | "fix" | "build-bench") => match protoc() {
            Ok(protoc) => protoc,
            Err(error) => {
                eprintln!("==> {error}");
                return ExitCode::FAILURE;
            }
        },
        _ => String::new(),
    };
    let with_protoc: &[(&str, &str)] = &[("PROTOC", &protoc)];
    let skip_log = skip_log();
    let skip_log_text = skip_log.display().to_string();
    let tests_env: &[(&str, &str)] = &[("PROTOC", &protoc), (SKIP_LOG_ENV, &skip_log_text)];
    let docs_env: &[(&str, &str)] = &[("RUSTDOCFLAGS", "-D warnings"), ("PROTOC", &protoc)];
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
                    "--features",
                    ETCD_FEATURE,
                    "--",
                    "-D",
                    "warnings",
                ],
                with_protoc,
            ),
            (
                "lints without the etcd feature",
                &[
                    "clippy",
                    "--package",
                    "oncekv-bench",
                    "--all-targets",
                    "--locked",
                    "--",
                    "-D",
                    "warnings",
                ],
                &[],
            ),
            (
                "tests",
                &[
                    "test",
                    "--workspace",
                    "--locked",
                    "--features",
                    ETCD_FEATURE,
                ],
                tests_env,
            ),
            (
                "docs",
                &[
                    "doc",
                    "--workspace",
                    "--no-deps",
                    "--locked",
                    "--features",
                    ETCD_FEATURE,
                ],
                docs_env,
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
                    "--features",
                    ETCD_FEATURE,
                    "--fix",
                    "--allow-dirty",
                    "--allow-staged",
                ],
                with_protoc,
            ),
        ],
        Some("build-bench") => &[(
            "build-bench",
            &[
                "build",
                "--release",
                "--locked",
                "--package",
                "oncekv",
                "--package",
                "oncekv-bench",
                "--features",
                ETCD_FEATURE,
            ],
            with_protoc,
        )],
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let verify = task.as_deref() == Some("verify");
    if verify {
        // This run's skips only.
        if let Err(error) = std::fs::remove_file(&skip_log)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("==> could not clear {}: {error}", skip_log.display());
            return ExitCode::FAILURE;
        }
    }
    for (name, args, envs) in steps {
        eprintln!("==> {name}: cargo {}", args.join(" "));
        let mut command = Command::new(&cargo);
        command.args(*args).envs(envs.iter().copied());
        if std::env::var_os("CI").is_some() {
            // One clean build: incremental state would only take disk.
            command.env("CARGO_INCREMENTAL", "0");
        }
        let status = command.status();
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("==> {name} failed ({status})");
                if verify {
                    print_skips(&skip_log);
                }
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("==> {name}: could not run cargo: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if verify {
        // The Python client's tests, against the binary the tests built.
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../clients/python/run-tests.sh"
        );
        eprintln!("==> python client: {script}");
        match Command::new(script).status() {
            Ok(status) if status.success() => {}
            Ok(status) => {
                eprintln!("==> python client failed ({status})");
                print_skips(&skip_log);
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("==> python client: could not run {script}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if task.as_deref() == Some("build-bench") {
        eprintln!(
            "==> built target/release/oncekv and target/release/oncekv-bench (with --target etcd)"
        );
        return ExitCode::SUCCESS;
    }
    if verify {
        print_skips(&skip_log);
    }
    eprintln!("==> all steps passed");
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::skip_summary;
    use std::path::Path;

    #[test]
    fn skips_are_summarised_one_per_line() {
        let log = Path::new("/t/oncekv-skipped.txt");
        assert_eq!(skip_summary(log, ""), None);
        assert_eq!(skip_summary(log, "\n \n"), None);
        let summary = skip_summary(log, "skipped: a::b: needs x\nskipped: c::d: needs y\n")
            .expect("a summary");
        assert_eq!(
            summary,
            "==> 2 tests skipped for a missing dependency (with CI=true these fail; \
             /t/oncekv-skipped.txt):\n    skipped: a::b: needs x\n    skipped: c::d: needs y\n"
        );
    }
}
