//! The facade's warm `Pool` as a Python object: spares of one set of create options, made
//! in the background, each handed out once; the opt-in way to a create that does not wait
//! for the engine.

use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use sandbox::Pool;

use crate::backend::runtime;
use crate::error::to_py;
use crate::sandbox::NativeSandbox;

/// A warm pool of never-used sandboxes of one backend and one set of create options.
/// A handed-out sandbox never returns to the pool; a spare whose remaining lifetime fell to
/// the pool's minimum (a fifth of its lifetime, at most 60 s) is replaced, not handed out.
#[pyclass(module = "sandbox_rs._native", frozen)]
pub struct NativePool {
    pub(crate) inner: Arc<Pool>,
}

#[pymethods]
impl NativePool {
    /// A ready spare at once, else a cold create with the pool's options; resolves to a
    /// `NativeSandbox`.
    fn acquire<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.inner.clone();
        crate::awaitable(py, async move {
            let sb = pool.acquire().await.map_err(to_py)?;
            Ok(NativeSandbox::new(sb))
        })
    }

    /// Waits until `n` spares are ready (at most the pool's size) or `max` seconds passed;
    /// resolves to the number ready.
    fn wait_ready<'py>(&self, py: Python<'py>, n: usize, max: f64) -> PyResult<Bound<'py, PyAny>> {
        let max = Duration::try_from_secs_f64(max).unwrap_or(Duration::ZERO);
        let pool = self.inner.clone();
        crate::awaitable(py, async move { Ok(pool.wait_ready(n, max).await) })
    }

    /// `(ready, creating)`: spares ready now and spares being created.
    #[getter]
    fn stats(&self) -> (usize, usize) {
        let s = self.inner.stats();
        (s.ready, s.creating)
    }

    /// The last error the background refill hit, as its rendered text (no secret: errors
    /// never carry one), or `None`.
    #[getter]
    fn last_error(&self) -> Option<String> {
        self.inner.last_error().map(|e| e.render())
    }

    /// Stops refilling and kills every spare; resolves when they are gone.
    fn shutdown<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let pool = self.inner.clone();
        crate::awaitable(py, async move {
            close(&pool).await;
            Ok(())
        })
    }

    /// `shutdown`, blocking (GIL released): for the interpreter's exit, where no event loop
    /// runs any more. On one of the runtime's own threads (a garbage collection that ran
    /// there) it cannot block: the kills are started and left to run.
    fn shutdown_blocking(&self, py: Python<'_>) {
        let pool = self.inner.clone();
        if tokio::runtime::Handle::try_current().is_ok() {
            runtime().spawn(async move { close(&pool).await });
            return;
        }
        py.detach(|| runtime().block_on(close(&pool)));
    }
}

/// Shuts `pool` down and waits (bounded by the teardown grace) for the removals its
/// shutdown scheduled: a spare whose create was still in flight is removed by its teardown
/// guard in the background, which a process exiting right after would cut short.
async fn close(pool: &Pool) {
    pool.shutdown().await;
    sandbox::teardown::wait_for_teardowns(sandbox::teardown::teardown_grace()).await;
}
