//! Architecture invariants 1 and 2, enforced: `oncekv-state` depends only
//! on an allow-list of crates, and its sources (every file, submodules
//! included) use no clock, randomness, I/O, async or hash-ordered
//! collections; deduplication is decided only in `StateMachine::apply`:
//! the session table's admission and the key table's lookup are called
//! from `machine.rs` alone, and no other crate calls them.

use std::path::Path;

/// `imbl` gives the ordered maps whose copies share structure (its
/// hash-ordered maps are forbidden below like std's).
const ALLOWED_DEPENDENCIES: &[&str] = &["serde", "postcard", "thiserror", "sha2", "imbl"];

const FORBIDDEN: &[(&str, &str)] = &[
    ("HashMap", "hash-ordered iteration differs between replicas"),
    ("HashSet", "hash-ordered iteration differs between replicas"),
    ("std::time", "the only time is the entry's cluster time"),
    ("Instant", "the only time is the entry's cluster time"),
    ("SystemTime", "the only time is the entry's cluster time"),
    ("rand::", "randomness would diverge replicas"),
    ("getrandom", "randomness would diverge replicas"),
    ("async ", "the state machine is synchronous"),
    (".await", "the state machine is synchronous"),
    ("tokio", "the state machine does no I/O"),
    ("std::fs", "the state machine does no I/O"),
    ("std::net", "the state machine does no I/O"),
    ("std::io", "the state machine does no I/O"),
    ("std::env", "the state machine reads no environment"),
    (
        "std::thread",
        "the state machine runs on the caller's thread",
    ),
    ("println!", "the state machine does no I/O"),
    ("eprintln!", "the state machine does no I/O"),
];

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn depends_only_on_the_allow_list() {
    let manifest = std::fs::read_to_string(crate_dir().join("Cargo.toml")).expect("manifest");
    let mut section = String::new();
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            continue;
        }
        let is_dependency_section = section == "dependencies"
            || (section.starts_with("target.") && section.ends_with(".dependencies"));
        if is_dependency_section && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("").trim();
            found.push(name.to_string());
        }
        assert!(
            !section.starts_with("dependencies."),
            "dependency table [{section}] is not allowed: list dependencies inline"
        );
    }
    let unexpected: Vec<_> = found
        .iter()
        .filter(|name| !ALLOWED_DEPENDENCIES.contains(&name.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "oncekv-state may not depend on {unexpected:?}"
    );
    assert!(
        !found.is_empty(),
        "the manifest scan found no dependencies at all"
    );
}

/// Every `.rs` file under `dir`, submodules included.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("source dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The code of a line, without its comment.
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

/// Calls that decide deduplication: admission of a request on a session
/// and the lookup of an idempotency key.
const DEDUP_DECISIONS: &[&str] = &["sessions.admit(", "keys.lookup(", ".admit(", ".lookup("];

#[test]
fn deduplication_is_decided_only_in_apply() {
    let mut outside = Vec::new();
    for path in rust_files(&crate_dir().join("src")) {
        if path.ends_with("machine.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).expect("source");
        for (number, line) in text.lines().enumerate() {
            if DEDUP_DECISIONS.iter().any(|call| code(line).contains(call)) {
                outside.push(format!("{}:{}", path.display(), number + 1));
            }
        }
    }
    // The other crates only ever hand entries to `apply`.
    let crates = crate_dir().parent().expect("crates dir");
    let mut scanned = 0;
    for entry in std::fs::read_dir(crates).expect("crates") {
        let other = entry.expect("entry").path();
        if other == crate_dir() || !other.join("src").is_dir() {
            continue;
        }
        for path in rust_files(&other.join("src")) {
            scanned += 1;
            let text = std::fs::read_to_string(&path).expect("source");
            for (number, line) in text.lines().enumerate() {
                let code = code(line);
                // The tables by type name (an `Overload::IdempotencyKeys`
                // variant is not the table), or their deciding calls.
                let names_a_table = ["SessionTable", "IdempotencyKeys"].iter().any(|table| {
                    code.match_indices(table)
                        .any(|(at, _)| !code[..at].ends_with("::"))
                });
                if names_a_table
                    || [".admit(", "keys.lookup("]
                        .iter()
                        .any(|call| code.contains(call))
                {
                    outside.push(format!("{}:{}", path.display(), number + 1));
                }
            }
        }
    }
    assert!(
        scanned >= 20,
        "expected the other crates' sources, found {scanned} files"
    );
    assert!(
        outside.is_empty(),
        "deduplication decided outside StateMachine::apply:\n{}",
        outside.join("\n")
    );
}

#[test]
fn sources_use_no_clock_randomness_io_or_hash_iteration() {
    let mut violations = Vec::new();
    let mut files = 0;
    for path in rust_files(&crate_dir().join("src")) {
        files += 1;
        let text = std::fs::read_to_string(&path).expect("source");
        for (number, line) in text.lines().enumerate() {
            let code = code(line);
            for (token, why) in FORBIDDEN {
                if code.contains(token) {
                    violations.push(format!(
                        "{}:{}: `{token}`: {why}",
                        path.display(),
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        files >= 5,
        "expected the crate's sources, found {files} files"
    );
    assert!(
        violations.is_empty(),
        "forbidden in oncekv-state:\n{}",
        violations.join("\n")
    );
}
