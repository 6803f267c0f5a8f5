//! Rules about the whole tree that no one crate owns, enforced as tests:
//! every document a doc comment names exists in the repository; a test
//! that cannot run for want of a tool or a privilege says so through
//! `missing_dependency` (which fails under `CI`) rather than passing
//! quietly; `ARCHITECTURE.md` stays a one-page map (no line over
//! `MAP_LINE_CHARS_MAX`, 600, characters).

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace root")
            .to_path_buf()
    }

    /// Every `.rs` file under `dir`, submodules included.
    fn rust_files(dir: &Path) -> Vec<PathBuf> {
        let mut files = Vec::new();
        let mut pending = vec![dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for path in entries.flatten().map(|entry| entry.path()) {
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

    /// The documents (`*.md`) the doc comments of `source` name.
    fn named_documents(source: &str) -> Vec<(usize, String)> {
        let mut named = Vec::new();
        for (number, line) in source.lines().enumerate() {
            let line = line.trim_start();
            if !(line.starts_with("//!") || line.starts_with("///")) {
                continue;
            }
            let words = line.split(|c: char| {
                !(c.is_ascii_alphanumeric() || matches!(c, '.' | '/' | '_' | '-'))
            });
            for word in words {
                let word = word.trim_end_matches('.');
                if word.len() > 3 && word.ends_with(".md") {
                    named.push((number + 1, word.to_string()));
                }
            }
        }
        named
    }

    /// Where `name`, named in `file`, is: relative to the file when it
    /// starts with `..`, else relative to the repository's root.
    fn resolve(root: &Path, file: &Path, name: &str) -> PathBuf {
        if name.starts_with("..") {
            file.parent().expect("a file's directory").join(name)
        } else {
            root.join(name.trim_start_matches('/'))
        }
    }

    fn missing_documents(root: &Path, sources: &[PathBuf]) -> Vec<String> {
        let mut missing = Vec::new();
        for file in sources {
            let source = std::fs::read_to_string(file).expect("read a source file");
            for (number, name) in named_documents(&source) {
                if !resolve(root, file, &name).is_file() {
                    missing.push(format!("{}:{number}: {name}", file.display()));
                }
            }
        }
        missing
    }

    #[test]
    fn every_document_a_doc_comment_names_exists() {
        let root = root();
        let mut sources = rust_files(&root.join("crates"));
        sources.extend(rust_files(&root.join("xtask")));
        assert!(sources.len() > 50, "the scan finds the sources");
        let missing = missing_documents(&root, &sources);
        assert!(
            missing.is_empty(),
            "doc comments name documents the repository does not have:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn the_rule_catches_a_missing_document() {
        let dir = tempfile_dir();
        std::fs::create_dir_all(dir.join("docs")).expect("docs");
        std::fs::write(dir.join("docs/there.md"), "x").expect("write");
        let file = dir.join("a.rs");
        std::fs::write(
            &file,
            "//! See docs/there.md and DESIGN.md.\n/// Also ./docs/there.md\n// gone.md in a comment\n",
        )
        .expect("write");
        let missing = missing_documents(&dir, &[file]);
        assert_eq!(missing.len(), 1, "{missing:?}");
        assert!(missing[0].ends_with(":1: DESIGN.md"), "{missing:?}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// What a test probes its prerequisites with (a tool on the `PATH`, a
    /// process it starts, the environment, its privileges).
    const PREREQUISITE_PROBES: &[&str] = &[
        "on_path(",
        "which(",
        "EtcdProcess::start",
        "env::var",
        "geteuid",
        "is_root",
        "netns::available(",
        "installed(",
        "cfg!(tokio_unstable)",
    ];

    /// Helpers that report a missing prerequisite through
    /// `missing_dependency` themselves (each is checked to).
    const REPORTING_HELPERS: &[&str] = &["have_etcdctl(", "reference(", "namespaces_available("];

    /// How far above a `return` its guard may start.
    const GUARD_LINES: usize = 8;

    /// The early returns in `source` guarded by a prerequisite probe that
    /// neither call `missing_dependency` nor go through a reporting helper.
    fn silent_skips(source: &str) -> Vec<usize> {
        let lines: Vec<&str> = source.lines().collect();
        let mut found = Vec::new();
        for (index, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            // A test's early end, or a part of it skipped: a return of
            // nothing or a `continue` (a helper's `return true` on a found
            // tool is no skip).
            let skips = ["return;", "return }", "return Ok(())", "continue;"]
                .iter()
                .any(|end| code.contains(end));
            if !skips {
                continue;
            }
            let start = index.saturating_sub(GUARD_LINES);
            // The guard: from the nearest `if` or `let` above on.
            let guard_start = (start..=index)
                .rev()
                .find(|&i| {
                    let text = lines[i].trim_start();
                    text.starts_with("if ") || text.starts_with("let ")
                })
                .unwrap_or(index);
            let guard = lines[guard_start..=index].join("\n");
            let probed = PREREQUISITE_PROBES
                .iter()
                .any(|probe| guard.contains(probe));
            let reported = guard.contains("missing_dependency(")
                || REPORTING_HELPERS
                    .iter()
                    .any(|helper| guard.contains(helper));
            if probed && !reported {
                found.push(index + 1);
            }
        }
        found
    }

    /// The reporting helpers defined in `source` that probe a
    /// prerequisite and do not call `missing_dependency`.
    fn silent_helpers(source: &str) -> Vec<String> {
        let lines: Vec<&str> = source.lines().collect();
        let mut found = Vec::new();
        for (index, line) in lines.iter().enumerate() {
            for helper in REPORTING_HELPERS {
                let name = helper.trim_end_matches('(');
                if !line.contains(&format!("fn {name}(")) {
                    continue;
                }
                let body_end = lines[index + 1..]
                    .iter()
                    .position(|line| line.starts_with('}'))
                    .map_or(lines.len(), |end| index + 1 + end);
                let body = lines[index..body_end].join("\n");
                let probes = PREREQUISITE_PROBES.iter().any(|probe| body.contains(probe));
                if probes && !body.contains("missing_dependency(") {
                    found.push(format!("{}:{}", name, index + 1));
                }
            }
        }
        found
    }

    #[test]
    fn no_test_skips_for_a_missing_prerequisite_without_saying_so() {
        let root = root();
        let mut tests = Vec::new();
        for entry in std::fs::read_dir(root.join("crates"))
            .expect("crates")
            .flatten()
        {
            tests.extend(rust_files(&entry.path().join("tests")));
        }
        assert!(tests.len() > 40, "the scan finds the tests");
        let mut silent = Vec::new();
        for file in &tests {
            let source = std::fs::read_to_string(file).expect("read a test file");
            for line in silent_skips(&source) {
                silent.push(format!("{}:{line}", file.display()));
            }
            for helper in silent_helpers(&source) {
                silent.push(format!("{}: helper {helper}", file.display()));
            }
        }
        assert!(
            silent.is_empty(),
            "tests that return early on a missing prerequisite without missing_dependency:\n{}",
            silent.join("\n")
        );
    }

    #[test]
    fn the_rule_catches_a_silent_skip() {
        let quiet = "fn t() {\n    if on_path(\"etcd\").is_none() {\n        return;\n    }\n}\n";
        assert_eq!(silent_skips(quiet), vec![3]);
        let said = "fn t() {\n    if on_path(\"etcd\").is_none() {\n        missing_dependency(T, D, \"x\");\n        return;\n    }\n}\n";
        assert!(silent_skips(said).is_empty());
        let helped = "fn t() {\n    if !have_etcdctl(T) {\n        return;\n    }\n}\n";
        assert!(silent_skips(helped).is_empty());
        // Ordinary control flow is no skip.
        let flow = "fn t() {\n    if files.is_empty() {\n        return;\n    }\n}\n";
        assert!(silent_skips(flow).is_empty());
        let helper =
            "fn have_etcdctl(test: &str) -> bool {\n    on_path(\"etcdctl\").is_some()\n}\n";
        assert_eq!(silent_helpers(helper), vec!["have_etcdctl:1".to_string()]);
    }

    /// The longest line `ARCHITECTURE.md` may have: a map gives a line or
    /// two per crate and module, the details live in the modules' docs.
    pub(super) const MAP_LINE_CHARS_MAX: usize = 600;

    #[test]
    fn architecture_md_stays_a_map() {
        let map = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
        let long: Vec<String> = map
            .lines()
            .enumerate()
            .filter(|(_, line)| line.chars().count() > MAP_LINE_CHARS_MAX)
            .map(|(number, line)| {
                format!("line {}: {} characters", number + 1, line.chars().count())
            })
            .collect();
        assert!(
            long.is_empty(),
            "ARCHITECTURE.md has lines over {MAP_LINE_CHARS_MAX} characters (move the detail into the module's doc):\n{}",
            long.join("\n")
        );
    }

    /// A fresh directory of this test's own (xtask has no dependencies).
    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir
    }
}
