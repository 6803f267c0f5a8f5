//! The wire contract's constants are defined once, here: no other crate's
//! code spells the overloaded or idempotency-key metadata names or the
//! batch limit itself, so a change to the contract cannot leave a stale
//! copy behind.

use std::path::{Path, PathBuf};

/// The spellings only `oncekv-proto` may hold, and the constant to use.
const DEFINED_HERE: &[(&str, &str)] = &[
    ("\"oncekv-overloaded\"", "oncekv_proto::OVERLOADED_METADATA"),
    (
        "\"oncekv-idempotency-key\"",
        "oncekv_proto::IDEMPOTENCY_KEY_METADATA",
    ),
    (
        "BATCH_REQUESTS_MAX: usize =",
        "oncekv_proto::BATCH_REQUESTS_MAX",
    ),
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn wire_constants_are_defined_once() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crates folder");
    let own = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(crates, &mut files);
    assert!(files.len() > 50, "the workspace's sources were not found");
    let mut copies = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(own)) {
        let text = std::fs::read_to_string(file).expect("a source file");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for (spelling, constant) in DEFINED_HERE {
                if code.contains(spelling) {
                    copies.push(format!("{}:{}: use {constant}", file.display(), number + 1));
                }
            }
        }
    }
    assert!(
        copies.is_empty(),
        "wire constants copied:\n{}",
        copies.join("\n")
    );
}
