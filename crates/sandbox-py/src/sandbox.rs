//! A live sandbox as a Python object: its identity, processes, `run_code`, its files and
//! its kill, each operation an awaitable (a process is started by its own object).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use sandbox::{CodeOptions, Command, Language, RunOptions, Sandbox, SandboxError};

use crate::error::to_py;
use crate::process::NativeProcess;

/// One sandbox; cheap to share (every awaitable holds its own reference).
#[pyclass(module = "sandbox_rs._native", frozen)]
pub struct NativeSandbox {
    inner: Arc<dyn Sandbox>,
}

impl NativeSandbox {
    pub(crate) fn new(sb: Box<dyn Sandbox>) -> Self {
        NativeSandbox { inner: sb.into() }
    }
}

/// A timeout in seconds as a duration; `None` stays `None` (the sandbox's remaining
/// lifetime then bounds the call).
pub(crate) fn seconds(t: Option<f64>) -> PyResult<Option<Duration>> {
    t.map(|s| {
        Duration::try_from_secs_f64(s)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                to_py(SandboxError::config(
                    format!("timeout {s} is not a positive number of seconds"),
                    "pass a positive timeout, or None for the sandbox's remaining lifetime",
                ))
            })
    })
    .transpose()
}

/// A Python `bytes` of `data` (made where the result is handed over, under the GIL).
fn to_bytes(data: &[u8]) -> Py<PyBytes> {
    Python::attach(|py| PyBytes::new(py, data).unbind())
}

/// What `run_code` resolves to: exit code, stdout, stderr, `(mime, data)` rich results.
type CodeOutcome = (i64, Py<PyBytes>, Py<PyBytes>, Vec<(String, Py<PyBytes>)>);

#[pymethods]
impl NativeSandbox {
    /// The sandbox id.
    #[getter]
    fn id(&self) -> String {
        self.inner.id().to_string()
    }

    /// The backend's name.
    #[getter]
    fn backend(&self) -> String {
        self.inner.backend().to_string()
    }

    /// The names of the capabilities this sandbox declares.
    #[getter]
    fn capabilities(&self) -> Vec<String> {
        self.inner
            .capabilities()
            .iter_names()
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// The isolation tier (`container`, `gvisor`, …).
    #[getter]
    fn isolation(&self) -> &'static str {
        self.inner.isolation().as_str()
    }

    /// A process for `argv` (never through a shell) or `shell` (`sh -c`), started by its
    /// `start`/`next`/`collect`; nothing runs before one of those is awaited.
    #[pyo3(signature = (*, argv = None, shell = None, env, timeout))]
    fn spawn(
        &self,
        argv: Option<Vec<String>>,
        shell: Option<String>,
        env: HashMap<String, String>,
        timeout: Option<f64>,
    ) -> PyResult<NativeProcess> {
        let cmd = match (argv, shell) {
            (Some(a), None) => Command::Argv(a),
            (None, Some(s)) => Command::Shell(s),
            _ => {
                return Err(to_py(SandboxError::config(
                    "a process needs exactly one of argv and shell",
                    "pass a list (argv) or a string (run with sh -c)",
                )));
            }
        };
        let mut options = RunOptions::default();
        options.timeout = seconds(timeout)?;
        options.env = env.into_iter().collect();
        let process = self.inner.stream(cmd, options).map_err(to_py)?;
        Ok(NativeProcess::new(process))
    }

    /// Runs `code`; resolves to `(exit_code, stdout, stderr, [(mime, data), …])`.
    #[pyo3(signature = (code, *, language, context_id, timeout))]
    fn run_code<'py>(
        &self,
        py: Python<'py>,
        code: String,
        language: &str,
        context_id: Option<String>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let language = match language {
            "python" => Language::Python,
            other => {
                return Err(to_py(SandboxError::config(
                    format!("language {other:?} is not available on sandbox-rs; only python is"),
                    "run another interpreter yourself with run([...])",
                )));
            }
        };
        let mut options = CodeOptions::default();
        options.language = language;
        options.context_id = context_id;
        options.timeout = seconds(timeout)?;
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            let r = sb.run_code(&code, options).await.map_err(to_py)?;
            let results = r
                .results
                .iter()
                .map(|x| (x.mime.clone(), to_bytes(&x.data)))
                .collect();
            let out: CodeOutcome = (
                r.exit_code,
                to_bytes(&r.stdout),
                to_bytes(&r.stderr),
                results,
            );
            Ok(out)
        })
    }

    /// Kills the sandbox (idempotent).
    fn kill<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move { sb.kill().await.map_err(to_py) })
    }

    /// Reads a sandbox file; resolves to `bytes`.
    fn read<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            let data = sb
                .files()
                .map_err(to_py)?
                .read(&path)
                .await
                .map_err(to_py)?;
            Ok(to_bytes(&data))
        })
    }

    /// Writes a sandbox file (replacing it).
    fn write<'py>(
        &self,
        py: Python<'py>,
        path: String,
        data: &[u8],
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        let data = Bytes::copy_from_slice(data);
        crate::awaitable(py, async move {
            sb.files()
                .map_err(to_py)?
                .write(&path, data)
                .await
                .map_err(to_py)
        })
    }

    /// Copies a host file into the sandbox.
    fn upload<'py>(
        &self,
        py: Python<'py>,
        local: PathBuf,
        remote: String,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            sb.files()
                .map_err(to_py)?
                .upload(&local, &remote)
                .await
                .map_err(to_py)
        })
    }

    /// Copies a sandbox file to the host.
    fn download<'py>(
        &self,
        py: Python<'py>,
        remote: String,
        local: PathBuf,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            sb.files()
                .map_err(to_py)?
                .download(&remote, &local)
                .await
                .map_err(to_py)
        })
    }

    /// Lists a directory; resolves to `[(path, size, is_dir), …]`.
    fn ls<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            let listed = sb.files().map_err(to_py)?.ls(&path).await.map_err(to_py)?;
            let out: Vec<(String, u64, bool)> = listed
                .into_iter()
                .map(|f| (f.path, f.size, f.is_dir))
                .collect();
            Ok(out)
        })
    }

    /// Makes a directory (and its parents with `parents`).
    fn mkdir<'py>(
        &self,
        py: Python<'py>,
        path: String,
        parents: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            sb.files()
                .map_err(to_py)?
                .mkdir(&path, parents)
                .await
                .map_err(to_py)
        })
    }

    /// Removes a file or a directory tree.
    fn remove<'py>(&self, py: Python<'py>, path: String) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            sb.files()
                .map_err(to_py)?
                .remove(&path)
                .await
                .map_err(to_py)
        })
    }
}
