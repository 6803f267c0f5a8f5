//! Architecture invariant, enforced: `oncekv-check` is pure and depends
//! only on serde, serde_json and thiserror. Running nodes, proxies and
//! workloads (tokio, gRPC, processes) belongs to `oncekv-harness`.

use std::path::Path;

const ALLOWED_DEPENDENCIES: &[&str] = &["serde", "serde_json", "thiserror"];

/// The sections whose entries are dependencies of the library (dev
/// dependencies are free).
fn is_dependency_section(section: &str) -> bool {
    let last = section.rsplit('.').next().unwrap_or("");
    let plain = section == "dependencies" || section == "build-dependencies";
    let per_target =
        section.starts_with("target.") && (last == "dependencies" || last == "build-dependencies");
    plain || per_target
}

#[test]
fn depends_only_on_serde_serde_json_and_thiserror() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let manifest = std::fs::read_to_string(manifest).expect("manifest");
    let mut section = String::new();
    let mut found = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.trim_matches(|c| c == '[' || c == ']').to_string();
            // `[dependencies.name]`: a dependency written as a table.
            for prefix in ["dependencies.", "build-dependencies."] {
                if let Some(name) = section.strip_prefix(prefix) {
                    found.push(name.trim().to_string());
                }
            }
            continue;
        }
        if is_dependency_section(&section) && !line.is_empty() && !line.starts_with('#') {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("").trim();
            found.push(name.to_string());
        }
    }
    let unexpected: Vec<_> = found
        .iter()
        .filter(|name| !ALLOWED_DEPENDENCIES.contains(&name.as_str()))
        .collect();
    assert!(
        unexpected.is_empty(),
        "oncekv-check may depend only on {ALLOWED_DEPENDENCIES:?}, not on {unexpected:?} \
         (what runs clusters belongs in oncekv-harness)"
    );
    assert!(
        !found.is_empty(),
        "the manifest scan found no dependencies at all"
    );
}
