//! The Python module `sandbox_rs_testkit`, for the sandboxio conformance run only: the
//! fault proxy a backend can be opened through (removals and creates that hang or fail,
//! pulls that meet a registry demanding a credential) and the egress lab's canary, an HTTP
//! server on this machine that sandboxes reach like an outside host. A wheel of its own,
//! so the `sandbox-rs` wheel carries no fault switch.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use sandbox_testkit::egress_lab;
use sandbox_testkit::fault_proxy::{self, Fault};

/// The runtime the proxy's tasks run on (one worker: it only relays bytes).
fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the fault proxy")
    })
}

/// The module `sandbox_rs_testkit`.
#[pymodule]
fn sandbox_rs_testkit(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FaultProxy>()?;
    m.add_class::<Canary>()?;
    Ok(())
}

fn fault(mode: &str) -> PyResult<Fault> {
    match mode {
        "pass" => Ok(Fault::Pass),
        "hang" => Ok(Fault::Hang),
        "fail" => Ok(Fault::Fail),
        other => Err(PyValueError::new_err(format!(
            "fault {other:?}: use pass, hang or fail"
        ))),
    }
}

/// A fault-injecting proxy in front of an engine socket (see the testkit's `FaultProxy`).
#[pyclass(module = "sandbox_rs_testkit", frozen)]
pub struct FaultProxy {
    proxy: fault_proxy::FaultProxy,
}

#[pymethods]
impl FaultProxy {
    /// A proxy relaying to the engine socket `upstream` (a path, without `unix://`).
    #[new]
    fn new(py: Python<'_>, upstream: String) -> PyResult<Self> {
        let proxy = py
            .detach(|| runtime().block_on(fault_proxy::FaultProxy::start(upstream)))
            .map_err(|e| PyRuntimeError::new_err(format!("start the fault proxy: {e}")))?;
        Ok(FaultProxy { proxy })
    }

    /// `unix://<socket>`, the endpoint to open a backend with.
    #[getter]
    fn endpoint(&self) -> String {
        self.proxy.endpoint()
    }

    /// What container removals do from now on: `pass`, `hang` or `fail`.
    fn set_kill(&self, mode: &str) -> PyResult<()> {
        self.proxy.set(fault(mode)?);
        Ok(())
    }

    /// What container creations do from now on: `pass`, `hang` or `fail` (a held create
    /// is answered as a failure, never relayed late).
    fn set_create(&self, mode: &str) -> PyResult<()> {
        self.proxy.set_create(fault(mode)?);
        Ok(())
    }

    /// Every image reads as missing and every pull meets a loopback registry demanding a
    /// credential nobody is given (`cli`: `docker` or `podman`, which exports the image
    /// the registry serves). Blocking, with the GIL released.
    fn lock_pulls(&self, py: Python<'_>, cli: &str) -> PyResult<()> {
        let cli: &'static str = match cli {
            "docker" => "docker",
            "podman" => "podman",
            other => return Err(PyValueError::new_err(format!("cli {other:?}"))),
        };
        py.detach(|| runtime().block_on(self.proxy.lock_pulls(cli)))
            .map_err(PyRuntimeError::new_err)
    }

    /// Everything relayed unchanged again.
    fn heal(&self) {
        self.proxy.set(Fault::Pass);
        self.proxy.set_create(Fault::Pass);
        self.proxy.redirect_pulls(None);
    }
}

/// An HTTP server on the egress lab's canary address, inside the lab's network namespace:
/// reachable from a sandbox with egress, never leaving this machine. Every request is
/// answered `200 canary`; `hits` counts them.
#[pyclass(module = "sandbox_rs_testkit", frozen)]
pub struct Canary {
    host: String,
    port: u16,
    stop: Arc<AtomicBool>,
    hits: Arc<AtomicU64>,
    lab: std::sync::Mutex<Option<egress_lab::Teardown>>,
}

#[pymethods]
impl Canary {
    /// Ensures the lab and starts the server on a free port.
    #[new]
    fn new(py: Python<'_>) -> PyResult<Self> {
        py.detach(|| {
            let lab = egress_lab::Teardown::at_end_of_run();
            let ip = egress_lab::ensure().map_err(PyRuntimeError::new_err)?;
            let listener =
                egress_lab::bind(SocketAddr::new(ip, 0)).map_err(PyRuntimeError::new_err)?;
            let port = listener
                .local_addr()
                .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
                .port();
            let stop = Arc::new(AtomicBool::new(false));
            let hits = Arc::new(AtomicU64::new(0));
            let (s, h) = (stop.clone(), hits.clone());
            std::thread::spawn(move || serve(listener, &s, &h));
            Ok(Canary {
                host: ip.to_string(),
                port,
                stop,
                hits,
                lab: std::sync::Mutex::new(Some(lab)),
            })
        })
    }

    /// The canary's address (an IP address, so an allowlist can name it).
    #[getter]
    fn host(&self) -> String {
        self.host.clone()
    }

    /// The server's port.
    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Requests answered so far.
    #[getter]
    fn hits(&self) -> u64 {
        self.hits.load(Ordering::SeqCst)
    }

    /// Stops the server and removes the lab when no other test process uses it.
    fn close(&self) {
        self.stop.store(true, Ordering::SeqCst);
        drop(self.lab.lock().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// Answers each connection with `200 canary` until `stop` (polling: the listener is
/// non-blocking, so no connection is needed to end the loop).
fn serve(listener: std::net::TcpListener, stop: &AtomicBool, hits: &AtomicU64) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut conn, _)) => {
                hits.fetch_add(1, Ordering::SeqCst);
                let _ = conn.set_nonblocking(false);
                let _ = conn.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 4096];
                let _ = conn.read(&mut buf);
                let _ = conn.write_all(
                    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 7\r\nConnection: close\r\n\r\ncanary\n",
                );
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}
