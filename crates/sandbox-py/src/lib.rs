//! The native half of the `sandbox_rs` Python package: the facade's backends, sandboxes,
//! processes and files as Python objects whose operations are awaitables on one tokio
//! runtime. The Python half (`python/sandbox_rs/`) turns them into sandboxio's types and
//! exceptions; nothing here knows sandboxio.
//!
//! Every awaitable runs its Rust future on the runtime, never holding the GIL; cancelling
//! the awaitable from Python drops the future. Errors cross as [`error::NativeSandboxError`]
//! carrying the stable code, the message and the hint.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod backend;
mod error;
mod pool;
mod process;
mod sandbox;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use pyo3::IntoPyObject;
use pyo3::prelude::*;

/// Awaitables whose Rust future has not ended yet.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// When the last Rust future ended, in milliseconds since [`epoch`].
static LAST_END_MS: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Counts a future in flight until it ends or is dropped (a cancelled awaitable).
struct InFlight;

impl InFlight {
    fn enter() -> Self {
        IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        LAST_END_MS.store(epoch().elapsed().as_millis() as u64, Ordering::SeqCst);
        IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `fut` as an asyncio awaitable, run on the module's tokio runtime.
pub(crate) fn awaitable<'py, F, T>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = PyResult<T>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let guard = InFlight::enter();
    pyo3_async_runtimes::tokio::future_into_py(py, async move {
        let _guard = guard;
        fut.await
    })
}

/// This process's session id: every sandbox it creates carries it as the
/// `io.sandbox-rs.session` label, so a caller can tell its own sandboxes from others'.
#[pyfunction]
fn session_id() -> &'static str {
    ::sandbox::labels::session_id()
}

/// Waits (GIL released, at most `limit` seconds) until no awaitable's Rust future runs
/// and the last one ended a moment ago. Registered with `atexit` by the Python half: the
/// bridge hands each result to the event loop from a worker thread, which touches Python
/// objects a little after the future ended; one still doing so when the interpreter
/// finalizes is stopped mid-call and crashes the process.
#[pyfunction]
fn quiesce(py: Python<'_>, limit: f64) {
    let settle = Duration::from_millis(100);
    let until = Instant::now() + Duration::from_secs_f64(limit.clamp(0.0, 10.0));
    py.detach(|| {
        while Instant::now() < until {
            let last = Duration::from_millis(LAST_END_MS.load(Ordering::SeqCst));
            if IN_FLIGHT.load(Ordering::SeqCst) == 0 && epoch().elapsed() >= last + settle {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
}

/// The module `sandbox_rs._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add(
        "SandboxError",
        m.py().get_type::<error::NativeSandboxError>(),
    )?;
    m.add_class::<backend::NativeBackend>()?;
    m.add_class::<sandbox::NativeSandbox>()?;
    m.add_class::<process::NativeProcess>()?;
    m.add_class::<process::NativeInput>()?;
    m.add_class::<pool::NativePool>()?;
    m.add_function(wrap_pyfunction!(backend::open_backend, m)?)?;
    m.add_function(wrap_pyfunction!(quiesce, m)?)?;
    m.add_function(wrap_pyfunction!(session_id, m)?)?;
    Ok(())
}
