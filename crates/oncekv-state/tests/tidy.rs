//! Architecture invariant 1, enforced: `oncekv-state` depends only on an
//! allow-list of crates, and its sources use no clock, randomness, I/O,
//! async or hash-ordered collections.

use std::path::Path;

const ALLOWED_DEPENDENCIES: &[&str] = &["serde", "postcard", "thiserror"];

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

#[test]
fn sources_use_no_clock_randomness_io_or_hash_iteration() {
    let mut violations = Vec::new();
    let mut files = 0;
    for entry in std::fs::read_dir(crate_dir().join("src")).expect("src") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|ext| ext != "rs") {
            continue;
        }
        files += 1;
        let text = std::fs::read_to_string(&path).expect("source");
        for (number, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
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
