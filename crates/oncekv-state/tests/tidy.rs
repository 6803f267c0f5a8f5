//! Architecture invariants 1 and 2, enforced: `oncekv-state` depends only
//! on an allow-list of crates, and its sources (every file, submodules
//! included) use no clock, randomness, I/O, async or hash-ordered
//! collections; deduplication is decided only in `StateMachine::apply`:
//! the session table's admission and the key table's lookup are called
//! from its admission module (`machine/admission.rs`) alone, and no other
//! crate calls them. And the modules are layered as `lib.rs`'s doc lists
//! them, each importing only modules of the layers below its own.

use std::path::Path;

/// `imbl` gives the ordered maps whose copies share structure (its
/// hash-ordered maps are forbidden below like std's); `serde_bytes` has
/// serde read and write a value as one byte string rather than byte by
/// byte (the same bytes in postcard); `crc32fast` checksums a snapshot's
/// body.
const ALLOWED_DEPENDENCIES: &[&str] = &[
    "serde",
    "postcard",
    "thiserror",
    "sha2",
    "imbl",
    "serde_bytes",
    "crc32fast",
];

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

/// The files that may name `std::io`: a snapshot is written to a
/// `std::io::Write` and read from a `std::io::Read` its caller gives (and
/// opens); the crate itself still opens no file and no socket.
const IO_TRAITS_ALLOWED: &[&str] = &["snapshot.rs", "stream.rs"];

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

/// The one module that decides deduplication: `StateMachine::apply`'s
/// admission of a request.
const ADMISSION: &str = "machine/admission.rs";

#[test]
fn deduplication_is_decided_only_in_admission() {
    let admission = std::fs::read_to_string(crate_dir().join("src").join(ADMISSION))
        .expect("the admission module");
    for call in ["sessions.admit(", "keys.lookup("] {
        assert!(
            admission.lines().any(|line| code(line).contains(call)),
            "{ADMISSION} no longer calls `{call}`: update ADMISSION to where it moved"
        );
    }
    let mut outside = Vec::new();
    for path in rust_files(&crate_dir().join("src")) {
        if path.ends_with(ADMISSION) {
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
                // The tables by type name, as a whole word (an
                // `Overload::IdempotencyKeys` variant is not the table, nor
                // is `UserIdempotencyKeys`), or their deciding calls.
                let ident = |c: char| c.is_alphanumeric() || c == '_';
                let names_a_table = ["SessionTable", "IdempotencyKeys"].iter().any(|table| {
                    code.match_indices(table).any(|(at, _)| {
                        let (before, after) = (&code[..at], &code[at + table.len()..]);
                        !before.ends_with("::")
                            && !before.ends_with(ident)
                            && !after.starts_with(ident)
                    })
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
        "deduplication decided outside StateMachine::apply's admission ({ADMISSION}):\n{}",
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
                let io_traits = *token == "std::io"
                    && path
                        .file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| IO_TRAITS_ALLOWED.contains(&name));
                if code.contains(token) && !io_traits {
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

/// The layers `lib.rs`'s doc lists, lowest first: each numbered item
/// (`//! 1. `, `//! 2. `, ...) names its modules in backticks.
fn layers(lib: &str) -> Vec<Vec<String>> {
    let mut layers = Vec::new();
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let Some((number, item)) = doc.trim_start().split_once(". ") else {
            continue;
        };
        if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let names = item
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        layers.push(names);
    }
    layers
}

/// The module a file under `src` belongs to: its first path component
/// (`machine/admission.rs`: `machine`); `None` for the crate root.
fn module_of(relative: &str) -> Option<String> {
    let first = relative.split('/').next().unwrap_or(relative);
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_string())
}

/// Every `crate::<name>` a line of code names, by `<name>` (`crate::{`
/// as `{`).
fn crate_paths(code: &str) -> Vec<String> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // Not the tail of a longer name (`my_crate::`); `$crate::` in
            // a macro is this crate too.
            !code[..*at].ends_with(|c: char| c.is_alphanumeric() || c == '_')
        })
        .map(|(at, prefix)| {
            let rest = &code[at + prefix.len()..];
            if rest.starts_with('{') {
                return "{".to_string();
            }
            rest.chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// Every import in `files` (paths relative to `src`, and their text) of
/// a module at the importer's layer or above, as `file:line: ...` with
/// the offending line; every module no layer lists; and every name a
/// layer lists that is no module. Unit tests (from a `#[cfg(test)]` at
/// the start of a line on) are not read: they may drive the whole crate.
fn layer_violations(lib: &str, files: &[(String, String)]) -> Vec<String> {
    let layers = layers(lib);
    let layer_of = |module: &str| {
        layers
            .iter()
            .position(|layer| layer.iter().any(|m| m == module))
    };
    let modules: Vec<String> = files
        .iter()
        .filter_map(|(path, _)| module_of(path))
        .collect();
    let mut found = Vec::new();
    for listed in layers.iter().flatten() {
        if !modules.contains(listed) {
            found.push(format!(
                "lib.rs: layer list names `{listed}`, which is no module"
            ));
        }
    }
    for (path, text) in files {
        let Some(module) = module_of(path) else {
            continue;
        };
        let Some(own) = layer_of(&module) else {
            found.push(format!(
                "{path}: module `{module}` is in no layer of lib.rs's list"
            ));
            continue;
        };
        for (number, line) in text.lines().enumerate() {
            if line.starts_with("#[cfg(test)]") {
                break;
            }
            for name in crate_paths(code(line)) {
                let why = match layer_of(&name) {
                    _ if name == module => continue,
                    Some(used) if used < own => continue,
                    Some(used) => format!(
                        "`{module}` (layer {}) imports `{name}` (layer {})",
                        own + 1,
                        used + 1
                    ),
                    None if name == "{" => format!(
                        "`{module}` imports through `crate::{{...}}`: name one module \
                         per path (`use crate::<module>::...`)"
                    ),
                    None => format!(
                        "`{module}` names `crate::{name}`, which is no layered module: \
                         import it from the module that defines it"
                    ),
                };
                found.push(format!("{path}:{}: {why}: `{}`", number + 1, line.trim()));
            }
        }
    }
    found
}

/// The crate's sources, as paths relative to `src` and their text.
fn sources() -> Vec<(String, String)> {
    let src = crate_dir().join("src");
    rust_files(&src)
        .into_iter()
        .map(|path| {
            let relative = path.strip_prefix(&src).expect("under src");
            let relative = relative
                .iter()
                .map(|part| part.to_string_lossy())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path).expect("source");
            (relative, text)
        })
        .collect()
}

#[test]
fn modules_import_only_lower_layers() {
    let files = sources();
    let lib = &files
        .iter()
        .find(|(path, _)| path == "lib.rs")
        .expect("lib.rs")
        .1;
    let layers = layers(lib);
    assert!(
        layers.len() >= 5,
        "lib.rs's doc lists {} layers (`//! 1. `...), expected the crate's",
        layers.len()
    );
    let found = layer_violations(lib, &files);
    assert!(
        found.is_empty(),
        "modules under src/ import modules of their own or a higher layer, or are in no \
         layer (move the shared item down, or change the layers in lib.rs's doc):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_layer_rule_catches_an_import_at_its_layer_or_above() {
    let lib =
        "//! Layers:\n//!\n//! 1. `low`, `base`\n//! 2. `mid`\n//! 3. `high`\n//! 4. `gone`\n";
    let file = |path: &str, text: &str| (path.to_string(), text.to_string());
    let files = [
        file("lib.rs", lib),
        file("base.rs", ""),
        // Its own layer.
        file("low.rs", "use crate::base::B;\n"),
        // A lower layer, a root re-export, a comment, and a unit test
        // using anything.
        file(
            "mid.rs",
            "use crate::low::L;\nuse crate::Thing;\n// crate::high\n#[cfg(test)]\nuse crate::high::H;\n",
        ),
        // A lower layer in a path, a higher one in a string (a serde
        // attribute names a function).
        file(
            "high.rs",
            "fn f() { crate::mid::g(); }\n#[serde(with = \"crate::gone::x\")]\n",
        ),
        // A submodule: its own module, and braces.
        file(
            "high/sub.rs",
            "use super::X;\nuse crate::high::Y;\nuse crate::{low, mid};\n",
        ),
        // A module no layer lists.
        file("stray.rs", "use crate::low::L;\n"),
    ];
    let found = layer_violations(lib, &files);
    let expected = [
        "lib.rs: layer list names `gone`, which is no module",
        "low.rs:1: `low` (layer 1) imports `base` (layer 1): `use crate::base::B;`",
        "mid.rs:2: `mid` names `crate::Thing`, which is no layered module",
        "high.rs:2: `high` (layer 3) imports `gone` (layer 4)",
        "high/sub.rs:3: `high` imports through `crate::{...}`",
        "stray.rs: module `stray` is in no layer",
    ];
    assert_eq!(found.len(), expected.len(), "{found:#?}");
    for (found, expected) in found.iter().zip(expected) {
        assert!(found.starts_with(expected), "{found:?} is not {expected:?}");
    }
}
