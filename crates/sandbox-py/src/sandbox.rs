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
        seconds_arg(
            s,
            "timeout",
            "pass a positive timeout, or None for the sandbox's remaining lifetime",
        )
    })
    .transpose()
}

/// An optional positive number of seconds for the setting `what`.
pub(crate) fn seconds_arg_opt(s: Option<f64>, what: &str) -> PyResult<Option<Duration>> {
    s.map(|s| seconds_arg(s, what, "pass a positive number of seconds, or None"))
        .transpose()
}

/// A positive number of seconds as a duration, or a typed error naming `what`.
fn seconds_arg(s: f64, what: &str, hint: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            to_py(SandboxError::config(
                format!("{what} {s} is not a positive number of seconds"),
                hint.to_string(),
            ))
        })
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
    /// `start`/`next`/`collect`; nothing runs before one of those is awaited. `pty`
    /// (`(rows, cols)`) gives it a terminal, whose input `NativeProcess.input` hands out.
    #[pyo3(signature = (*, argv = None, shell = None, env, timeout, pty = None))]
    fn spawn(
        &self,
        argv: Option<Vec<String>>,
        shell: Option<String>,
        env: HashMap<String, String>,
        timeout: Option<f64>,
        pty: Option<(u16, u16)>,
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
        if let Some((rows, cols)) = pty {
            let size = sandbox::PtySize::new(rows, cols);
            size.validate().map_err(to_py)?;
            options = options.pty(size);
        }
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

    /// Freezes every process in the sandbox (`PAUSE_RESUME`); calls other than `resume`
    /// and `kill` then fail with `SBX_E1208` until it resumes.
    fn pause<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move { sb.pause().await.map_err(to_py) })
    }

    /// Lets a paused sandbox's processes continue where they were.
    fn resume<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move { sb.resume().await.map_err(to_py) })
    }

    /// Ends every process but keeps the sandbox's files, id and policy (`STOP_START`).
    fn stop<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move { sb.stop().await.map_err(to_py) })
    }

    /// Runs a stopped sandbox again, its network policy re-applied before it resolves.
    fn start<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move { sb.start().await.map_err(to_py) })
    }

    /// Moves the deadline `seconds` later (`EXTEND_LIFETIME`, at most to the maximum
    /// lifetime set at create); resolves to the new deadline in Unix seconds.
    fn extend<'py>(&self, py: Python<'py>, seconds: f64) -> PyResult<Bound<'py, PyAny>> {
        let by = seconds_arg(seconds, "extend by", "pass a positive number of seconds")?;
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            let deadline = sb.extend(by).await.map_err(to_py)?;
            Ok(deadline
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64())
        })
    }

    /// Turns the sandbox's files into a template `create` accepts (`SNAPSHOT`); resolves
    /// to the template's reference.
    fn snapshot<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            Ok(sb.snapshot().await.map_err(to_py)?.template)
        })
    }

    /// Forks the running sandbox with its memory (`SNAPSHOT_FORK`): `count` new sandboxes
    /// that continue from this instant, each living `timeout` seconds (default: the
    /// original's deadline); resolves to a list of `NativeSandbox`.
    #[pyo3(signature = (count = 1, *, timeout = None))]
    fn fork<'py>(
        &self,
        py: Python<'py>,
        count: usize,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut options = sandbox::ForkOptions::new(count);
        if let Some(t) = seconds(timeout)? {
            options = options.timeout(t);
        }
        let sb = self.inner.clone();
        crate::awaitable(py, async move {
            let forks = sb.fork(options).await.map_err(to_py)?;
            Ok(forks
                .into_iter()
                .map(NativeSandbox::new)
                .collect::<Vec<_>>())
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
