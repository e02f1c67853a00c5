//! Creating a sandbox, as one explicit state machine over provisioning attempts.
//!
//! A create is a sequence of [`attempt`](crate::provision::attempt)s, each on a fresh
//! container. What the next one changes depends on how the last one failed, and each
//! fallback is taken at most once:
//!
//! | the attempt | failed because | next |
//! |---|---|---|
//! | agent bind-mounted | the agent did not get in or answer | same spec, agent uploaded (and this backend uploads from then on if that works) |
//! | agent uploaded | the agent did not get in or answer | a container on the engine's exec path, unless `require_agent` refuses it |
//! | agent uploaded | the image holds a directory or link where the agent goes | none: refused, the image is the cause |
//! | any | the image was only remembered and the engine no longer has it | image ensured again, a new create bound |
//! | any, on the library network | anything | network ensured again; a new one (another process's sweep removed ours) gets one more round |
//!
//! Every round (image ensured, then attempts) has its own `create_timeout`; the image pull
//! before it has its own bound. Each attempt's guard removes its container, so a failed
//! round or a dropped create leaves nothing behind.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use sandbox_core::labels::sandbox_labels;
use sandbox_core::{CreateOptions, EffectiveResources, IsolationTier, Result, SandboxError};

use crate::engine::{ContainerEngine, ContainerSpec, NetworkInfo};
use crate::error;
use crate::image::Ensured;
use crate::provision::attempt::Provisioned;
use crate::provision::backend::ContainerBackend;
use crate::provision::config::NAME_PREFIX;
use crate::sandbox::ContainerSandbox;

/// How the agent reaches the container in one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AgentDelivery {
    /// Bind-mounted from a host file (no upload into every container).
    Mounted,
    /// Uploaded into the created container before it starts.
    Uploaded,
    /// No agent: user commands take the engine's exec path.
    ExecPath,
}

/// How one attempt ended, as the state machine sees it.
#[derive(Debug)]
pub(super) enum Outcome<S> {
    /// A usable sandbox.
    Ready(S),
    /// The agent could not be put in place or did not answer (its container is gone).
    AgentFailed(String),
    /// Anything else, including the round's create bound running out.
    Failed(SandboxError),
}

/// What the create does next.
#[derive(Debug)]
pub(super) enum Step<S> {
    /// Provision a container with the agent delivered so.
    Attempt(AgentDelivery),
    /// Forget the remembered image and start a new round (ensure, new bound).
    EnsureImageAgain,
    /// Ensure the library network again; a new one starts a new round.
    EnsureNetworkAgain(SandboxError),
    /// Finished.
    Done(Result<S>),
}

/// What a failed round may still try.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recovery {
    /// Forget the remembered image, ensure it again, a new round.
    EnsureImageAgain,
    /// Ensure the library network again; a new one means a new round.
    EnsureNetworkAgain,
    /// Nothing left: the error stands.
    GiveUp,
}

/// The fallbacks taken so far and what the current round knows.
#[derive(Debug)]
pub(super) struct Fallbacks {
    /// The image of this round was remembered, not checked with the engine.
    pub image_remembered: bool,
    /// The sandbox runs on the library network (egress Allow/AllowList).
    pub on_library_network: bool,
    image_ensured_again: bool,
    network_ensured_again: bool,
    /// Why the mounted agent failed, once it did (for the warning when upload works).
    pub mount_failure: Option<String>,
    /// Why the agent last failed (for the warning when the exec path takes over).
    pub agent_failure: Option<String>,
    /// The backend's name, for the errors the machine makes itself.
    pub backend: &'static str,
}

impl Fallbacks {
    /// No fallback taken yet, for a create on `backend`, on the library network or not.
    pub(super) fn new(backend: &'static str, on_library_network: bool) -> Self {
        Fallbacks {
            image_remembered: false,
            on_library_network,
            image_ensured_again: false,
            network_ensured_again: false,
            mount_failure: None,
            agent_failure: None,
            backend,
        }
    }

    /// The step after an attempt with the agent delivered `delivered` ended in `outcome`.
    pub(super) fn after<S>(&mut self, delivered: AgentDelivery, outcome: Outcome<S>) -> Step<S> {
        match (outcome, delivered) {
            (Outcome::Ready(s), _) => Step::Done(Ok(s)),
            (Outcome::AgentFailed(reason), AgentDelivery::Mounted) => {
                // The mount may be what failed (an engine that does not see this host's
                // files): the same create with the agent uploaded decides.
                self.mount_failure = Some(reason);
                Step::Attempt(AgentDelivery::Uploaded)
            }
            (Outcome::AgentFailed(reason), AgentDelivery::Uploaded) => {
                self.agent_failure = Some(reason);
                Step::Attempt(AgentDelivery::ExecPath)
            }
            (Outcome::AgentFailed(reason), AgentDelivery::ExecPath) => {
                self.round_failed(error::internal(self.backend, reason))
            }
            (Outcome::Failed(e), _) => self.round_failed(e),
        }
    }

    /// What may still be tried after the round failed with `e` (an attempt's error, or
    /// the round's setup: spec refused, image not ensured). The image fallback applies
    /// only when `image_may_be_stale`: the round's image was remembered, not checked.
    pub(super) fn recovery(&mut self, e: &SandboxError, image_may_be_stale: bool) -> Recovery {
        if image_may_be_stale && !self.image_ensured_again && error::says_not_found(e) {
            // The image was only remembered, and the engine no longer has it (removed
            // since): forgotten, ensured as the pull policy says, one more round.
            self.image_ensured_again = true;
            return Recovery::EnsureImageAgain;
        }
        if self.on_library_network && !self.network_ensured_again {
            // Another process's sweep may have removed the library network (unused at
            // that moment) between ensuring it and creating on it.
            self.network_ensured_again = true;
            return Recovery::EnsureNetworkAgain;
        }
        Recovery::GiveUp
    }

    fn round_failed<S>(&mut self, e: SandboxError) -> Step<S> {
        match self.recovery(&e, self.image_remembered) {
            Recovery::EnsureImageAgain => Step::EnsureImageAgain,
            Recovery::EnsureNetworkAgain => Step::EnsureNetworkAgain(e),
            Recovery::GiveUp => Step::Done(Err(e)),
        }
    }

    /// A new round on a re-created library network: the image may be re-checked again.
    pub(super) fn new_network(&mut self) {
        self.image_ensured_again = false;
    }
}

impl<E: ContainerEngine> ContainerBackend<E> {
    /// Creates a sandbox: admission, the library network, then rounds of attempts as
    /// [`Fallbacks`] decides.
    pub(crate) async fn create_sandbox(
        &self,
        mut options: CreateOptions,
    ) -> Result<ContainerSandbox<E>> {
        let backend = self.engine.backend();
        let tier = self.engine.tier();
        let resources =
            sandbox_core::policy::check_create(backend, self.declared_caps(), tier, &options)?;
        crate::credentials::check(&*self.engine, &options)?;
        // The placeholders go into the environment of every spec built from here.
        let credentials = crate::credentials::plan(&mut options)?;
        let options = options;
        refuse_root_scratch(&options, resources)?;
        // The library network is ensured before the spec is checked, so a refusal still
        // provisions no container (a network is not a sandbox; the sweep removes it).
        // Without the always-blocked set, Allow is refused unless opted in: first where
        // the rules cannot be loaded, then where the engine has no network to join.
        let unfiltered_ok = self.config.allow_unfiltered_egress;
        // Until this create ends, this process's sweeps leave the library network alone.
        let _joining = crate::egress::joining(&options.network);
        crate::egress::check_allow(&*self.engine, &options.network, true, unfiltered_ok)?;
        let mut network = crate::egress::network_for(&*self.engine, &options.network).await?;
        crate::egress::check_allow(
            &*self.engine,
            &options.network,
            network.is_some(),
            unfiltered_ok,
        )?;
        let mut fallbacks = Fallbacks::new(backend, network.is_some());
        let mut forget_image = false;
        'round: loop {
            let round = self
                .begin_round(&options, resources, network.as_ref(), forget_image)
                .await;
            let (spec, ensured) = match round {
                Ok(r) => r,
                Err(e) => match self
                    .next_after_failure(&mut fallbacks, e, &options, &mut network)
                    .await
                {
                    Ok(()) => {
                        forget_image = false;
                        continue 'round;
                    }
                    Err(e) => return Err(e),
                },
            };
            fallbacks.image_remembered = ensured == Ensured::Remembered;
            let bound = tokio::time::Instant::now() + self.config.create_timeout;
            let mut delivery = if !spec.attach_stdin {
                AgentDelivery::ExecPath
            } else if spec.agent_mount.is_some() {
                AgentDelivery::Mounted
            } else {
                AgentDelivery::Uploaded
            };
            if delivery == AgentDelivery::ExecPath && crate::sandbox::agent::needed(&options) {
                // The layer refuses this first (no AGENT declared); kept for a direct caller.
                return Err(crate::sandbox::agent::required(
                    "this backend starts no agent: it is off, the engine cannot attach, or no agent ships for this architecture",
                ));
            }
            loop {
                let attempt_spec = match delivery {
                    AgentDelivery::Mounted => spec.clone(),
                    AgentDelivery::Uploaded => ContainerSpec {
                        agent_mount: None,
                        ..spec.clone()
                    },
                    AgentDelivery::ExecPath => ContainerSpec {
                        image_volumes: spec.image_volumes.clone(),
                        ..self.spec(&options, resources, network.as_ref(), false)
                    },
                };
                let outcome = self
                    .bounded_attempt(
                        bound,
                        attempt_spec,
                        &options,
                        tier,
                        network.as_ref(),
                        credentials.as_ref(),
                    )
                    .await;
                let ready = matches!(outcome, Outcome::Ready(_));
                if ready && delivery == AgentDelivery::Uploaded {
                    self.note_mount_unusable(fallbacks.mount_failure.take());
                }
                match fallbacks.after(delivery, outcome) {
                    Step::Done(r) => return r,
                    Step::Attempt(next) => {
                        if next == AgentDelivery::ExecPath
                            && crate::sandbox::agent::needed(&options)
                        {
                            // That container is already removed; no other is made.
                            return Err(crate::sandbox::agent::required(
                                fallbacks.agent_failure.as_deref().unwrap_or("unknown"),
                            ));
                        }
                        if next == AgentDelivery::ExecPath {
                            // That container is already removed: a new one on the exec path.
                            tracing::warn!(
                                backend,
                                reason = fallbacks.agent_failure.as_deref().unwrap_or(""),
                                exec_path = "engine",
                                "the in-sandbox agent did not start; falling back to the engine's exec path"
                            );
                        }
                        delivery = next;
                    }
                    Step::EnsureImageAgain => {
                        forget_image = true;
                        continue 'round;
                    }
                    Step::EnsureNetworkAgain(e) => {
                        self.ensure_network_again(e, &options, &mut network).await?;
                        fallbacks.new_network();
                        forget_image = false;
                        continue 'round;
                    }
                }
            }
        }
    }

    /// The start of a round: the spec (with the agent mounted where the engine can),
    /// checked by the engine, and its image ensured (forgotten first when `forget_image`);
    /// under a disk limit, the volumes the image declares read into the spec.
    async fn begin_round(
        &self,
        options: &CreateOptions,
        resources: EffectiveResources,
        network: Option<&NetworkInfo>,
        forget_image: bool,
    ) -> Result<(ContainerSpec, Ensured)> {
        // Entries inside the host's addresses or an engine network are known only here;
        // refused before anything is created.
        if let Some(net) = network {
            crate::egress::check_allowlist(&*self.engine, &options.network, net).await?;
        }
        let mut spec = self.spec(options, resources, network, self.wants_agent());
        self.engine.check_spec(&spec).map_err(error::refused_spec)?;
        if forget_image {
            crate::image::forget(&*self.engine, &spec.image);
        }
        // Before the create bound: a first pull may take minutes (it has its own bound).
        let ensure = || {
            crate::image::ensure(
                &self.engine,
                &spec.image,
                options.pull,
                self.config.pull_progress.as_ref(),
                self.config.call_timeout,
            )
        };
        let mut ensured = ensure().await?;
        if spec.resources.disk_mb.is_some() {
            // The image's volumes become bounded scratch, not volumes on the engine's disk.
            let volumes = match self.image_volumes(&spec.image).await {
                Err(e) if ensured == Ensured::Remembered && error::says_not_found(&e) => {
                    // Only remembered, and removed since: ensured as the pull policy says.
                    crate::image::forget(&*self.engine, &spec.image);
                    ensured = ensure().await?;
                    self.image_volumes(&spec.image).await?
                }
                r => r?,
            };
            spec.image_volumes = volumes;
            // A copy mount under one of them would be hidden: checked with them.
            self.engine.check_spec(&spec).map_err(error::refused_spec)?;
        }
        // The agent bind-mounted from a host file where the engine can (no 1.5 MiB upload
        // into every container), else uploaded.
        if spec.attach_stdin
            && self.engine.supports_agent_mount()
            && !self.agent_mount_failed.load(Ordering::Relaxed)
        {
            spec.agent_mount = crate::provision::agent_copy::host_copy().await;
        }
        Ok((spec, ensured))
    }

    /// A round's setup failed with `e`: `Ok` when the network was re-created and a new
    /// round may start, else the error to return.
    async fn next_after_failure(
        &self,
        fallbacks: &mut Fallbacks,
        e: SandboxError,
        options: &CreateOptions,
        network: &mut Option<NetworkInfo>,
    ) -> Result<()> {
        // Setup failures never take the image fallback: the image was not ensured.
        match fallbacks.recovery(&e, false) {
            Recovery::EnsureNetworkAgain => {
                self.ensure_network_again(e, options, network).await?;
                fallbacks.new_network();
                Ok(())
            }
            Recovery::EnsureImageAgain | Recovery::GiveUp => Err(e),
        }
    }

    /// The library network ensured afresh: `Ok` with `network` replaced when the engine
    /// now has another one (ours was removed mid-create), else `failure`.
    async fn ensure_network_again(
        &self,
        failure: SandboxError,
        options: &CreateOptions,
        network: &mut Option<NetworkInfo>,
    ) -> Result<()> {
        let fresh = crate::egress::network_for(&*self.engine, &options.network).await?;
        match (fresh, network.as_ref()) {
            (Some(net), Some(used)) if net.id != used.id => {
                tracing::debug!(
                    backend = self.engine.backend(),
                    network = %net.name,
                    "the library network was re-created during create; retrying once"
                );
                *network = Some(net);
                Ok(())
            }
            _ => Err(failure),
        }
    }

    /// One attempt, bounded by the round's deadline. Dropping it on the deadline drops its
    /// armed guard: the container is removed in the background.
    async fn bounded_attempt(
        &self,
        bound: tokio::time::Instant,
        spec: ContainerSpec,
        options: &CreateOptions,
        tier: IsolationTier,
        network: Option<&NetworkInfo>,
        credentials: Option<&crate::credentials::Plan>,
    ) -> Outcome<ContainerSandbox<E>> {
        let attempt = self.provision(spec, options, tier, network, credentials);
        match tokio::time::timeout_at(bound, attempt).await {
            Ok(Ok(Provisioned::Ready(s))) => Outcome::Ready(*s),
            Ok(Ok(Provisioned::AgentFailed(reason))) => Outcome::AgentFailed(reason),
            Ok(Err(e)) => Outcome::Failed(e),
            Err(_) => Outcome::Failed(error::create_timeout(
                self.engine.backend(),
                self.config.create_timeout,
            )),
        }
    }

    /// The uploaded agent worked where the mounted one failed: this engine does not see
    /// the host's files, so this backend uploads from now on.
    fn note_mount_unusable(&self, mount_failure: Option<String>) {
        if let Some(first) = mount_failure {
            self.agent_mount_failed.store(true, Ordering::Relaxed);
            tracing::warn!(
                backend = self.engine.backend(),
                first = %first,
                "the engine could not bind-mount the agent from this host; uploading it into every sandbox instead"
            );
        }
    }

    pub(super) fn spec(
        &self,
        options: &CreateOptions,
        resources: sandbox_core::EffectiveResources,
        egress_net: Option<&crate::engine::NetworkInfo>,
        agent: bool,
    ) -> ContainerSpec {
        let image = options
            .template
            .clone()
            .unwrap_or_else(|| self.config.default_template.clone());
        let lifetime = options.timeout;
        // Rounded up from the exact end: the agent ends at this second, and a sandbox
        // must never end before its lifetime (the old `floor(now) + ceil(lifetime)` could
        // cut up to a second off).
        let now = SystemTime::now();
        let deadline = deadline_secs(now, lifetime);
        let max_deadline = deadline_secs(now, options.effective_max_lifetime()).max(deadline);
        // Allow and AllowList run on the library's network (egress/mod.rs).
        let network = crate::egress::network_mode(&options.network, egress_net);
        // The main process is the lifetime backstop: it ends at the deadline, which ends
        // the container. The agent cannot be stopped from inside; `sleep` can (kill -STOP),
        // so on the exec path the sweep past the deadline is the last resort.
        let command = if agent {
            crate::sandbox::agent::command(deadline, max_deadline, options.idle_timeout)
        } else {
            vec!["sleep".into(), format!("{:.3}", lifetime.as_secs_f64())]
        };
        ContainerSpec {
            name: container_name(),
            image,
            command,
            // The agent reaps zombies itself and must be PID 1 (an init in front of it
            // would hold signals the agent relies on the kernel to drop).
            init: !agent,
            // Secrets are deliberately absent: they are injected per exec, never stored in
            // the container configuration.
            env: options
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                // Every command finds the relay socket (a path, no secret).
                .chain(options.ssh_agent.as_ref().map(|_| {
                    (
                        crate::ssh_agent::SSH_AUTH_SOCK.to_string(),
                        sandbox_core::ssh_agent::SSH_AUTH_SOCK_PATH.to_string(),
                    )
                }))
                .collect(),
            workdir: options.effective_workdir().to_string(),
            hostname: options.hostname.clone(),
            labels: {
                let mut labels = sandbox_labels(self.engine.backend(), deadline, &options.metadata);
                // The latest deadline `extend` can reach: what other processes' sweeps
                // count expiry from, since the deadline label cannot follow a move.
                sandbox_core::labels::add_lifetime_limits(
                    &mut labels,
                    max_deadline,
                    options.idle_timeout,
                );
                // Each attempt is its own container: one with the agent that fails is
                // removed, so a live sandbox's label says which way its commands go.
                labels.insert(
                    sandbox_core::labels::LABEL_EXEC_PATH.to_string(),
                    if agent {
                        sandbox_core::labels::EXEC_PATH_AGENT
                    } else {
                        sandbox_core::labels::EXEC_PATH_EXEC
                    }
                    .to_string(),
                );
                // The clone URLs without the token, for listings.
                if !options.git_repos.is_empty() {
                    labels.insert(
                        sandbox_core::git_gate::LABEL_GIT_GATE.to_string(),
                        sandbox_core::git_gate::public_urls(&options.git_repos).join(" "),
                    );
                }
                if agent {
                    labels.insert(
                        sandbox_core::labels::LABEL_AGENT_PROTOCOL.to_string(),
                        crate::sandbox::agent::protocol_label(),
                    );
                }
                // Whether a start must load rules into the new network namespace: a
                // reattached handle, which does not know the policy, starts only a
                // sandbox without network.
                labels.insert(
                    crate::sandbox::restart::LABEL_EGRESS.to_string(),
                    crate::sandbox::restart::egress_label(&options.network).to_string(),
                );
                if resources.disk_mb.is_some() {
                    labels.insert(
                        crate::snapshot::LABEL_DISK_LIMITED.to_string(),
                        "true".to_string(),
                    );
                }
                labels
            },
            resources,
            network,
            lifetime,
            attach_stdin: agent,
            agent_mount: None,
            // Read from the engine once the image is ensured (`begin_round`).
            image_volumes: Vec::new(),
        }
    }

    /// What new sandboxes can declare at create: the engine's and this layer's set, plus
    /// what the agent brings where they start with it (terminals are checked per sandbox).
    pub(super) fn declared_caps(&self) -> sandbox_core::Capability {
        if self.wants_agent() {
            self.caps()
                | sandbox_core::Capability::AGENT
                | sandbox_core::Capability::EXTEND_LIFETIME
                | sandbox_core::Capability::IDLE_TIMEOUT
                | sandbox_core::Capability::RESET_PROCESSES
                | sandbox_core::Capability::SSH_AGENT
                | sandbox_core::Capability::GIT_GATE
        } else {
            // A fork's host reaches the restored sandbox through its agent.
            self.caps()
                .difference(sandbox_core::Capability::SNAPSHOT_FORK)
        }
    }

    /// Whether new sandboxes start with the agent: configured, the engine can attach, and
    /// a binary ships for this architecture.
    pub(super) fn wants_agent(&self) -> bool {
        self.config.agent
            && self.engine.supports_attach()
            && crate::sandbox::agent::binary().is_some()
    }
}

/// A disk limit makes the root filesystem read-only and mounts the workdir as a sized
/// scratch filesystem (ContainerSpec::scratch_paths): that cannot be `/` itself.
fn refuse_root_scratch(
    options: &CreateOptions,
    resources: sandbox_core::EffectiveResources,
) -> Result<()> {
    if resources.disk_mb.is_some() && options.effective_workdir().trim_end_matches('/').is_empty() {
        return Err(SandboxError::config(
            "resources.disk_mb makes the root filesystem read-only, so the workdir cannot be `/`",
            "set CreateOptions::workdir to a directory such as /work, or leave disk_mb unset",
        ));
    }
    Ok(())
}

/// The deadline as whole Unix seconds, rounded up from `now + lifetime`.
fn deadline_secs(now: SystemTime, lifetime: Duration) -> u64 {
    let end = (now + lifetime)
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    end.as_secs() + u64::from(end.subsec_nanos() > 0)
}

pub(crate) fn container_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    format!("{NAME_PREFIX}{}-{n}", sandbox_core::labels::session_id())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::{EngineError, EngineErrorKind};

    fn image_gone() -> SandboxError {
        SandboxError::creation("test", "image gone")
            .with_source(EngineError::new(EngineErrorKind::NotFound, "no such image"))
    }

    fn other() -> SandboxError {
        SandboxError::config("refused", "fix it")
    }

    #[test]
    fn a_failed_mount_uploads_then_the_exec_path_takes_over() {
        let mut f = Fallbacks::new("test", false);
        let s = f.after::<()>(AgentDelivery::Mounted, Outcome::AgentFailed("mount".into()));
        assert!(matches!(s, Step::Attempt(AgentDelivery::Uploaded)));
        assert_eq!(f.mount_failure.as_deref(), Some("mount"));
        let s = f.after::<()>(
            AgentDelivery::Uploaded,
            Outcome::AgentFailed("hello".into()),
        );
        assert!(matches!(s, Step::Attempt(AgentDelivery::ExecPath)));
        assert_eq!(f.agent_failure.as_deref(), Some("hello"));
        let s = f.after::<()>(AgentDelivery::ExecPath, Outcome::AgentFailed("odd".into()));
        assert!(matches!(s, Step::Done(Err(_))));
        assert!(matches!(
            f.after(AgentDelivery::ExecPath, Outcome::Ready(7)),
            Step::Done(Ok(7))
        ));
    }

    #[test]
    fn a_stale_image_is_ensured_again_once_and_only_when_remembered() {
        let mut f = Fallbacks::new("test", false);
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(image_gone()));
        assert!(
            matches!(s, Step::Done(Err(_))),
            "checked with the engine: no retry"
        );
        let mut f = Fallbacks::new("test", false);
        f.image_remembered = true;
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(image_gone()));
        assert!(matches!(s, Step::EnsureImageAgain));
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(image_gone()));
        assert!(matches!(s, Step::Done(Err(_))), "once");
        let mut f = Fallbacks::new("test", false);
        f.image_remembered = true;
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(other()));
        assert!(matches!(s, Step::Done(Err(_))), "only for a missing image");
    }

    #[test]
    fn the_library_network_is_ensured_again_once_per_create() {
        let mut f = Fallbacks::new("test", true);
        f.image_remembered = true;
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(image_gone()));
        assert!(matches!(s, Step::EnsureImageAgain));
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(other()));
        assert!(matches!(s, Step::EnsureNetworkAgain(_)));
        // A new network: the image may be re-checked again, the network never again.
        f.new_network();
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(image_gone()));
        assert!(matches!(s, Step::EnsureImageAgain));
        let s = f.after::<()>(AgentDelivery::Uploaded, Outcome::Failed(other()));
        assert!(matches!(s, Step::Done(Err(_))));
        // Setup failures take only the network fallback.
        let mut f = Fallbacks::new("test", true);
        assert_eq!(
            f.recovery(&image_gone(), false),
            Recovery::EnsureNetworkAgain
        );
        assert_eq!(f.recovery(&image_gone(), false), Recovery::GiveUp);
    }

    #[test]
    fn lifetime_rounds_up() {
        let at = |ms: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(deadline_secs(at(100_900), Duration::from_secs(2)), 103);
        assert_eq!(deadline_secs(at(100_000), Duration::from_secs(2)), 102);
        assert_eq!(deadline_secs(at(100_000), Duration::from_millis(2500)), 103);
    }

    #[test]
    fn names_carry_the_provenance_prefix() {
        assert!(container_name().starts_with(NAME_PREFIX));
        assert_ne!(container_name(), container_name());
    }
}
