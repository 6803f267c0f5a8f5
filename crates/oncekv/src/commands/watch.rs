//! `oncekv watch`: prints every change to a key (or under a prefix) as it
//! happens, from a start revision if given, one line (or one JSON object)
//! per change, resuming across node failures without losing or repeating
//! one.

use super::output::{Printer, text};
use super::*;
use oncekv_client::{EventKind, WatchOptions, WatchUpdate};

/// What `oncekv watch` was asked.
pub(super) struct WatchArgs {
    pub(super) key: String,
    pub(super) prefix: bool,
    pub(super) rev: u64,
    pub(super) prev: bool,
    pub(super) count: Option<u64>,
    pub(super) progress: bool,
}

/// Runs the watch until `count` changes were printed (or forever).
pub(super) async fn watch(client: &Client, printer: &Printer, args: WatchArgs) -> ExitCode {
    let mut options = WatchOptions::default().from_revision(args.rev);
    if args.prefix {
        options = options.with_prefix();
    }
    if args.prev {
        options = options.with_previous();
    }
    let mut watcher = client.watch(args.key.into_bytes(), options);
    let mut printed = 0u64;
    loop {
        if args.count.is_some_and(|count| printed >= count) {
            return ExitCode::from(EXIT_OK);
        }
        let update = match watcher.next().await {
            Ok(update) => update,
            Err(error) => return printer.error(&error),
        };
        match update {
            WatchUpdate::Changes { events, .. } => {
                for event in events {
                    let kind = match event.kind {
                        EventKind::Put => "PUT",
                        EventKind::Delete => "DELETE",
                    };
                    let mut fields = Map::new();
                    fields.insert("revision".into(), json!(event.revision));
                    fields.insert("type".into(), json!(kind.to_lowercase()));
                    fields.insert("key".into(), json!(text(&event.key)));
                    let mut human = format!("{} {kind} {}", event.revision, text(&event.key));
                    if event.kind == EventKind::Put {
                        fields.insert("value".into(), json!(text(&event.value)));
                        fields.insert("create_revision".into(), json!(event.meta.create_revision));
                        fields.insert("mod_revision".into(), json!(event.meta.mod_revision));
                        fields.insert("version".into(), json!(event.meta.version));
                        human.push(' ');
                        human.push_str(&text(&event.value));
                    }
                    if let Some(previous) = &event.previous {
                        fields.insert("previous".into(), json!(text(previous)));
                        human.push_str(&format!(" (was {})", text(previous)));
                    }
                    printer.emit(fields, human);
                    printed += 1;
                }
            }
            WatchUpdate::Progress(revision) if args.progress => {
                let mut fields = Map::new();
                fields.insert("progress".into(), json!(revision));
                printer.emit(fields, format!("{revision} PROGRESS"));
            }
            WatchUpdate::Progress(_) => {}
        }
    }
}
