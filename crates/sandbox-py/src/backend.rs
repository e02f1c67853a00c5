//! A backend of the facade (Docker, Podman or the fake) as a Python object: what it
//! declares, and create / connect / the reaper's list and kill as awaitables.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use sandbox::{
    Backend, BackendConfig, CreateOptions, Credential, NetworkPolicy, Placement, Pool, PoolConfig,
    Resources, SandboxError, SandboxState, Secret,
};

use crate::error::to_py;
use crate::pool::NativePool;
use crate::sandbox::NativeSandbox;

/// One backend of the facade, shared by every sandbox it creates.
#[pyclass(module = "sandbox_rs._native", frozen)]
pub struct NativeBackend {
    pub(crate) inner: Arc<dyn Backend>,
}

/// The tokio runtime every awaitable of this module runs on.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

/// The facade's backend for `kind` (`docker`, `podman` or `fake`), reaching the engine
/// at `endpoint` when given (otherwise where the environment says, as the facade does).
/// Blocking, with the GIL released: it is called once, where sandboxio asks a backend for
/// its declared capabilities and isolation tier, which are plain attributes there.
#[pyfunction]
#[pyo3(signature = (kind, endpoint = None))]
pub(crate) fn open_backend(
    py: Python<'_>,
    kind: &str,
    endpoint: Option<String>,
) -> PyResult<NativeBackend> {
    let config = match kind {
        "docker" => {
            let c = sandbox::docker::DockerConfig::from_env();
            BackendConfig::Docker(match endpoint {
                Some(e) => c.endpoint(e),
                None => c,
            })
        }
        "podman" => {
            let c = sandbox::podman::PodmanConfig::from_env();
            BackendConfig::Podman(match endpoint {
                Some(e) => c.endpoint(e),
                None => c,
            })
        }
        "fake" => BackendConfig::Fake(sandbox::fake::FakeConfig::default()),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown engine {other:?}: use docker, podman or fake"
            )));
        }
    };
    let inner = py.detach(|| runtime().block_on(sandbox::backend(config)));
    Ok(NativeBackend {
        inner: inner.map_err(to_py)?,
    })
}

/// Splits `hosts` into the facade's egress policy.
fn network(egress: &str, allow: Vec<String>, ingress: Vec<u16>) -> PyResult<NetworkPolicy> {
    let mut policy = match (egress, allow.is_empty()) {
        ("deny", true) => NetworkPolicy::deny(),
        ("deny", false) => NetworkPolicy::allow_list(allow),
        ("allow", true) => NetworkPolicy::allow(),
        _ => {
            return Err(to_py(SandboxError::config(
                format!(
                    "egress {egress:?} with {} allowlist entries has no sandbox-rs policy",
                    allow.len()
                ),
                "use egress=\"deny\" (with allow=(...) for an allowlist) or egress=\"allow\"",
            )));
        }
    };
    for p in ingress {
        policy = policy.ingress_port(p);
    }
    Ok(policy)
}

/// One brokered credential as `sandbox_rs.Credential` passes it: the placeholder's
/// variable, the value, the hosts, and where the value goes (`("header", name, template)`
/// or `("query", name, _)`). The value never leaves the `Secret` it becomes here.
type CredentialArg = (String, String, Vec<String>, String, String, String);

/// The facade's credential for one [`CredentialArg`].
fn credential(
    (env_var, value, hosts, place, name, template): CredentialArg,
) -> PyResult<Credential> {
    let placement = match place.as_str() {
        "header" => Placement::Header { name, template },
        "query" => Placement::Query { name },
        other => {
            return Err(to_py(SandboxError::config(
                format!("credential placement {other:?} is neither a header nor a query parameter"),
                "use Credential(header=...) or Credential(query=...)",
            )));
        }
    };
    Ok(Credential::new(
        env_var,
        Secret::from(value),
        hosts,
        placement,
    ))
}

/// The resource arguments of a create, as Python passes them.
struct ResourceArgs {
    cpu: Option<f64>,
    memory_mb: Option<u64>,
    disk_mb: Option<u64>,
    gpu: Option<u32>,
}

/// The facade's options for one create (or every spare of a pool).
fn create_options(
    template: Option<String>,
    timeout: f64,
    r: ResourceArgs,
    network: NetworkPolicy,
    env: HashMap<String, String>,
    secrets: HashMap<String, String>,
    metadata: HashMap<String, String>,
) -> PyResult<CreateOptions> {
    let timeout = Duration::try_from_secs_f64(timeout).map_err(|_| {
        to_py(SandboxError::config(
            format!("sandbox timeout {timeout} is not a positive number of seconds"),
            "pass timeout=300 (seconds)",
        ))
    })?;
    let mut resources = Resources::default();
    resources.cpu = r.cpu;
    resources.memory_mb = r.memory_mb;
    resources.disk_mb = r.disk_mb;
    resources.gpu = r.gpu;
    let mut options = CreateOptions::default();
    options.template = template;
    options.resources = resources;
    options.network = network;
    options.timeout = timeout;
    options.env = env.into_iter().collect::<BTreeMap<_, _>>();
    options.secrets = secrets
        .into_iter()
        .map(|(k, v)| (k, Secret::from(v)))
        .collect();
    options.metadata = metadata.into_iter().collect();
    Ok(options)
}

fn state_name(s: &SandboxState) -> &'static str {
    match s {
        SandboxState::Running | SandboxState::Creating => "running",
        SandboxState::Paused => "paused",
        _ => "stopped",
    }
}

#[pymethods]
impl NativeBackend {
    /// The backend's name (`docker`, `podman`, `fake`).
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// The names of the capabilities the backend declares (`RUN_COMMAND`, …).
    #[getter]
    fn capabilities(&self) -> Vec<String> {
        self.inner
            .capabilities()
            .iter_names()
            .map(|(n, _)| n.to_string())
            .collect()
    }

    /// The isolation tier (`container`, `gvisor`, `microvm`, `unknown`).
    #[getter]
    fn isolation(&self) -> &'static str {
        self.inner.isolation().as_str()
    }

    /// Creates a sandbox; resolves to a `NativeSandbox`. `max_lifetime` (seconds from
    /// create) is how far `extend` may take the deadline; by default it cannot move.
    /// `credentials` are brokered (docs/credentials.md): the sandbox sees placeholders.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (*, template, timeout, cpu, memory_mb, disk_mb, gpu, egress, allow, ingress_ports, env, secrets, metadata, max_lifetime = None, credentials = Vec::new()))]
    fn create<'py>(
        &self,
        py: Python<'py>,
        template: Option<String>,
        timeout: f64,
        cpu: Option<f64>,
        memory_mb: Option<u64>,
        disk_mb: Option<u64>,
        gpu: Option<u32>,
        egress: &str,
        allow: Vec<String>,
        ingress_ports: Vec<u16>,
        env: HashMap<String, String>,
        secrets: HashMap<String, String>,
        metadata: HashMap<String, String>,
        max_lifetime: Option<f64>,
        credentials: Vec<CredentialArg>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let max_lifetime = crate::sandbox::seconds_arg_opt(max_lifetime, "max_lifetime")?;
        let mut options = create_options(
            template,
            timeout,
            ResourceArgs {
                cpu,
                memory_mb,
                disk_mb,
                gpu,
            },
            network(egress, allow, ingress_ports)?,
            env,
            secrets,
            metadata,
        )?;
        if let Some(max) = max_lifetime {
            options = options.max_lifetime(max);
        }
        for c in credentials {
            options = options.credential(credential(c)?);
        }
        let backend = self.inner.clone();
        crate::awaitable(py, async move {
            let sb = backend.create(options).await.map_err(to_py)?;
            Ok(NativeSandbox::new(sb))
        })
    }

    /// Starts a warm pool of `size` sandboxes created with these options, filled in the
    /// background at once; see `NativePool`. The options are checked now.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (*, size, template, timeout, cpu, memory_mb, disk_mb, gpu, egress, allow, ingress_ports, env, secrets, metadata))]
    fn pool(
        &self,
        py: Python<'_>,
        size: usize,
        template: Option<String>,
        timeout: f64,
        cpu: Option<f64>,
        memory_mb: Option<u64>,
        disk_mb: Option<u64>,
        gpu: Option<u32>,
        egress: &str,
        allow: Vec<String>,
        ingress_ports: Vec<u16>,
        env: HashMap<String, String>,
        secrets: HashMap<String, String>,
        metadata: HashMap<String, String>,
    ) -> PyResult<NativePool> {
        let options = create_options(
            template,
            timeout,
            ResourceArgs {
                cpu,
                memory_mb,
                disk_mb,
                gpu,
            },
            network(egress, allow, ingress_ports)?,
            env,
            secrets,
            metadata,
        )?;
        // The backend refuses what it cannot do before a spare is made: a pool of refusals
        // would only retry them in the background.
        sandbox::policy::check_create(
            self.inner.name(),
            self.inner.capabilities(),
            self.inner.isolation(),
            &options,
        )
        .map_err(to_py)?;
        let backend = self.inner.clone();
        // The pool's refill task is spawned on the module's runtime.
        let pool = py.detach(|| {
            let _entered = runtime().enter();
            Pool::new(backend, PoolConfig::new(size, options))
        });
        Ok(NativePool {
            inner: Arc::new(pool.map_err(to_py)?),
        })
    }

    /// Reattaches to a live sandbox; resolves to a `NativeSandbox`.
    fn connect<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        let backend = self.inner.clone();
        crate::awaitable(py, async move {
            let sb = backend.connect(&id).await.map_err(to_py)?;
            Ok(NativeSandbox::new(sb))
        })
    }

    /// Every sandbox the engine holds under sandbox-rs's label whose metadata has `labels`:
    /// `(id, state, created_at_unix_seconds | None, metadata)` each.
    #[allow(clippy::type_complexity)]
    fn list_managed<'py>(
        &self,
        py: Python<'py>,
        labels: HashMap<String, String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let backend = self.inner.clone();
        let wanted: BTreeMap<String, String> = labels
            .into_iter()
            .map(|(k, v)| (format!("{}{k}", sandbox::labels::LABEL_META_PREFIX), v))
            .collect();
        crate::awaitable(py, async move {
            let reapable = backend.as_reapable().ok_or_else(|| {
                to_py(SandboxError::config(
                    format!("backend `{}` cannot list its sandboxes", backend.name()),
                    "use a backend that labels its sandboxes (docker, podman)",
                ))
            })?;
            let listed = reapable.list_managed(&wanted).await.map_err(to_py)?;
            let out: Vec<(String, &'static str, Option<f64>, HashMap<String, String>)> = listed
                .into_iter()
                .map(|m| {
                    let meta = m
                        .labels
                        .iter()
                        .filter_map(|(k, v)| {
                            k.strip_prefix(sandbox::labels::LABEL_META_PREFIX)
                                .map(|k| (k.to_string(), v.clone()))
                        })
                        .collect();
                    let created = m
                        .created_at
                        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                        .map(|d| d.as_secs_f64());
                    (m.id, state_name(&m.state), created, meta)
                })
                .collect();
            Ok(out)
        })
    }

    /// Removes one labelled sandbox by id; resolves to False when it was already gone.
    fn kill_managed<'py>(&self, py: Python<'py>, id: String) -> PyResult<Bound<'py, PyAny>> {
        let backend = self.inner.clone();
        crate::awaitable(py, async move {
            let reapable = backend.as_reapable().ok_or_else(|| {
                to_py(SandboxError::config(
                    format!("backend `{}` cannot remove sandboxes by id", backend.name()),
                    "kill the sandbox through its own handle",
                ))
            })?;
            reapable.kill_managed(&id).await.map_err(to_py)
        })
    }
}
