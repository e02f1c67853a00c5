//! A remote process as a Python object. The process stays reachable while an awaitable on
//! it is cancelled, so the Python side can kill it after a cancellation and only then
//! re-raise the cancellation.

use std::sync::Arc;

use bytes::BytesMut;
use futures::StreamExt;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sandbox::options::DEFAULT_OUTPUT_CAP;
use sandbox::{Process, ProcessInput, PtySize, SandboxError, StreamKind};
use tokio::sync::Mutex;

use crate::error::to_py;

/// One process; every awaitable takes the lock for its duration, and a cancelled one
/// releases it, leaving the process as far as it got.
#[pyclass(module = "sandbox_rs._native", frozen)]
pub struct NativeProcess {
    inner: Arc<Mutex<Process>>,
}

impl NativeProcess {
    pub(crate) fn new(p: Process) -> Self {
        NativeProcess {
            inner: Arc::new(Mutex::new(p)),
        }
    }
}

fn stream_name(k: StreamKind) -> &'static str {
    match k {
        StreamKind::Stdout => "stdout",
        _ => "stderr",
    }
}

/// What `collect` resolves to: exit code, stdout, stderr.
type Collected = (i64, Py<PyBytes>, Py<PyBytes>);

#[pymethods]
impl NativeProcess {
    /// Starts the process (a no-op once started).
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.inner.clone();
        crate::awaitable(
            py,
            async move { p.lock().await.start().await.map_err(to_py) },
        )
    }

    /// The next piece of output, `(stream, data)`, or `None` at the end. A timeout is an
    /// `ExecutionTimeout` error here, after the process tree was killed.
    fn next<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.inner.clone();
        crate::awaitable(py, async move {
            let item = p.lock().await.next().await;
            match item {
                None => Ok(None),
                Some(Err(e)) => Err(to_py(e)),
                Some(Ok(chunk)) => {
                    let data = Python::attach(|py| PyBytes::new(py, &chunk.data).unbind());
                    Ok(Some((stream_name(chunk.stream), data)))
                }
            }
        })
    }

    /// All output (at most 64 MiB a stream: past that the process is killed and the
    /// result is `ResourceLimitExceeded`) and the exit code.
    fn collect<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.inner.clone();
        crate::awaitable(py, async move {
            let mut p = p.lock().await;
            let mut out = BytesMut::new();
            let mut err = BytesMut::new();
            while let Some(item) = p.next().await {
                let chunk = item.map_err(to_py)?;
                let buf = match chunk.stream {
                    StreamKind::Stdout => &mut out,
                    _ => &mut err,
                };
                if buf.len() + chunk.data.len() > DEFAULT_OUTPUT_CAP {
                    let _ = p.kill().await;
                    return Err(to_py(SandboxError::resource_limit(
                        format!(
                            "{} buffer ({DEFAULT_OUTPUT_CAP} bytes)",
                            stream_name(chunk.stream)
                        ),
                        Some("use stream() for output this large".into()),
                    )));
                }
                buf.extend_from_slice(&chunk.data);
            }
            let code = p.wait().await.map_err(to_py)?.exit_code;
            let out: Collected = Python::attach(|py| {
                (
                    code,
                    PyBytes::new(py, &out).unbind(),
                    PyBytes::new(py, &err).unbind(),
                )
            });
            Ok(out)
        })
    }

    /// Drains unconsumed output and resolves to the exit code (idempotent).
    fn wait<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.inner.clone();
        crate::awaitable(py, async move {
            Ok(p.lock().await.wait().await.map_err(to_py)?.exit_code)
        })
    }

    /// Kills the process tree (bounded; idempotent; a finished process is left alone).
    fn kill<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.inner.clone();
        crate::awaitable(
            py,
            async move { p.lock().await.kill().await.map_err(to_py) },
        )
    }

    /// The live input of a process spawned with a terminal (`pty`), starting it if it has
    /// not started; resolves to a `NativeInput`. `Configuration` for a process without
    /// live input. Take it before reading output: `next` holds the process while it waits.
    fn input<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let p = self.inner.clone();
        crate::awaitable(py, async move {
            let input = p.lock().await.input().await.map_err(to_py)?;
            Ok(NativeInput { inner: input })
        })
    }

    /// The exit code once the process ended by itself, else `None`.
    #[getter]
    fn returncode(&self) -> Option<i64> {
        self.inner.try_lock().ok().and_then(|p| p.returncode())
    }
}

/// The live input of a process with a terminal: keystrokes, end of input, window size.
/// Usable while another task reads the process's output; input after the process ended
/// is discarded.
#[pyclass(module = "sandbox_rs._native", frozen)]
pub struct NativeInput {
    inner: ProcessInput,
}

#[pymethods]
impl NativeInput {
    /// Writes `data` as a keyboard sends it (`\r` is Enter, `\x03` Ctrl-C).
    fn write<'py>(&self, py: Python<'py>, data: Vec<u8>) -> PyResult<Bound<'py, PyAny>> {
        let input = self.inner.clone();
        crate::awaitable(py, async move { input.write(data).await.map_err(to_py) })
    }

    /// Sets the terminal's size; the process gets `SIGWINCH`. `Configuration` for an
    /// empty size.
    fn resize<'py>(&self, py: Python<'py>, rows: u16, cols: u16) -> PyResult<Bound<'py, PyAny>> {
        let input = self.inner.clone();
        crate::awaitable(py, async move {
            input.resize(PtySize::new(rows, cols)).await.map_err(to_py)
        })
    }

    /// Ends the input (end-of-file, `^D`, on a terminal).
    fn end<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let input = self.inner.clone();
        crate::awaitable(py, async move { input.end().await.map_err(to_py) })
    }
}
