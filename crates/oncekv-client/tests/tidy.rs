//! The rules the client's module docs state, enforced: a call's wire
//! `Failure` is read in one function, `retry::call_failed` ("the one place
//! the client reads it"), so every call, the watcher's included, takes the
//! same answer for "not the leader", "shed", "refused" and "maybe
//! applied".

use std::path::{Path, PathBuf};

/// The one function that maps a wire `Failure`, and its file.
const MAPPING_FILE: &str = "retry.rs";
const MAPPING_FUNCTION: &str = "fn call_failed";

/// What reading a wire `Failure` spells: decoding it, naming what it
/// decodes to, or matching its raw kind.
const READS_A_FAILURE: &[&str] = &["failure_from_wire", "CallFailure", "failure::Kind"];

/// Every `.rs` file under `dir`, submodules included.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Where `source` (the file `name`) reads a wire `Failure` outside the
/// mapping function. Imports name it without reading it, and comments may
/// speak of it.
fn failures_read_elsewhere(name: &str, source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut function = "";
    for (number, line) in source.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("").trim();
        if let Some(at) = code.find("fn ") {
            function = &code[at..];
        }
        if code.starts_with("use ") || code.starts_with("pub use ") {
            continue;
        }
        let in_mapping =
            name.ends_with(MAPPING_FILE) && function.starts_with(&format!("{MAPPING_FUNCTION}<"));
        if !in_mapping
            && READS_A_FAILURE
                .iter()
                .any(|spelling| code.contains(spelling))
        {
            found.push(format!("{name}:{}: {code}", number + 1));
        }
    }
    found
}

#[test]
fn a_wire_failure_is_mapped_in_one_function() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = rust_files(&src);
    assert!(files.len() > 5, "the scan finds the client's sources");
    let mut found = Vec::new();
    let mut mapped = 0;
    for file in &files {
        let source = std::fs::read_to_string(file).expect("read a source file");
        let name = file.display().to_string();
        found.extend(failures_read_elsewhere(&name, &source));
        if name.ends_with(MAPPING_FILE) {
            mapped = source.matches("failure_from_wire(").count();
        }
    }
    assert_eq!(mapped, 1, "retry::call_failed decodes the failure once");
    assert!(
        found.is_empty(),
        "a wire Failure is read outside retry::call_failed (call it, and match \
         the Attempt it gives):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_catches_a_second_mapping() {
    let retry = "use oncekv_proto::convert::{self, CallFailure};\n\
                 pub(crate) fn call_failed<T>(failure: v1::Failure) -> Attempt<T> {\n\
                 \x20   match convert::failure_from_wire(failure) {\n\
                 \x20       Ok(CallFailure::Invalid(reason)) => todo!(),\n\
                 \x20   }\n\
                 }\n\
                 fn other() {\n\
                 \x20   let _ = convert::failure_from_wire(f);\n\
                 }\n";
    let found = failures_read_elsewhere("src/retry.rs", retry);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("src/retry.rs:8:"), "{found:?}");

    let watch = "// prose about CallFailure is fine\n\
                 fn take() {\n\
                 \x20   match convert::failure_from_wire(failure) {\n\
                 \x20       Ok(convert::CallFailure::PermissionDenied(r)) => {}\n\
                 \x20   }\n\
                 }\n";
    let found = failures_read_elsewhere("src/watch.rs", watch);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[0].starts_with("src/watch.rs:3:"), "{found:?}");
}
