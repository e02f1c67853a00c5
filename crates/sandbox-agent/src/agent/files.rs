//! File operations inside the sandbox.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use super::pids::{self, Reserved};
use super::spawn::{Key, Processes};
use super::{Credits, Out};
use crate::protocol::{DATA_CHUNK, ErrorKind, FileStat, Frame, FrameKind, Reply};

fn error(e: &io::Error) -> Reply {
    Reply::Error {
        kind: ErrorKind::of(e),
        message: e.to_string(),
    }
}

/// Streams a file on its own thread, one window of credit at a time.
pub(crate) fn read(id: u32, path: String, credit: (Arc<Credits>, Processes), out: Out) {
    let (credits, procs) = credit;
    let key = Key {
        session: out.session(),
        id,
    };
    let thread = match Reserved::start("read") {
        Ok(t) => t,
        Err(e) => {
            procs.release(key);
            let reply = if pids::exhausted(&e) {
                pids::refused("read")
            } else {
                error(&e)
            };
            let _ = out.send(Frame::control(id, &reply));
            return;
        }
    };
    thread.run(move || {
        let reply = stream_file(id, &path, &credits, &out);
        procs.release(key);
        let _ = out.send(Frame::control(id, &reply));
    });
}

fn stream_file(id: u32, path: &str, credits: &Credits, out: &Out) -> Reply {
    let mut f = match File::open(path) {
        Ok(f) => f,
        Err(e) => return error(&e),
    };
    match f.metadata() {
        Ok(m) if m.is_dir() => {
            return Reply::Error {
                kind: ErrorKind::IsADirectory,
                message: format!("{path} is a directory"),
            };
        }
        Err(e) => return error(&e),
        Ok(_) => {}
    }
    let mut buf = vec![0u8; DATA_CHUNK];
    loop {
        let Some(want) = credits.take(DATA_CHUNK) else {
            return Reply::Done;
        };
        let n = match f.read(&mut buf[..want]) {
            Ok(0) => return Reply::Done,
            Ok(n) => n,
            Err(e) => return error(&e),
        };
        credits.give((want - n) as u32);
        let frame = Frame {
            kind: FrameKind::FileData,
            id,
            body: buf[..n].to_vec(),
        };
        if out.send(frame).is_err() {
            return Reply::Done;
        }
    }
}

/// A file being written: content goes to a temporary next to the target, renamed over it
/// at the end, so a failed or abandoned upload never leaves a half-written file.
pub(crate) struct Upload {
    tmp: std::path::PathBuf,
    target: std::path::PathBuf,
    file: File,
}

impl Upload {
    pub(crate) fn open(path: &str, mode: Option<u32>) -> io::Result<Self> {
        let target = Path::new(path).to_path_buf();
        if target.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                format!("{path} is a directory"),
            ));
        }
        let name = target
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".sbx-upload-{}", std::process::id()));
        let tmp = target.with_file_name(tmp_name);
        let file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode.unwrap_or(0o644) & 0o7777)
            .open(&tmp)?;
        Ok(Upload { tmp, target, file })
    }

    pub(crate) fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.file.write_all(data).inspect_err(|_| {
            let _ = fs::remove_file(&self.tmp);
        })
    }

    /// Gives the upload up (its host is gone): the temporary goes, the target is untouched.
    pub(crate) fn abandon(self) {
        drop(self.file);
        let _ = fs::remove_file(&self.tmp);
    }

    pub(crate) fn finish(self) -> io::Result<()> {
        let r = fs::rename(&self.tmp, &self.target);
        if r.is_err() {
            let _ = fs::remove_file(&self.tmp);
        }
        r
    }
}

fn file_stat(path: &Path, m: &fs::Metadata) -> FileStat {
    FileStat {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "/".into()),
        path: path.to_string_lossy().into_owned(),
        size: m.len(),
        is_dir: m.is_dir(),
        is_symlink: m.file_type().is_symlink(),
        mode: m.mode(),
        modified: m.mtime(),
    }
}

pub(crate) fn stat(path: &str) -> Reply {
    match fs::symlink_metadata(path) {
        Ok(m) => Reply::Stat(file_stat(Path::new(path), &m)),
        Err(e) => error(&e),
    }
}

/// Most entries one listing returns; a directory with more is refused rather than
/// buffered (it would not fit one frame anyway).
const MAX_ENTRIES: usize = 4096;

pub(crate) fn list(path: &str) -> Reply {
    let dir = match fs::read_dir(path) {
        Ok(d) => d,
        Err(e) => return error(&e),
    };
    let mut entries = Vec::new();
    for e in dir {
        let e = match e {
            Ok(e) => e,
            Err(e) => return error(&e),
        };
        if entries.len() == MAX_ENTRIES {
            return Reply::Error {
                kind: ErrorKind::Limit,
                message: format!("more than {MAX_ENTRIES} entries"),
            };
        }
        if let Ok(m) = e.metadata() {
            entries.push(file_stat(&e.path(), &m));
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Reply::List { entries }
}

pub(crate) fn mkdir(path: &str, parents: bool) -> Reply {
    let r = if parents {
        fs::create_dir_all(path)
    } else {
        fs::create_dir(path)
    };
    r.map_or_else(|e| error(&e), |()| Reply::Done)
}

pub(crate) fn remove(path: &str, recursive: bool) -> Reply {
    let r = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() && recursive => fs::remove_dir_all(path),
        Ok(m) if m.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) => Err(e),
    };
    r.map_or_else(|e| error(&e), |()| Reply::Done)
}
