//! `oncekv completion SHELL` and `oncekv man`: the scripts and pages are
//! generated from the binary's own command line, so they name every
//! subcommand it has; the shells that are installed accept the scripts.

use oncekv_harness::testing::{Dependency, missing_dependency};
use std::path::Path;
use std::process::{Command, Output};

fn oncekv(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_oncekv"))
        .args(args)
        .output()
        .expect("run oncekv")
}

fn stdout_of(args: &[&str]) -> String {
    let output = oncekv(args);
    assert_eq!(
        output.status.code(),
        Some(0),
        "oncekv {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// The subcommands `oncekv --help` lists (`help` aside).
fn top_level_subcommands() -> Vec<String> {
    let help = stdout_of(&["--help"]);
    let listed: Vec<String> = help
        .lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| !line.trim().is_empty())
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect();
    for name in ["serve", "put", "snapshot", "user", "completion", "man"] {
        assert!(
            listed.iter().any(|n| n == name),
            "`oncekv --help` lists {name}: {listed:?}"
        );
    }
    listed
}

/// Whether `program` runs here.
fn installed(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Runs `program args... script` on the script in a file; a failure
/// prints the shell's complaint.
fn shell_accepts(program: &str, args: &[&str], script: &str, dir: &Path) {
    let file = dir.join(format!("oncekv.{program}"));
    std::fs::write(&file, script).expect("write the script");
    let output = Command::new(program)
        .args(args)
        .arg(&file)
        .output()
        .expect("run the shell");
    assert!(
        output.status.success(),
        "{program} {args:?} refuses the script: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn completion_scripts_name_every_subcommand() {
    let subcommands = top_level_subcommands();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let script = stdout_of(&["completion", shell]);
        assert!(!script.trim().is_empty(), "{shell}: an empty script");
        for name in &subcommands {
            assert!(script.contains(name.as_str()), "{shell}: names {name}");
        }
        // Nested subcommands and flags are completed too (fish names a
        // flag without its dashes).
        for word in ["restore", "grant-role", "initial-cluster", "endpoints"] {
            assert!(script.contains(word), "{shell}: names {word}");
        }
    }
}

#[test]
fn every_shell_accepts_its_script() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (shell, check) in [("bash", "-n"), ("zsh", "-n"), ("fish", "--no-execute")] {
        if !installed(shell) {
            missing_dependency(
                "every_shell_accepts_its_script",
                Dependency::Shell(shell),
                &format!("{shell}'s completion script is not checked"),
            );
            continue;
        }
        shell_accepts(
            shell,
            &[check],
            &stdout_of(&["completion", shell]),
            dir.path(),
        );
    }
}

#[test]
fn an_unknown_shell_is_a_usage_error() {
    let output = oncekv(&["completion", "csh"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bash"), "the choices are listed: {stderr}");
}

#[test]
fn the_man_page_names_every_subcommand() {
    let subcommands = top_level_subcommands();
    let page = stdout_of(&["man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH oncekv 1"),
        "{page}"
    );
    assert!(page.contains(".SH NAME"), "{page}");
    for name in &subcommands {
        assert!(
            page.contains(&format!("oncekv\\-{}", name.replace('-', "\\-"))),
            "names {name}"
        );
    }
    // The exit code table of `--help` is in the page too.
    assert!(page.contains("NOSPACE"), "{page}");
}

#[test]
fn man_dir_writes_a_page_per_subcommand() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pages = dir.path().join("man1");
    let listed = stdout_of(&["man", "--dir", pages.to_str().expect("UTF-8")]);
    for name in [
        "oncekv.1",
        "oncekv-serve.1",
        "oncekv-put.1",
        "oncekv-snapshot-restore.1",
        "oncekv-user-add.1",
        "oncekv-completion.1",
    ] {
        let page = pages.join(name);
        assert!(page.is_file(), "{name} written: {listed}");
        assert!(listed.contains(name), "{name} listed: {listed}");
    }
    let serve = std::fs::read_to_string(pages.join("oncekv-serve.1")).expect("read");
    assert!(serve.contains("ONCEKV_INITIAL_CLUSTER"), "{serve}");

    // A directory that cannot be made is an error, not a panic.
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").expect("file");
    let output = oncekv(&["man", "--dir", file.join("man1").to_str().expect("UTF-8")]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("a-file"));
}
