//! `unskit._core.journal`: an append-only file of framed records (`unskit_core::journal`),
//! for state that must survive a killed process: each append is one write(2) before it
//! returns, made with the GIL held (a few microseconds), so a caller never waits to win the
//! GIL back; with `sync` each append is also on disk (fdatasync, without the GIL).

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, TryLockError as MutexTryLockError};

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use unskit_core::journal::{frame_into, scan, MAGIC};
use unskit_core::CoreError;

use crate::errors::{io_error, to_py};
use crate::gil::detached;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Journal>()?;
    m.add_function(wrap_pyfunction!(read, m)?)?;
    Ok(())
}

/// The intact records of the journal at `path`, read without its lock and changing
/// nothing (for inspection while its owner runs).
#[pyfunction]
fn read<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let bytes = detached(py, || fs::read(&path)).map_err(|e| io_error(e, &path))?;
    let found = scan(&bytes).map_err(to_py)?;
    Ok(found
        .records
        .into_iter()
        .map(|range| PyBytes::new(py, &bytes[range]))
        .collect())
}

/// One journal file, open for appending, locked against every other opener.
#[pyclass(module = "unskit._core.journal", frozen)]
struct Journal {
    path: PathBuf,
    sync: bool,
    /// None once closed.
    file: Mutex<Option<Appending>>,
}

/// The open file and the length of its intact records.
struct Appending {
    file: File,
    len: u64,
    /// A failed append left bytes it could not cut off: nothing more is appended.
    torn: bool,
}

fn in_use(path: &Path) -> PyErr {
    to_py(CoreError::InvalidJournal(format!(
        "{} is in use by another process (or another store in this one)",
        path.display()
    )))
}

/// Opens (creating) `path` for appending and takes its exclusive lock.
fn open_locked(path: &Path) -> PyResult<File> {
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| io_error(e, path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => Err(in_use(path)),
        Err(TryLockError::Error(e)) => Err(io_error(e, path)),
    }
}

/// Makes a rename or a new file in `path`'s directory durable.
fn sync_directory(path: &Path) -> io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    File::open(dir.unwrap_or(Path::new(".")))?.sync_all()
}

impl Journal {
    fn file(&self) -> MutexGuard<'_, Option<Appending>> {
        // Nothing holding the lock panics; were it to, the file is still sound.
        self.file.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn closed(&self) -> PyErr {
        to_py(CoreError::InvalidJournal(format!(
            "{} is closed",
            self.path.display()
        )))
    }

    fn write_frame(&self, slot: &mut Option<Appending>, frame: &[u8]) -> PyResult<()> {
        let open = slot.as_mut().ok_or_else(|| self.closed())?;
        if open.torn {
            return Err(to_py(CoreError::InvalidJournal(format!(
                "{} ends in part of a record a failed write left; reopen it",
                self.path.display()
            ))));
        }
        if let Err(error) = open.file.write_all(frame) {
            // Part of a frame (a full disk) would end the intact prefix at the next open and
            // hide every record appended after it: cut it off.
            open.torn = open.file.set_len(open.len).is_err();
            return Err(io_error(error, &self.path));
        }
        open.len += frame.len() as u64;
        if self.sync {
            open.file.sync_data().map_err(|e| io_error(e, &self.path))?;
        }
        Ok(())
    }
}

#[pymethods]
impl Journal {
    /// Opens or creates the journal at `path`; returns it with its intact records and the
    /// number of bytes of torn tail it cut off (a killed writer's or a power cut's).
    #[staticmethod]
    #[pyo3(signature = (path, *, sync = false))]
    fn open<'py>(
        py: Python<'py>,
        path: PathBuf,
        sync: bool,
    ) -> PyResult<(Journal, Vec<Bound<'py, PyBytes>>, u64)> {
        let (file, bytes, records, torn) = detached(py, || -> PyResult<_> {
            let mut file = open_locked(&path)?;
            let mut bytes = Vec::new();
            file.seek(SeekFrom::Start(0))
                .and_then(|_| file.read_to_end(&mut bytes))
                .map_err(|e| io_error(e, &path))?;
            let found = scan(&bytes).map_err(to_py)?;
            let torn = (bytes.len() - found.valid_len) as u64;
            if torn > 0 {
                file.set_len(found.valid_len as u64)
                    .and_then(|_| file.sync_all())
                    .map_err(|e| io_error(e, &path))?;
            }
            if found.valid_len == 0 {
                file.write_all(MAGIC)
                    .and_then(|_| file.sync_all())
                    .and_then(|_| sync_directory(&path))
                    .map_err(|e| io_error(e, &path))?;
            }
            let len = found.valid_len.max(MAGIC.len()) as u64;
            Ok((
                Appending {
                    file,
                    len,
                    torn: false,
                },
                bytes,
                found.records,
                torn,
            ))
        })?;
        let records = records
            .into_iter()
            .map(|range| PyBytes::new(py, &bytes[range]))
            .collect();
        let journal = Journal {
            path,
            sync,
            file: Mutex::new(Some(file)),
        };
        Ok((journal, records, torn))
    }

    /// Appends one record: written to the file (and with `sync`, to the disk) on return.
    fn append(&self, py: Python<'_>, record: &[u8]) -> PyResult<()> {
        let mut frame = Vec::new();
        frame_into(&mut frame, record).map_err(to_py)?;
        if !self.sync {
            match self.file.try_lock() {
                Ok(mut file) => return self.write_frame(&mut file, &frame),
                Err(MutexTryLockError::Poisoned(e)) => {
                    return self.write_frame(&mut e.into_inner(), &frame)
                }
                // A rewrite holds it: wait without the GIL.
                Err(MutexTryLockError::WouldBlock) => {}
            }
        }
        detached(py, || self.write_frame(&mut self.file(), &frame))
    }

    /// Replaces the journal's content with `records` (compaction): written beside it, on
    /// disk, then renamed over it, so a crash leaves either the old journal or the new one.
    fn rewrite(&self, py: Python<'_>, records: Vec<Vec<u8>>) -> PyResult<()> {
        let mut bytes = MAGIC.to_vec();
        for record in &records {
            frame_into(&mut bytes, record).map_err(to_py)?;
        }
        detached(py, || {
            let mut current = self.file();
            if current.is_none() {
                return Err(self.closed());
            }
            let mut beside = self.path.clone().into_os_string();
            beside.push(".rewrite");
            let beside = PathBuf::from(beside);
            // A rewrite a crash interrupted left this behind; it is never read.
            match fs::remove_file(&beside) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_error(e, &beside)),
                _ => {}
            }
            let mut file = open_locked(&beside)?;
            let written = file.write_all(&bytes).and_then(|_| file.sync_all());
            if let Err(error) = written {
                // A full disk: the journal is as it was; its half-written copy must not keep
                // the space.
                let _ = fs::remove_file(&beside);
                return Err(io_error(error, &beside));
            }
            fs::rename(&beside, &self.path)
                .and_then(|_| sync_directory(&self.path))
                .map_err(|e| io_error(e, &self.path))?;
            *current = Some(Appending {
                file,
                len: bytes.len() as u64,
                torn: false,
            });
            Ok(())
        })
    }

    /// Closes the file (and releases its lock); appends after this raise JournalError.
    fn close(&self, py: Python<'_>) {
        detached(py, || drop(self.file().take()));
    }

    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    fn __repr__(&self) -> String {
        format!("Journal({:?})", self.path)
    }
}
