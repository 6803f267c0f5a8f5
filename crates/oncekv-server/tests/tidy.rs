//! The rules the server's module docs state, enforced: openraft is named
//! only under `src/raft/` (`raft/mod.rs`: "the only module that names
//! openraft"), so the rest of the server speaks of consensus through
//! `Consensus` and the seeding and storage functions `raft` exports.

use std::path::{Path, PathBuf};

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

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

/// The code of `source`: every line but comments (prose may name the
/// engine; code may not).
fn code_lines(source: &str) -> impl Iterator<Item = (usize, &str)> {
    source
        .lines()
        .enumerate()
        .filter(|(_, line)| !line.trim_start().starts_with("//"))
        .map(|(number, line)| (number + 1, line))
}

/// Where code outside `raft/` names openraft.
fn openraft_outside_raft(src: &Path) -> Vec<String> {
    let raft = src.join("raft");
    let mut found = Vec::new();
    for file in rust_files(src).iter().filter(|f| !f.starts_with(&raft)) {
        let source = std::fs::read_to_string(file).expect("read a source file");
        for (number, line) in code_lines(&source) {
            if line.contains("openraft") {
                found.push(format!("{}:{number}: {}", file.display(), line.trim()));
            }
        }
    }
    found
}

#[test]
fn openraft_is_named_only_under_raft() {
    let src = src_dir();
    assert!(
        rust_files(&src.join("raft")).len() > 5,
        "the scan finds the raft module's files"
    );
    let found = openraft_outside_raft(&src);
    assert!(
        found.is_empty(),
        "openraft is named outside src/raft/ (move it into the raft module):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_catches_a_use_outside_raft() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("raft")).expect("raft dir");
    std::fs::write(src.join("raft/a.rs"), "use openraft::Raft;\n").expect("write");
    std::fs::write(
        src.join("backup.rs"),
        "//! prose about openraft is fine\nuse openraft::Membership;\n",
    )
    .expect("write");
    let found = openraft_outside_raft(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("backup.rs:2"), "{found:?}");
}
