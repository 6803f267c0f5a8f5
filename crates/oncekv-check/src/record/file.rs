//! The JSON-lines file of a run: [`RecordWriter`] and [`RecordReader`]
//! (with line numbers on every error), and whole-stream helpers.

use super::*;

/// Writes events as JSON lines. Share it between threads behind a lock.
#[derive(Debug)]
pub struct RecordWriter<W: Write> {
    out: W,
}

impl RecordWriter<BufWriter<File>> {
    /// Creates (or truncates) the file at `path`.
    pub fn create(path: &Path) -> Result<Self, RecordError> {
        let file = File::create(path).map_err(|source| RecordError::File {
            path: path.to_owned(),
            source,
        })?;
        Ok(Self::new(BufWriter::new(file)))
    }
}

impl<W: Write> RecordWriter<W> {
    /// Writes to `out`.
    pub fn new(out: W) -> Self {
        Self { out }
    }

    /// Writes one event as one line.
    pub fn write(&mut self, event: &Event) -> Result<(), RecordError> {
        let mut line = serde_json::to_vec(event).map_err(RecordError::Encode)?;
        line.push(b'\n');
        self.out.write_all(&line)?;
        Ok(())
    }

    /// Flushes buffered lines.
    pub fn flush(&mut self) -> Result<(), RecordError> {
        self.out.flush()?;
        Ok(())
    }

    /// Gives the output back (unflushed lines stay in its buffer).
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// Reads events from JSON lines, skipping blank lines.
#[derive(Debug)]
pub struct RecordReader<R: BufRead> {
    input: R,
    line: usize,
    buffer: String,
}

impl<R: BufRead> RecordReader<R> {
    /// Reads from `input`.
    pub fn new(input: R) -> Self {
        Self {
            input,
            line: 0,
            buffer: String::new(),
        }
    }
}

impl<R: BufRead> Iterator for RecordReader<R> {
    type Item = Result<Event, RecordError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buffer.clear();
            self.line += 1;
            match self.input.read_line(&mut self.buffer) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(err) if err.kind() == io::ErrorKind::InvalidData => {
                    return Some(Err(RecordError::Parse {
                        line: self.line,
                        source: serde_json::Error::io(err),
                    }));
                }
                Err(err) => return Some(Err(RecordError::Io(err))),
            }
            let text = self.buffer.trim();
            if text.is_empty() {
                continue;
            }
            return Some(
                serde_json::from_str(text).map_err(|source| RecordError::Parse {
                    line: self.line,
                    source,
                }),
            );
        }
    }
}

/// Reads every event of a JSON-lines stream.
pub fn read_events(input: impl BufRead) -> Result<Vec<Event>, RecordError> {
    RecordReader::new(input).collect()
}

/// Writes events as JSON lines.
pub fn write_events<'a>(
    out: impl Write,
    events: impl IntoIterator<Item = &'a Event>,
) -> Result<(), RecordError> {
    let mut writer = RecordWriter::new(out);
    for event in events {
        writer.write(event)?;
    }
    writer.flush()
}
