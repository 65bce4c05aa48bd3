//! Host files, read and written by one set of rules that every command follows:
//! * only regular files are read ([`open_regular`]): a FIFO with no writer would hang a reader
//!   forever, and a device such as `/dev/zero` never ends;
//! * a RON file parses with one error form ([`read_ron`], [`RonError`]);
//! * every read is bounded: a whole file by a cap ([`read_capped`]), a JSONL file line by line
//!   with a cap on each line ([`JsonLines`]), so memory never depends on what a file claims;
//! * an output directory has one writer at a time ([`DirLock`]): two processes appending to
//!   one `records.jsonl` would each record every trial.

use crate::budget::human_bytes;
use crate::error::one_line;
use serde::de::DeserializeOwned;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Cap on text files (hardware configs, models, campaign specs, `campaign.json`, checkpoint
/// manifests, SCALE-Sim files): 16 MiB, hundreds of times the largest real one.
pub const TEXT_FILE_LIMIT: u64 = 16 << 20;

/// Cap on one line of a JSONL file (a trial record, a timing line, a trace step): 4 MiB, far
/// above the longest real one (a record's loss curve over a long follow-up window is ~100 KB).
pub const JSONL_LINE_LIMIT: u64 = 4 << 20;

/// What a path that is not a regular file is, in words (`a FIFO`, `a directory`, ...).
fn kind_of(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// The error for a path that is `what` where a regular file was expected.
fn not_regular(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{what}, not a regular file"))
}

/// Refuses `path` (following links) unless it is a regular file, without opening it.
pub fn check_regular(path: &Path) -> std::io::Result<()> {
    let t = std::fs::metadata(path)?.file_type();
    if t.is_file() {
        Ok(())
    } else {
        Err(not_regular(kind_of(t)))
    }
}

/// Opens `path` for reading if it is a regular file (following links). The open itself does
/// not block (a FIFO with no writer is refused, not waited on), and the file is checked again
/// once open, so a path swapped between the two checks is still refused.
pub fn open_regular(path: &Path) -> std::io::Result<File> {
    check_regular(path)?;
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // No effect on reads of a regular file; keeps `open` of a FIFO from waiting.
        o.custom_flags(libc::O_NONBLOCK);
    }
    let f = o.open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        return Err(not_regular(kind_of(t)));
    }
    Ok(f)
}

/// Reads at most `limit` bytes of the regular file `path`; a longer file is an `InvalidData`
/// error saying so, after reading `limit + 1` bytes at most.
pub fn read_capped(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    let f = open_regular(path)?;
    let mut buf = Vec::new();
    f.take(limit.saturating_add(1)).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("file is larger than {}, the limit for this kind of file", human_bytes(limit)),
        ));
    }
    Ok(buf)
}

/// [`read_capped`] for UTF-8 text.
pub fn read_text_capped(path: &Path, limit: u64) -> std::io::Result<String> {
    String::from_utf8(read_capped(path, limit)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not UTF-8 text ({e})")))
}

/// A RON file (hardware config, model, campaign, protection plan, exploration) that does not
/// parse: a syntax error, an unknown or missing field, a wrong type. Each crate's error wraps
/// this one, so every RON file reports `file:line:col: message` alike, on one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}:{line}:{col}: {}", one_line(&file.display().to_string()), one_line(message))]
pub struct RonError {
    /// The file (or `<inline>`).
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub col: usize,
    /// What the parser said.
    pub message: String,
}

/// Parses RON text; `file` names it in errors. An optional field takes its value bare
/// (`stride: 2`) as well as `Some(2)`.
pub fn parse_ron<T: DeserializeOwned>(text: &str, file: &Path) -> Result<T, RonError> {
    let options = ron::Options::default().with_default_extension(ron::extensions::Extensions::IMPLICIT_SOME);
    options.from_str(text).map_err(|e| RonError {
        file: file.to_path_buf(),
        line: e.span.start.line,
        col: e.span.start.col,
        message: e.code.to_string(),
    })
}

/// Reads a RON file by the rules above (a regular file, at most [`TEXT_FILE_LIMIT`] bytes of
/// UTF-8) and parses it ([`parse_ron`]); `io` makes the caller's error of a read error.
pub fn read_ron<T: DeserializeOwned, E: From<RonError>>(
    path: &Path,
    io: impl FnOnce(std::io::Error) -> E,
) -> Result<T, E> {
    let text = read_text_capped(path, TEXT_FILE_LIMIT).map_err(io)?;
    Ok(parse_ron(&text, path)?)
}

/// A JSONL file read line by line, each line at most [`JSONL_LINE_LIMIT`] bytes: memory stays
/// bounded whatever the file holds, and a reader streams millions of records.
pub struct JsonLines {
    reader: BufReader<File>,
    /// Lines returned so far (the last one's 1-based number).
    pub line: u64,
    /// Bytes consumed so far.
    pub bytes: u64,
    /// The file's size when opened.
    pub total: u64,
    buf: Vec<u8>,
}

/// One line of a [`JsonLines`] file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    /// Its 1-based number.
    pub number: u64,
    /// Bytes of the file up to its end (newline included).
    pub end: u64,
    /// The line, without its newline.
    pub text: &'a str,
    /// Whether it ended in a newline: the last line of a file being appended to (or of a run
    /// killed mid-write) may not.
    pub complete: bool,
}

impl JsonLines {
    /// Opens the regular file `path`.
    pub fn open(path: &Path) -> std::io::Result<JsonLines> {
        let f = open_regular(path)?;
        let total = f.metadata()?.len();
        Ok(JsonLines { reader: BufReader::with_capacity(1 << 20, f), line: 0, bytes: 0, total, buf: Vec::new() })
    }

    /// Opens `path`, or `None` if there is no such file.
    pub fn open_if_exists(path: &Path) -> std::io::Result<Option<JsonLines>> {
        match JsonLines::open(path) {
            Ok(l) => Ok(Some(l)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The next line, `None` at the end; an error for a line longer than [`JSONL_LINE_LIMIT`]
    /// or one that is not UTF-8 (naming its number).
    pub fn next_line(&mut self) -> std::io::Result<Option<Line<'_>>> {
        self.buf.clear();
        let n = (&mut self.reader).take(JSONL_LINE_LIMIT + 1).read_until(b'\n', &mut self.buf)?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        self.bytes += n as u64;
        let complete = self.buf.last() == Some(&b'\n');
        if complete {
            self.buf.pop();
        }
        if self.buf.len() as u64 > JSONL_LINE_LIMIT {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {} is longer than {}, the limit for one line", self.line, human_bytes(JSONL_LINE_LIMIT)),
            ));
        }
        let text = std::str::from_utf8(&self.buf).map_err(|e| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, format!("line {} is not UTF-8 text ({e})", self.line))
        })?;
        Ok(Some(Line { number: self.line, end: self.bytes, text, complete }))
    }
}

/// Name of the lock file [`DirLock`] holds in an output directory.
pub const LOCK_FILE: &str = ".faultline.lock";

/// An exclusive lock on an output directory, held while this value lives. The lock is the
/// operating system's lock on an open file, so it dies with the process (a `kill -9` leaves no
/// stale lock); the file's text (pid and command) only names the holder in errors.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    /// The locked directory.
    pub dir: PathBuf,
}

impl DirLock {
    /// Creates `dir` (and its parents) if needed and locks it, or fails at once with a
    /// `WouldBlock` error naming the holder if another process has it (callers prefix the
    /// directory, as for any I/O error on it).
    pub fn acquire(dir: &Path) -> std::io::Result<DirLock> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(LOCK_FILE);
        let mut f = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
        match f.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                // Best effort: the holder wrote its pid and command after locking.
                let _ = (&f).take(4096).read_to_string(&mut holder);
                let holder = holder.trim();
                let holder =
                    if holder.is_empty() { String::new() } else { format!(" ({})", crate::error::one_line(holder)) };
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    format!(
                        "locked by another faultline process{holder}, which writes there; wait for it to end or \
                         choose another output directory"
                    ),
                ));
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
        let args: Vec<String> = std::env::args().collect();
        f.set_len(0)?;
        f.rewind()?;
        writeln!(f, "pid {}: {}", std::process::id(), args.join(" "))?;
        Ok(DirLock { _file: f, dir: dir.to_path_buf() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_are_read() {
        let e = read_capped(Path::new("/dev/zero"), 1000).unwrap_err().to_string();
        assert!(e.contains("a character device, not a regular file"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        assert!(read_capped(dir.path(), 10).unwrap_err().to_string().contains("a directory"));
        #[cfg(unix)]
        {
            let fifo = dir.path().join("fifo");
            let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            // No writer: a blocking open would never return.
            let e = read_capped(&fifo, 10).unwrap_err().to_string();
            assert!(e.contains("a FIFO"), "{e}");
            let link = dir.path().join("zero");
            std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
            assert!(JsonLines::open(&link).err().unwrap().to_string().contains("character device"));
        }
    }

    #[test]
    fn reads_are_capped() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert_eq!(read_capped(&p, 2).unwrap(), [0xff, 0xfe]);
        assert!(read_capped(&p, 1).unwrap_err().to_string().contains("larger than 1 B"));
        assert!(read_text_capped(&p, 2).unwrap_err().to_string().contains("UTF-8"));
    }

    #[test]
    fn json_lines_are_bounded_and_report_a_cut_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.jsonl");
        std::fs::write(&p, "{\"a\":1}\n\n{\"b\"").unwrap();
        let mut l = JsonLines::open(&p).unwrap();
        assert_eq!(l.next_line().unwrap(), Some(Line { number: 1, end: 8, text: "{\"a\":1}", complete: true }));
        assert_eq!(l.next_line().unwrap(), Some(Line { number: 2, end: 9, text: "", complete: true }));
        assert_eq!(l.next_line().unwrap(), Some(Line { number: 3, end: 13, text: "{\"b\"", complete: false }));
        assert_eq!(l.next_line().unwrap(), None);
        assert_eq!((l.line, l.bytes, l.total), (3, 13, 13));
        let mut long = vec![b'x'; JSONL_LINE_LIMIT as usize + 10];
        long.push(b'\n');
        std::fs::write(&p, &long).unwrap();
        let e = JsonLines::open(&p).unwrap().next_line().unwrap_err().to_string();
        assert!(e.contains("line 1 is longer than 4.0 MiB"), "{e}");
        assert!(JsonLines::open_if_exists(&dir.path().join("none")).unwrap().is_none());
    }

    #[test]
    fn a_directory_has_one_writer_and_the_lock_dies_with_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("a/b");
        let held = DirLock::acquire(&out).unwrap();
        let e = DirLock::acquire(&out).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        let msg = e.to_string();
        assert!(msg.contains("locked by another faultline process (pid "), "{msg}");
        drop(held);
        DirLock::acquire(&out).unwrap();
    }
}
