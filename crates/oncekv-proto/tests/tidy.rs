//! The wire contract's constants are defined once, here: no other crate's
//! code spells the metadata names (overloaded, idempotency key, the
//! authorization header and its bearer prefix, the peer token, the
//! marks of a forwarded etcd call) or the batch limit itself, so a
//! change to the contract cannot leave a stale copy behind.

use std::path::{Path, PathBuf};

/// The spellings only `oncekv-proto` may hold, and the constant to use.
const DEFINED_HERE: &[(&str, &str)] = &[
    ("\"oncekv-overloaded\"", "oncekv_proto::OVERLOADED_METADATA"),
    (
        "\"oncekv-idempotency-key\"",
        "oncekv_proto::IDEMPOTENCY_KEY_METADATA",
    ),
    ("\"authorization\"", "oncekv_proto::AUTHORIZATION_METADATA"),
    ("\"Bearer ", "oncekv_proto::BEARER"),
    ("\"oncekv-peer-token\"", "oncekv_proto::PEER_TOKEN_METADATA"),
    (
        "\"oncekv-forwarded-by\"",
        "oncekv_proto::FORWARDED_BY_METADATA",
    ),
    (
        "\"oncekv-forwarded-for\"",
        "oncekv_proto::FORWARDED_FOR_METADATA",
    ),
    (
        "\"oncekv-forwarded-certificate-user-bin\"",
        "oncekv_proto::FORWARDED_CERTIFICATE_USER_METADATA",
    ),
    (
        "\"oncekv-forwarded-certificate-serial-bin\"",
        "oncekv_proto::FORWARDED_CERTIFICATE_SERIAL_METADATA",
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

/// Where `text` (the file `name`) spells a constant of [`DEFINED_HERE`]
/// in code (comments may name it), with the constant to use instead.
fn copies_in(name: &str, text: &str) -> Vec<String> {
    let mut copies = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for (spelling, constant) in DEFINED_HERE {
            if code.contains(spelling) {
                copies.push(format!("{name}:{}: use {constant}", number + 1));
            }
        }
    }
    copies
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
    let lib = std::fs::read_to_string(own.join("src/lib.rs")).expect("lib.rs");
    for (spelling, constant) in DEFINED_HERE {
        assert!(
            lib.contains(spelling),
            "{constant} is defined in oncekv-proto's lib.rs as {spelling}..."
        );
    }
    let mut copies = Vec::new();
    for file in files.iter().filter(|f| !f.starts_with(own)) {
        let text = std::fs::read_to_string(file).expect("a source file");
        copies.extend(copies_in(&file.display().to_string(), &text));
    }
    assert!(
        copies.is_empty(),
        "wire constants copied:\n{}",
        copies.join("\n")
    );
}

#[test]
fn the_rule_catches_a_copy() {
    let text = "// \"oncekv-peer-token\" in prose is fine\n\
                request.metadata_mut().insert(\"authorization\", value);\n\
                let value = format!(\"Bearer {token}\");\n\
                insert(oncekv_proto::PEER_TOKEN_METADATA, v);\n";
    let copies = copies_in("auth.rs", text);
    assert_eq!(
        copies,
        [
            "auth.rs:2: use oncekv_proto::AUTHORIZATION_METADATA",
            "auth.rs:3: use oncekv_proto::BEARER",
        ]
    );
}
