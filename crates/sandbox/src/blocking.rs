//! A blocking facade for scripts and synchronous code, mirroring the async API.
//!
//! Like `reqwest::blocking`, every call runs on a runtime of its own: one process-wide
//! multi-thread tokio runtime (two workers) built on first use, which also runs background
//! teardowns. Calling these functions from inside an async runtime is refused with a
//! `Configuration` error (blocking a runtime's thread would stall it): use the async API
//! there.
//!
//! Dropping a [`Sandbox`] kills it *synchronously* (bounded by the teardown grace), so a
//! script that ends never leaves a sandbox behind.
//!
//! ```no_run
//! use sandbox::CreateOptions;
//!
//! let sb = sandbox::blocking::create("docker://sandbox-rs/python:3.11", CreateOptions::default())?;
//! let out = sb.exec(["echo", "hello"])?;
//! assert_eq!(out.stdout_text(), "hello\n");
//! sb.kill()?;
//! # Ok::<(), sandbox::SandboxError>(())
//! ```

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use crate::{
    Capability, CodeOptions, Command, CreateOptions, EngineReport, ExecResult, FileInfo,
    IsolationTier, ManagedSandbox, OutputChunk, Result, RunOptions, SandboxError, Target,
};

fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<std::result::Result<tokio::runtime::Runtime, String>> =
        OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("sandbox-blocking")
                .enable_all()
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            SandboxError::config(
                format!("cannot start the blocking facade's runtime: {e}"),
                "check the process's thread limits (ulimit -u)",
            )
        })
}

/// Runs `fut` to completion on the facade's runtime. Refused inside an async context.
fn block_on<F: Future>(fut: F) -> Result<F::Output> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(SandboxError::config(
            "sandbox::blocking was called from inside an async runtime",
            "use the async API (sandbox::create, sandbox::connect) in async code",
        ));
    }
    Ok(runtime()?.block_on(fut))
}

/// Blocking [`crate::create`].
pub fn create(target: impl Into<Target>, options: CreateOptions) -> Result<Sandbox> {
    let target = target.into();
    let inner = block_on(crate::create(target, options))??;
    Ok(Sandbox { inner: Some(inner) })
}

/// Blocking [`crate::connect`].
pub fn connect(target: impl Into<Target>, id: &str) -> Result<Sandbox> {
    let target = target.into();
    let inner = block_on(crate::connect(target, id))??;
    Ok(Sandbox { inner: Some(inner) })
}

/// Blocking [`crate::backend`].
pub fn backend(target: impl Into<Target>) -> Result<Backend> {
    let target = target.into();
    let inner = block_on(crate::backend(target))??;
    Ok(Backend { inner })
}

/// A blocking handle on a backend (see [`crate::Backend`] and [`crate::ReapableBackend`]).
#[derive(Debug, Clone)]
pub struct Backend {
    inner: Arc<dyn crate::Backend>,
}

impl Backend {
    /// Backend name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }
    /// Capabilities of sandboxes created with default options.
    pub fn capabilities(&self) -> Capability {
        self.inner.capabilities()
    }
    /// Isolation tier of sandboxes created with default options.
    pub fn isolation(&self) -> IsolationTier {
        self.inner.isolation()
    }
    /// Blocking [`crate::Backend::create`] (no DSN; options as given).
    pub fn create(&self, options: CreateOptions) -> Result<Sandbox> {
        let inner = block_on(self.inner.create(options))??;
        Ok(Sandbox { inner: Some(inner) })
    }
    /// Blocking [`crate::Backend::connect`].
    pub fn connect(&self, id: &str) -> Result<Sandbox> {
        let inner = block_on(self.inner.connect(id))??;
        Ok(Sandbox { inner: Some(inner) })
    }
    /// Blocking [`crate::Backend::diagnose`].
    pub fn diagnose(&self) -> Result<EngineReport> {
        block_on(self.inner.diagnose())
    }
    /// Blocking [`crate::ReapableBackend::list_managed`]; `CapabilityNotSupported`-like
    /// `Configuration` error when the backend cannot list.
    pub fn list_managed(&self, labels: &BTreeMap<String, String>) -> Result<Vec<ManagedSandbox>> {
        let r = self.reapable()?;
        block_on(r.list_managed(labels))?
    }
    /// Blocking [`crate::ReapableBackend::kill_managed`].
    pub fn kill_managed(&self, id: &str) -> Result<bool> {
        let r = self.reapable()?;
        block_on(r.kill_managed(id))?
    }
    /// Blocking [`crate::ReapableBackend::list_snapshots`].
    pub fn list_snapshots(&self) -> Result<Vec<crate::Snapshot>> {
        let r = self.reapable()?;
        block_on(r.list_snapshots())?
    }
    /// Blocking [`crate::ReapableBackend::remove_snapshot`].
    pub fn remove_snapshot(&self, template: &str) -> Result<bool> {
        let r = self.reapable()?;
        block_on(r.remove_snapshot(template))?
    }
    /// The async backend this wraps.
    pub fn as_async(&self) -> &Arc<dyn crate::Backend> {
        &self.inner
    }

    fn reapable(&self) -> Result<&dyn crate::ReapableBackend> {
        self.inner.as_reapable().ok_or_else(|| {
            SandboxError::config(
                format!(
                    "backend `{}` cannot list or kill managed sandboxes",
                    self.inner.name()
                ),
                "use the engine's own tooling to list its sandboxes",
            )
        })
    }
}

/// A blocking sandbox handle. Dropping it kills the sandbox before returning.
#[derive(Debug)]
pub struct Sandbox {
    // `Some` until dropped.
    inner: Option<Box<dyn crate::Sandbox>>,
}

impl Sandbox {
    fn inner(&self) -> &dyn crate::Sandbox {
        self.inner.as_deref().expect("inner is only taken in Drop")
    }

    /// Engine id.
    pub fn id(&self) -> &str {
        self.inner().id()
    }
    /// Backend name.
    pub fn backend(&self) -> &str {
        self.inner().backend()
    }
    /// Capabilities of this instance.
    pub fn capabilities(&self) -> Capability {
        self.inner().capabilities()
    }
    /// Isolation tier of this instance.
    pub fn isolation(&self) -> IsolationTier {
        self.inner().isolation()
    }
    /// Blocking [`crate::Sandbox::run`].
    pub fn run(&self, cmd: impl Into<Command>, options: RunOptions) -> Result<ExecResult> {
        block_on(self.inner().run(cmd.into(), options))?
    }
    /// Blocking [`crate::Sandbox::run_code`].
    pub fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        block_on(self.inner().run_code(code, options))?
    }
    /// Blocking [`crate::Sandbox::stream`]: an iterator of output chunks.
    pub fn stream(&self, cmd: impl Into<Command>, options: RunOptions) -> Result<Process> {
        let inner = self.inner().stream(cmd.into(), options)?;
        Ok(Process { inner: Some(inner) })
    }
    /// Blocking [`crate::Sandbox::files`].
    pub fn files(&self) -> Result<FileSystem<'_>> {
        Ok(FileSystem {
            inner: self.inner().files()?,
        })
    }
    /// Blocking [`crate::Sandbox::kill`]. Idempotent.
    pub fn kill(&self) -> Result<()> {
        block_on(self.inner().kill())?
    }
    /// Blocking [`crate::Sandbox::pause`]: freezes every process of the sandbox.
    pub fn pause(&self) -> Result<()> {
        block_on(self.inner().pause())?
    }
    /// Blocking [`crate::Sandbox::resume`].
    pub fn resume(&self) -> Result<()> {
        block_on(self.inner().resume())?
    }
    /// Blocking [`crate::Sandbox::fork`]: new sandboxes that continue from this instant,
    /// with their memory; the original goes on.
    pub fn fork(&self, options: crate::ForkOptions) -> Result<Vec<Sandbox>> {
        let forks = block_on(self.inner().fork(options))??;
        Ok(forks
            .into_iter()
            .map(|f| Sandbox { inner: Some(f) })
            .collect())
    }
    /// Blocking [`crate::Sandbox::stop`]: ends every process, keeps the sandbox.
    pub fn stop(&self) -> Result<()> {
        block_on(self.inner().stop())?
    }
    /// Blocking [`crate::Sandbox::start`]: runs a stopped sandbox again.
    pub fn start(&self) -> Result<()> {
        block_on(self.inner().start())?
    }
    /// Blocking [`crate::Sandbox::snapshot`]: the sandbox's filesystem as a template.
    pub fn snapshot(&self) -> Result<crate::Snapshot> {
        block_on(self.inner().snapshot())?
    }
    /// Blocking [`crate::Sandbox::extend`]: moves the deadline by `by`, returns the new one.
    pub fn extend(&self, by: std::time::Duration) -> Result<std::time::SystemTime> {
        block_on(self.inner().extend(by))?
    }
    /// Blocking [`crate::Sandbox::set_egress`]: replaces the running sandbox's egress
    /// policy, read back before it returns.
    pub fn set_egress(&self, egress: crate::Egress) -> Result<()> {
        block_on(self.inner().set_egress(egress))?
    }
    /// Blocking [`crate::Sandbox::egress`]: the egress policy in force.
    pub fn egress(&self) -> Result<crate::Egress> {
        block_on(self.inner().egress())?
    }
    /// Blocking [`crate::Sandbox::reset_processes`]: kills every process but the first,
    /// keeps the files; returns how many were killed.
    pub fn reset_processes(&self) -> Result<u32> {
        block_on(self.inner().reset_processes())?
    }
    /// See [`crate::Sandbox::native`]. **Outside the semver contract.**
    pub fn native(&self) -> &dyn Any {
        self.inner().native()
    }
    /// Blocking [`crate::SandboxExt::exec`]: `run` with default options.
    pub fn exec(&self, cmd: impl Into<Command>) -> Result<ExecResult> {
        self.run(cmd, RunOptions::default())
    }
    /// Blocking [`crate::SandboxExt::code`]: `run_code` with default options (Python).
    pub fn code(&self, code: &str) -> Result<ExecResult> {
        self.run_code(code, CodeOptions::default())
    }
    /// The async handle this wraps (its futures must run on a tokio runtime).
    pub fn as_async(&self) -> &dyn crate::Sandbox {
        self.inner()
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let Some(inner) = self.inner.take() else {
            return;
        };
        let Ok(rt) = runtime() else {
            return;
        };
        if tokio::runtime::Handle::try_current().is_err() {
            // Kill in the foreground: a script's last line must not orphan its sandbox.
            // `kill` is bounded by the teardown grace and warns when it cannot finish.
            let _ = rt.block_on(inner.kill());
        }
        // Inside an async context (or after the kill): drop within our runtime so the
        // handle's own Drop can schedule its bounded background kill.
        let _guard = rt.enter();
        drop(inner);
    }
}

/// A blocking streamed process: an [`Iterator`] of output chunks. Dropping it before the
/// end kills the remote process.
#[derive(Debug)]
pub struct Process {
    inner: Option<crate::Process>,
}

impl Process {
    fn inner(&mut self) -> &mut crate::Process {
        self.inner.as_mut().expect("inner is only taken in Drop")
    }
    /// Blocking [`crate::Process::start`]: starts now instead of on the first `next`.
    pub fn start(&mut self) -> Result<()> {
        let p = self.inner();
        block_on(p.start())?
    }
    /// Blocking [`crate::Process::wait`]: discards unconsumed output. Idempotent.
    pub fn wait(&mut self) -> Result<ExecResult> {
        let p = self.inner();
        block_on(p.wait())?
    }
    /// Blocking [`crate::Process::kill`]. Idempotent.
    pub fn kill(&mut self) -> Result<()> {
        let p = self.inner();
        block_on(p.kill())?
    }
    /// Blocking [`crate::Process::collect`]: buffers at most `cap` bytes per stream.
    pub fn collect(mut self, cap: usize) -> Result<ExecResult> {
        let p = self.inner.take().expect("inner is only taken in Drop");
        block_on(p.collect(cap))?
    }
    /// Blocking [`crate::Process::input`]: the live input of a process streamed with
    /// `RunOptions::interactive` or `RunOptions::pty` (starts it if needed).
    pub fn input(&mut self) -> Result<ProcessInput> {
        let p = self.inner();
        let input = block_on(p.input())??;
        Ok(ProcessInput { input })
    }
    /// The exit code once the process ended.
    pub fn returncode(&self) -> Option<i64> {
        self.inner.as_ref().and_then(|p| p.returncode())
    }
    /// The timeout this process is bounded by.
    pub fn timeout(&self) -> Duration {
        self.inner.as_ref().map(|p| p.timeout()).unwrap_or_default()
    }
}

/// Blocking [`crate::ProcessInput`]: write to, end or resize a running process's input
/// from synchronous code (another thread may iterate its output meanwhile).
#[derive(Debug, Clone)]
pub struct ProcessInput {
    input: crate::ProcessInput,
}

impl ProcessInput {
    /// Blocking [`crate::ProcessInput::write`].
    pub fn write(&self, data: impl Into<Bytes>) -> Result<()> {
        block_on(self.input.write(data))?
    }
    /// Blocking [`crate::ProcessInput::end`].
    pub fn end(&self) -> Result<()> {
        block_on(self.input.end())?
    }
    /// Blocking [`crate::ProcessInput::resize`].
    pub fn resize(&self, size: crate::PtySize) -> Result<()> {
        block_on(self.input.resize(size))?
    }
}

impl Iterator for Process {
    type Item = Result<OutputChunk>;

    fn next(&mut self) -> Option<Self::Item> {
        let p = self.inner();
        match block_on(p.next()) {
            Ok(item) => item,
            Err(e) => Some(Err(e)),
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let (Some(p), Ok(rt)) = (self.inner.take(), runtime()) {
            // The process's Drop schedules its bounded kill on the current runtime.
            let _guard = rt.enter();
            drop(p);
        }
    }
}

/// Blocking view of a sandbox's filesystem (see [`crate::FileSystem`]).
pub struct FileSystem<'a> {
    inner: &'a dyn crate::FileSystem,
}

impl std::fmt::Debug for FileSystem<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FileSystem")
    }
}

impl<'a> FileSystem<'a> {
    /// Blocking [`crate::FileSystem::read`].
    pub fn read(&self, path: &str) -> Result<Bytes> {
        block_on(self.inner.read(path))?
    }
    /// Blocking [`crate::FileSystem::write`].
    pub fn write(&self, path: &str, data: impl Into<Bytes>) -> Result<()> {
        block_on(self.inner.write(path, data.into()))?
    }
    /// Blocking [`crate::FileSystem::upload`].
    pub fn upload(&self, local: &Path, remote: &str) -> Result<()> {
        block_on(self.inner.upload(local, remote))?
    }
    /// Blocking [`crate::FileSystem::download`].
    pub fn download(&self, remote: &str, local: &Path) -> Result<()> {
        block_on(self.inner.download(remote, local))?
    }
    /// Blocking [`crate::FileSystem::ls`].
    pub fn ls(&self, path: &str) -> Result<Vec<FileInfo>> {
        block_on(self.inner.ls(path))?
    }
    /// Blocking [`crate::FileSystem::mkdir`].
    pub fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        block_on(self.inner.mkdir(path, parents))?
    }
    /// Blocking [`crate::FileSystem::remove`].
    pub fn remove(&self, path: &str) -> Result<()> {
        block_on(self.inner.remove(path))?
    }
    /// Blocking [`crate::FileSystem::stat`].
    pub fn stat(&self, path: &str) -> Result<FileInfo> {
        block_on(self.inner.stat(path))?
    }
}
