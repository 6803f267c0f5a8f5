//! Project automation: `cargo xtask verify` runs every check CI runs
//! (format, lints, tests, docs, then the Python client's tests);
//! `cargo xtask fix` applies the automatic fixes (format, clippy
//! suggestions); `cargo xtask sim` runs a sweep of
//! seeded simulations (crates/oncekv-sim); `cargo xtask build-bench`
//! builds the release binary with `oncekv bench --target etcd`.
//!
//! The `etcd` feature of `oncekv` compiles etcd's protobuf files, which
//! needs `protoc`: these tasks point `PROTOC` at the binary that ships in
//! the `protoc-bin-vendored` crate, so nothing has to be installed.

use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  verify   check formatting, run clippy with -D warnings, run every test,
           build the docs with warnings denied (what CI runs); with the
           etcd feature of oncekv, and clippy once more without it;
           then the Python client's tests (clients/python/run-tests.sh)
  fix      format the code and apply clippy's automatic fixes
  build-bench
           build target/release/oncekv with the etcd feature
           (oncekv bench --target etcd; used by scripts/bench-vs-etcd.sh)
  sim      run seeded simulations of a cluster under faults, optimised:
           cargo xtask sim --seeds 200 [--first 1]   a sweep
           cargo xtask sim --seed 17                 replay one seed
           (every flag: cargo xtask sim --help)";

/// One cargo invocation: a name for the log, its arguments, extra environment.
type Step<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)]);

/// The feature that CI compiles, lints, tests and documents besides the
/// defaults: `oncekv bench --target etcd`.
const ETCD_FEATURE: &str = "oncekv/etcd";

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
                    "oncekv",
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
                with_protoc,
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
                "--features",
                "etcd",
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
    if task.as_deref() == Some("verify") {
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
                return ExitCode::FAILURE;
            }
            Err(error) => {
                eprintln!("==> python client: could not run {script}: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if task.as_deref() == Some("build-bench") {
        eprintln!("==> built target/release/oncekv (with oncekv bench --target etcd)");
        return ExitCode::SUCCESS;
    }
    eprintln!("==> all steps passed");
    ExitCode::SUCCESS
}
