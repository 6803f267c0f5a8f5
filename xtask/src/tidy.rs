//! Rules about the whole tree that no one crate owns, enforced as tests:
//! every document a doc comment names exists in the repository.

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

    /// A fresh directory of this test's own (xtask has no dependencies).
    fn tempfile_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("xtask-tidy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        dir
    }
}
