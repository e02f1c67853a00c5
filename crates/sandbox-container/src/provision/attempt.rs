//! One provisioning attempt: create the container, copy mounts in and run `pre_start`,
//! put the agent in, start, run `post_start`, load the egress rules, greet the agent,
//! set up ingress. A teardown guard owns the container from the moment the engine names
//! it, so any failure or a dropped future removes it. Which attempt comes next, and why,
//! is `create.rs`'s job.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sandbox_core::labels::{LABEL_DEADLINE, LABEL_MAX_DEADLINE};
use sandbox_core::teardown::{Killer, OrphanInfo, TeardownGuard};
use sandbox_core::{CreateOptions, IsolationTier, Result};

use crate::engine::transfer::bounded;
use crate::engine::{ContainerEngine, ContainerSpec, EngineErrorKind, NetworkMode};
use crate::error;
use crate::provision::backend::ContainerBackend;
use crate::provision::teardown::container_killer;
use crate::sandbox::ContainerSandbox;
use crate::sandbox::ingress::Ingress;
use crate::sandbox::shared::Shared;

/// What one provisioning attempt gave.
pub(super) enum Provisioned<E: ContainerEngine> {
    /// A usable sandbox.
    Ready(Box<ContainerSandbox<E>>),
    /// The agent could not be put in place or did not answer; its container is removed.
    AgentFailed(String),
}

impl<E: ContainerEngine> ContainerBackend<E> {
    /// One attempt: a container created from `spec`, prepared, started, its egress rules
    /// loaded and its agent greeted, or removed (by the guard) on any failure or drop.
    pub(super) async fn provision(
        &self,
        spec: ContainerSpec,
        options: &CreateOptions,
        tier: IsolationTier,
        egress_net: Option<&crate::engine::NetworkInfo>,
        credentials: Option<&crate::credentials::Plan>,
    ) -> Result<Provisioned<E>> {
        let eng = &*self.engine;
        let backend = eng.backend();
        let limit = self.config.create_timeout;
        let create_err = |op: &str, e: crate::engine::EngineError| {
            if e.kind == EngineErrorKind::Timeout {
                error::create_timeout(backend, limit)
            } else {
                error::on_create(eng, &spec.image, op, e)
            }
        };
        // The host agent and the selected keys are checked before anything is created: a
        // key that is not there refuses the create.
        let host_agent = match &options.ssh_agent {
            Some(o) => Some(crate::ssh_agent::HostAgent::resolve(o).await?),
            None => None,
        };
        // The repositories and git's HTTP backend too, before anything is created.
        let gate_repos = (!options.git_repos.is_empty()).then(|| options.git_repos.clone());
        if gate_repos.is_some() {
            crate::git_gate::http_backend()?;
            sandbox_core::git_gate::validate_repos(&options.git_repos)?;
        }
        // The bound hosts are resolved before anything is created; the proxy listens once
        // the container runs (an engine may bring the network's bridge, and so the
        // gateway's address, up only with its first container).
        let proxy = match (credentials, egress_net) {
            (None, _) => None,
            (Some(plan), Some(net)) => {
                let upstream = plan.resolve(eng, net).await?;
                let gateway = net
                    .subnets
                    .iter()
                    .filter_map(|s| s.gateway)
                    .find(IpAddr::is_ipv4)
                    .ok_or_else(|| {
                        sandbox_core::SandboxError::creation(
                            backend,
                            "the sandbox's network has no IPv4 gateway for the credentials proxy",
                        )
                    })?;
                Some((plan, gateway, upstream))
            }
            (Some(_), None) => {
                return Err(sandbox_core::SandboxError::unsupported(
                    sandbox_core::Capability::CREDENTIALS,
                    backend,
                ));
            }
        };
        // Named before the request, so a create dropped while the engine works on it can
        // still be found and removed (by name) by the guard.
        let info = OrphanInfo::new(spec.name.clone(), backend, spec.labels.clone());
        let mut guard = TeardownGuard::new(info, self.name_killer(spec.name.clone()));
        let id = match self.call("create", eng.create(&spec)).await {
            Ok(id) => id,
            Err(e) => {
                if !matches!(
                    e.kind,
                    EngineErrorKind::Unavailable | EngineErrorKind::Timeout
                ) {
                    // The engine answered: nothing was created.
                    guard.disarm();
                    if spec.agent_mount.is_some() {
                        // Perhaps the mount (an engine that cannot see this host's file):
                        // the caller retries with the agent uploaded.
                        return Ok(Provisioned::AgentFailed(format!(
                            "create with the agent mounted failed: {e}"
                        )));
                    }
                }
                return Err(create_err("create container", e));
            }
        };
        guard.disarm();
        // From here the container exists: a dropped or failed create removes it, and
        // the host removes it past its deadline should both that and the in-sandbox
        // backstop fail.
        let deadline =
            labelled_deadline(&spec).unwrap_or_else(|| SystemTime::now() + options.timeout);
        let max = labelled(&spec, LABEL_MAX_DEADLINE)
            .unwrap_or(deadline)
            .max(deadline);
        let expiry = self.arm_expiry(&id, deadline, max);
        let info = OrphanInfo::new(id.clone(), backend, spec.labels.clone());
        let mut guard = TeardownGuard::new(
            info,
            expiry.cancelled_by(container_killer(
                self.engine.clone(),
                self.config.call_timeout,
                id.clone(),
            )),
        );
        // Copy mounts and the pre_start hook see the created, not yet started, container.
        let hooks = eng.hooks();
        let event = crate::spec::hooks::HookEvent::new(&id, &spec.image);
        let prepared = async {
            for m in eng.copy_mounts() {
                crate::provision::copy_in::copy_in(eng, &id, &m).await?;
            }
            hooks.run_pre_start(&event).await
        };
        if let Err(e) = prepared.await {
            let _ = guard.kill_now().await;
            return Err(create_err("provision container", e));
        }
        // The CA goes in before start, like the agent: the first command trusts it.
        if let Some((plan, _, _)) = &proxy
            && let Err(e) = plan.install(eng, &id).await
        {
            let _ = guard.kill_now().await;
            return Err(e);
        }
        // The agent goes in before start: it is the container's main process (unless the
        // engine bind-mounts it).
        if spec.attach_stdin && spec.agent_mount.is_none() {
            // A directory (or a volume the image declares) or a link at the agent's path
            // keeps the agent out, and would send this sandbox to the weaker exec path: the
            // image is the cause, so the create is refused instead. The container is not
            // started yet, so what the stat sees is the image's.
            let path = crate::sandbox::agent::AGENT_PATH;
            match self.call("agent path", eng.stat_path(&id, path)).await {
                Ok(stat) => {
                    if let Some(what) = crate::sandbox::agent::obstacle(&stat) {
                        let _ = guard.kill_now().await;
                        return Err(crate::sandbox::agent::image_in_the_way(&spec.image, &what));
                    }
                }
                Err(e) if e.kind == EngineErrorKind::NotFound => {}
                Err(e) => {
                    let _ = guard.kill_now().await;
                    return Err(create_err("check the agent's path", e));
                }
            }
            let put = match crate::sandbox::agent::binary().map(crate::sandbox::agent::archive) {
                Some(Ok(tar)) => self
                    .call("agent upload", eng.put_archive(&id, "/", tar))
                    .await
                    .map_err(|e| format!("uploading the agent failed: {e}")),
                Some(Err(e)) => Err(format!("packing the agent failed: {e}")),
                None => Err("no agent binary for this architecture".to_string()),
            };
            if let Err(reason) = put {
                let _ = guard.kill_now().await;
                return Ok(Provisioned::AgentFailed(reason));
            }
        }
        if let Err(e) = self.call("start", eng.start(&id)).await {
            let timed_out = e.kind == EngineErrorKind::Timeout;
            let err = create_err("start container", e);
            let _ = guard.kill_now().await;
            if spec.agent_mount.is_some() && !timed_out {
                return Ok(Provisioned::AgentFailed(format!(
                    "start with the agent mounted failed: {}",
                    err.render()
                )));
            }
            return Err(err);
        }
        if let Err(e) = hooks.run_post_start(&event).await {
            let _ = guard.kill_now().await;
            return Err(create_err("post_start hook", e));
        }
        // Egress rules before anything of the user's runs; a failure removes the container.
        let proxy = match proxy {
            None => None,
            Some((plan, gateway, upstream)) => {
                match crate::credentials::Plan::bind(backend, gateway).await {
                    Ok(listener) => Some((plan, listener, upstream)),
                    Err(e) => {
                        let _ = guard.kill_now().await;
                        return Err(e);
                    }
                }
            }
        };
        // The rules loaded next redirect the bound hosts to the proxy's port.
        let proxied = proxy.as_ref().map(|(plan, listener, upstream)| {
            let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
            plan.proxied(port, upstream)
        });
        if let Some(net) = egress_net
            && let Err(e) = crate::egress::apply(eng, &id, &options.network, net, proxied).await
        {
            let _ = guard.kill_now().await;
            return Err(e);
        }
        // The proxy serves from here; only the sandbox's own addresses are answered.
        let broker = match proxy {
            None => None,
            Some((plan, listener, upstream)) => {
                let sources = match eng.inspect(&id).await {
                    Ok(info) => info.addresses,
                    Err(e) => {
                        let _ = guard.kill_now().await;
                        return Err(create_err("inspect container", e));
                    }
                };
                match plan.start(listener, &id, sources, upstream) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        let _ = guard.kill_now().await;
                        return Err(e);
                    }
                }
            }
        };
        // Nothing of the user's runs before the hello: the agent only spawns on request.
        let agent = if spec.attach_stdin {
            match crate::sandbox::agent::connect(
                eng,
                &id,
                self.config.call_timeout,
                crate::sandbox::agent::Session::First,
            )
            .await
            {
                Ok(client) => Some(client),
                Err(reason) => {
                    let _ = guard.kill_now().await;
                    return Ok(Provisioned::AgentFailed(reason));
                }
            }
        } else {
            None
        };
        // The gate listens before `create` returns, so the first command finds it; its
        // token is minted for this sandbox id.
        let git_gate = match (gate_repos, &agent) {
            (None, _) => None,
            (Some(repos), Some(client)) => {
                let events = sandbox_core::layer::EventReporter::current();
                let started = match crate::git_gate::Gate::new(&repos, &id, events) {
                    Ok(gate) => crate::git_gate::Forwarding::start(client, gate, &id).await,
                    Err(e) => Err(e),
                };
                match started {
                    Ok(f) => Some(f),
                    Err(e) => {
                        let _ = guard.kill_now().await;
                        return Err(e);
                    }
                }
            }
            (Some(_), None) => {
                let _ = guard.kill_now().await;
                return Err(crate::sandbox::agent::required(
                    "the sandbox runs without it, and only it can relay the git gate",
                ));
            }
        };
        // The socket listens before `create` returns, so the first command finds it.
        let ssh_agent = match (host_agent, &agent) {
            (None, _) => None,
            (Some(host), Some(client)) => {
                match crate::ssh_agent::Forwarding::start(client, host, &id).await {
                    Ok(f) => Some(f),
                    Err(e) => {
                        let _ = guard.kill_now().await;
                        return Err(e);
                    }
                }
            }
            // `create.rs` never takes the exec path for it; kept for a direct caller.
            (Some(_), None) => {
                let _ = guard.kill_now().await;
                return Err(crate::sandbox::agent::required(
                    "the sandbox runs without it, and only it can relay the ssh agent",
                ));
            }
        };
        let fork_base = crate::sandbox::fork::ForkBase {
            spec: spec.clone(),
            ingress_ports: options.network.ingress_ports.clone(),
            upkeep: self.upkeep.clone(),
        };
        let shared = Arc::new(Shared {
            engine: self.engine.clone(),
            config: self.config.clone(),
            id,
            template: spec.image.clone(),
            workdir: spec.workdir.clone(),
            labels: spec.labels.clone(),
            deadline: Mutex::new(match (&agent, labelled_deadline(&spec)) {
                // The agent ends at exactly the labelled second.
                (Some(_), Some(d)) => d,
                _ => SystemTime::now() + options.timeout,
            }),
            max_deadline: labelled(&spec, LABEL_MAX_DEADLINE)
                .unwrap_or_else(|| SystemTime::now() + options.effective_max_lifetime()),
            tier,
            caps: crate::sandbox::fork::instance_caps(
                crate::snapshot::instance_caps(
                    self.caps() | crate::sandbox::agent::capabilities(agent.as_ref(), tier),
                    spec.resources.disk_mb.is_some(),
                ),
                agent.as_ref(),
                Some(&fork_base),
            ),
            secrets: options
                .secrets
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            interpreters: Mutex::new(HashMap::new()),
            contexts: Mutex::new(HashMap::new()),
            agent: Mutex::new(agent.inspect(|a| expiry.watch_session(a))),
            paused: std::sync::atomic::AtomicBool::new(false),
            stopped: std::sync::atomic::AtomicBool::new(false),
            network: Some(crate::sandbox::restart::NetworkPlan {
                policy: options.network.clone(),
                net: egress_net.cloned(),
            }),
            expiry,
            fork_base: Some(fork_base),
            restored: std::sync::atomic::AtomicBool::new(false),
            ssh_agent: Mutex::new(ssh_agent),
            git_gate: Mutex::new(git_gate),
            credentials: Mutex::new(broker),
        });
        tracing::debug!(
            sandbox_id = %shared.id,
            backend,
            exec_path = %shared.exec_path(),
            "sandbox ready"
        );
        let ports = &options.network.ingress_ports;
        let ingress = match &spec.network {
            _ if ports.is_empty() => Ok(Ingress::default()),
            NetworkMode::None => crate::sandbox::ingress::forward(&shared, ports).await,
            _ => crate::sandbox::ingress::published(&shared, ports).await,
        };
        let ingress = match ingress {
            Ok(ingress) => ingress,
            Err(e) => {
                let _ = guard.kill_now().await;
                return Err(e);
            }
        };
        // Usable now: the last hook before `create` returns; its failure removes it all.
        if let Err(e) = hooks.run_ready(&event).await {
            let _ = guard.kill_now().await;
            return Err(create_err("ready hook", e));
        }
        Ok(Provisioned::Ready(Box::new(ContainerSandbox::new(
            shared, guard, ingress,
        ))))
    }

    /// Removes a container by name, for the window where a create request is in flight. A
    /// removal can overtake the create on the engine, so "not found" is retried briefly
    /// (the guard's grace bounds it).
    fn name_killer(&self, name: String) -> Killer {
        let engine = self.engine.clone();
        let limit = self.config.call_timeout;
        Arc::new(move || {
            let engine = engine.clone();
            let name = name.clone();
            Box::pin(async move {
                for _ in 0..15 {
                    match bounded(limit, "remove", engine.remove(&name)).await {
                        Ok(true) => return Ok(()),
                        Ok(false) => tokio::time::sleep(Duration::from_millis(200)).await,
                        Err(e) if e.kind == EngineErrorKind::NotFound => {
                            tokio::time::sleep(Duration::from_millis(200)).await
                        }
                        Err(e) if e.kind == EngineErrorKind::Conflict => return Ok(()),
                        Err(e) => return Err(error::engine(&*engine, "remove container", e)),
                    }
                }
                Ok(())
            })
        })
    }
}

/// The deadline written into `spec`'s labels (the second the agent ends at), if it parses.
fn labelled_deadline(spec: &ContainerSpec) -> Option<SystemTime> {
    labelled(spec, LABEL_DEADLINE)
}

/// A Unix-seconds label of `spec`, if it parses.
fn labelled(spec: &ContainerSpec, label: &str) -> Option<SystemTime> {
    let secs = spec.labels.get(label)?.parse::<u64>().ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}
