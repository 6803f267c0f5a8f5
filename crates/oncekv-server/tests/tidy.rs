//! The rules the server's module docs state, enforced:
//!
//! - openraft is named only under `src/raft/` (`raft/mod.rs`: "the only
//!   module that names openraft"), so the rest of the server speaks of
//!   consensus through `Consensus` and the seeding and storage functions
//!   `raft` exports;
//! - a gRPC `Status` is built only in the places `grpc/mod.rs` names: the
//!   client API (`grpc/`), the refusals before any handler
//!   (`transport.rs`) and the peer API (`raft/peer_service.rs`,
//!   `raft/peer_token.rs`);
//! - the modules are layered as `lib.rs` lists them, each using only
//!   modules of the layers below its own (so there is no cycle).

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

/// Where a `tonic::Status` may be built (`grpc/mod.rs` names them): a
/// directory ends in `/`.
const STATUS_PLACES: &[&str] = &[
    "grpc/",
    "transport.rs",
    "raft/peer_service.rs",
    "raft/peer_token.rs",
];

/// The code of a line, without a trailing comment.
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Whether `line` builds a `Status`: calls one of its associated
/// functions (`Status::new(`, `Status::internal(`, `Status::from(`,
/// `Status::with_details(`, ..., with or without `tonic::`) or implements
/// a conversion into it (`impl From<...> for Status`).
fn builds_status(line: &str) -> bool {
    let line = code(line);
    let called = line.match_indices("Status::").any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = &line[at + "Status::".len()..];
        let name: String = after.chars().take_while(|&c| is_ident_char(c)).collect();
        !before.is_some_and(is_ident_char)
            && name.starts_with(|c: char| c.is_ascii_lowercase())
            && after[name.len()..].starts_with('(')
    });
    let converted = ["for Status", "for tonic::Status"].iter().any(|impl_for| {
        line.match_indices(impl_for)
            .any(|(at, found)| !line[at + found.len()..].starts_with(is_ident_char))
    });
    called || converted
}

/// Where code outside [`STATUS_PLACES`] builds a `Status`.
fn status_built_elsewhere(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(src) {
        let relative = file.strip_prefix(src).expect("under src");
        let relative = relative.to_string_lossy().replace('\\', "/");
        if STATUS_PLACES
            .iter()
            .any(|place| match place.strip_suffix('/') {
                Some(dir) => relative.starts_with(&format!("{dir}/")),
                None => relative == *place,
            })
        {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read a source file");
        for (number, line) in code_lines(&source) {
            if builds_status(line) {
                found.push(format!("{}:{number}: {}", file.display(), line.trim()));
            }
        }
    }
    found
}

#[test]
fn statuses_are_built_only_where_grpc_mod_names() {
    let src = src_dir();
    let grpc = std::fs::read_to_string(src.join("grpc/mod.rs")).expect("grpc/mod.rs");
    for place in STATUS_PLACES {
        assert!(
            grpc.contains(&format!("`{place}`")),
            "grpc/mod.rs's doc names `{place}` as a place that builds Status"
        );
        assert!(src.join(place).exists(), "{place} exists");
    }
    let found = status_built_elsewhere(&src);
    assert!(
        found.is_empty(),
        "a gRPC Status is built outside the places grpc/mod.rs names ({}): \
         map to it there, or name the place in grpc/mod.rs, ARCHITECTURE.md and \
         STATUS_PLACES:\n{}",
        STATUS_PLACES.join(", "),
        found.join("\n")
    );
}

#[test]
fn the_rule_catches_a_status_built_elsewhere() {
    for line in [
        "Err(Status::internal(\"x\"))",
        "tonic::Status::new(Code::Unknown, text)",
        "Status::with_details(code, m, d)",
        "impl From<Oops> for tonic::Status {",
        "impl From<Oops> for Status {",
    ] {
        assert!(builds_status(line), "{line}");
    }
    for line in [
        "fn f() -> Result<(), tonic::Status>",
        "ServingStatus::Serving",
        "// Status::internal(\"prose\")",
        "impl From<Oops> for StatusCode {",
        "RaftStatus::of(x)",
    ] {
        assert!(!builds_status(line), "{line}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("grpc")).expect("grpc dir");
    std::fs::create_dir_all(src.join("raft")).expect("raft dir");
    let build = "fn f() -> Status { Status::internal(\"x\") }\n";
    std::fs::write(src.join("grpc/kv.rs"), build).expect("write");
    std::fs::write(src.join("transport.rs"), build).expect("write");
    std::fs::write(src.join("raft/peer_service.rs"), build).expect("write");
    std::fs::write(src.join("raft/network.rs"), format!("//! doc\n{build}")).expect("write");
    let found = status_built_elsewhere(src);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("network.rs:2"), "{found:?}");
}

/// The layers `lib.rs`'s doc lists, lowest first: each numbered item
/// (`//! 1. `, `//! 2. `, ...) names its modules in backticks.
fn layers(lib: &str) -> Vec<Vec<String>> {
    let mut layers = Vec::new();
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            continue;
        };
        let doc = doc.trim_start();
        let Some((number, rest)) = doc.split_once(". ") else {
            continue;
        };
        if number.is_empty() || !number.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let names = rest
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|name| {
                !name.is_empty()
                    && name
                        .split("::")
                        .all(|part| !part.is_empty() && part.chars().all(is_ident_char))
            })
            .map(str::to_string)
            .collect();
        layers.push(names);
    }
    layers
}

/// The module path of a file under `src` (`raft/segment_log/mod.rs`:
/// `["raft", "segment_log"]`); `lib.rs` is the crate root, `[]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).expect("under src");
    let mut path: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = path.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        path.push(stem.to_string());
    }
    path
}

/// The layered module a module path lies in: the longest prefix of it
/// that a layer lists (`raft::consensus::tests`: `raft::consensus`).
fn unit_of(path: &[String], listed: &[String]) -> Option<String> {
    (1..=path.len())
        .rev()
        .map(|length| path[..length].join("::"))
        .find(|prefix| listed.contains(prefix))
}

/// The module paths `code` names through `crate::` or `super::` (seen
/// from `module`), each as far as plain names go (`crate::a::{b, c::D}`:
/// `a::b` and `a::c::D`).
fn named_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    for (root, base) in [("crate::", Vec::new()), ("super::", module.to_vec())] {
        for (at, _) in code.match_indices(root) {
            if code[..at].chars().next_back().is_some_and(is_ident_char) {
                continue;
            }
            let mut base = base.clone();
            let mut rest = &code[at + root.len()..];
            if root == "super::" {
                base.pop();
                // `super::super::...`
                while let Some(more) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = more;
                }
            }
            expand(rest, base, &mut paths);
        }
    }
    paths
}

/// Follows one path from `rest`, `path` named so far, into `paths`.
fn expand(rest: &str, mut path: Vec<String>, paths: &mut Vec<Vec<String>>) {
    let mut rest = rest;
    loop {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (index, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        expand(group[start..index].trim_start(), path.clone(), paths);
                        start = index + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let name: String = rest.chars().take_while(|&c| is_ident_char(c)).collect();
        if name.is_empty() {
            break;
        }
        path.push(name.clone());
        rest = &rest[name.len()..];
        match rest.strip_prefix("::") {
            Some(more) => rest = more,
            None => break,
        }
    }
    if !path.is_empty() {
        paths.push(path);
    }
}

/// Every use of a module of the same or a higher layer, as
/// `file:line: user (layer n) uses used (layer m)`, and every module no
/// layer lists; or why `lib.rs` lists no layers.
fn layer_violations(src: &Path) -> Result<Vec<String>, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).map_err(|e| e.to_string())?;
    let layers = layers(&lib);
    if layers.len() < 2 {
        return Err("lib.rs's doc lists no layers (`//! 1. `...`)".to_string());
    }
    let layer_of = |unit: &str| {
        layers
            .iter()
            .position(|layer| layer.iter().any(|m| m == unit))
    };
    let listed: Vec<String> = layers.iter().flatten().cloned().collect();
    let mut found = Vec::new();
    for file in rust_files(src) {
        let module = module_path(src, &file);
        let source = std::fs::read_to_string(&file).expect("read a source file");
        let user = unit_of(&module, &listed);
        let user_layer = user.as_deref().and_then(layer_of);
        for (number, line) in code_lines(&source) {
            for path in named_paths(code(line), &module) {
                let Some(used) = unit_of(&path, &listed) else {
                    continue;
                };
                if user.as_ref() == Some(&used) {
                    continue;
                }
                let used_layer = layer_of(&used).expect("a listed module");
                match (&user, user_layer) {
                    (Some(user), Some(user_layer)) if used_layer < user_layer => {}
                    (Some(user), Some(user_layer)) => found.push(format!(
                        "{}:{number}: `{user}` (layer {}) uses `{used}` (layer {}): {}",
                        file.display(),
                        user_layer + 1,
                        used_layer + 1,
                        line.trim()
                    )),
                    _ => found.push(format!(
                        "{}:{number}: a module no layer lists ({}) uses `{used}`: {}",
                        file.display(),
                        module.join("::"),
                        line.trim()
                    )),
                }
            }
        }
        if user.is_none() && !module.is_empty() && !is_declarations_only(&source) {
            found.push(format!(
                "{}: module `{}` is in no layer of lib.rs's list",
                file.display(),
                module.join("::")
            ));
        }
    }
    Ok(found)
}

/// Whether a file only declares submodules (`raft/mod.rs`): it needs no
/// layer of its own.
fn is_declarations_only(source: &str) -> bool {
    code_lines(source).all(|(_, line)| {
        let line = line.trim();
        line.is_empty() || line.starts_with("pub mod ") || line.starts_with("mod ")
    })
}

#[test]
fn modules_use_only_lower_layers() {
    let src = src_dir();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let listed: Vec<String> = layers(&lib).into_iter().flatten().collect();
    for module in ["sync", "raft::type_config", "node", "server"] {
        assert!(listed.iter().any(|m| m == module), "lib.rs lists {module}");
    }
    let found = layer_violations(&src).expect("lib.rs lists layers");
    assert!(
        found.is_empty(),
        "modules use modules of their own or a higher layer, or are in no layer \
         (move the shared item down, or change the layers in lib.rs's doc):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_rule_catches_a_use_of_a_higher_layer() {
    let module = vec!["raft".to_string(), "consensus".to_string()];
    assert_eq!(
        named_paths("use super::type_config::{Applied, NodeId};", &module),
        vec![
            vec!["raft", "type_config", "Applied"],
            vec!["raft", "type_config", "NodeId"],
        ]
    );
    assert_eq!(
        named_paths(
            "let x = crate::watch::Visit::new(crate::sync::lock(&a));",
            &module
        ),
        vec![vec!["watch", "Visit", "new"], vec!["sync", "lock"]]
    );
    assert!(named_paths("use oncekv_state::crate_like::x;", &module).is_empty());

    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("raft")).expect("raft dir");
    let lib = "//! Layers:\n//!\n//! 1. `base`\n//! 2. `raft::low`, `other`\n\
               //! 3. `raft::high`\n//! 4. `top`\n\n\
               pub mod base;\npub mod other;\npub mod raft;\npub mod top;\n";
    std::fs::write(src.join("lib.rs"), lib).expect("write");
    std::fs::write(
        src.join("raft/mod.rs"),
        "//! decl\npub mod high;\npub mod low;\n",
    )
    .expect("write");
    std::fs::write(src.join("base.rs"), "//! uses nothing\n").expect("write");
    std::fs::write(src.join("raft/low.rs"), "use crate::base::X;\n").expect("write");
    // A use within one layer.
    std::fs::write(src.join("other.rs"), "use crate::raft::low::Y;\n").expect("write");
    // A use of a higher layer.
    std::fs::write(
        src.join("raft/high.rs"),
        "use super::low::Y;\nfn f() { crate::top::g(); }\n",
    )
    .expect("write");
    std::fs::write(
        src.join("top.rs"),
        "use crate::raft::{high::H, low::L};\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    )
    .expect("write");
    // A module no layer lists.
    std::fs::write(src.join("stray.rs"), "use crate::base::X;\n").expect("write");
    let found = layer_violations(src).expect("layers");
    assert_eq!(found.len(), 4, "{found:#?}");
    assert!(
        found[0].contains("other.rs:1: `other` (layer 2) uses `raft::low` (layer 2)"),
        "{found:#?}"
    );
    assert!(
        found[1].contains("high.rs:2: `raft::high` (layer 3) uses `top` (layer 4)"),
        "{found:#?}"
    );
    assert!(
        found[2].contains("stray.rs:1: a module no layer lists"),
        "{found:#?}"
    );
    assert!(
        found[3].contains("module `stray` is in no layer"),
        "{found:#?}"
    );
}
