//! The sandbox wrapper ([`EnforcedSandbox`]): each call on a wrapped sandbox — run,
//! run_code, stream, files, kill, ingress, pause, resume, stop, start, extend, snapshot,
//! fork, set_egress, reset_processes — is checked
//! (the shared state's gate), spanned and audited (its operation), then forwarded to the
//! adapter. A kill is idempotent, and nothing reaches the adapter after a successful one;
//! while paused, only resume, stop, kill and snapshot do; while stopped, only start, kill
//! and snapshot.

use std::any::Any;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use async_trait::async_trait;
use tracing::Instrument as _;

use crate::{
    Capability, CodeOptions, Command, ExecResult, FileSystem, ForkOptions, IsolationTier, Process,
    Result, RunOptions, Sandbox, Snapshot,
};

use super::files::EnforcedFiles;
use super::op::{op_span, output_bytes, sha256_hex};
use super::shared::Shared;

/// A sandbox wrapped in the enforcement layer.
pub struct EnforcedSandbox {
    pub(super) shared: Arc<Shared>,
    files: EnforcedFiles,
}

impl EnforcedSandbox {
    /// The wrapped sandbox of `shared`, with its file system.
    pub(super) fn new(shared: Arc<Shared>) -> Self {
        EnforcedSandbox {
            files: EnforcedFiles::new(shared.clone()),
            shared,
        }
    }
}

impl EnforcedSandbox {
    /// `pause` (`to_paused`) or `resume`: serialised with kills, refused once killed,
    /// always forwarded (the adapter's answer to a repeat is success).
    async fn pause_or_resume(&self, name: &'static str, to_paused: bool) -> Result<()> {
        let s = &self.shared;
        let span = if to_paused {
            op_span!("sandbox.pause", s.backend, s.tier)
        } else {
            op_span!("sandbox.resume", s.backend, s.tier)
        };
        let mut op = s.op(span.clone(), name);
        async move {
            let _serial = s.kill_lock.lock().await;
            if let Err(e) = s.require(Capability::PAUSE_RESUME) {
                return op.end(&s.layer, &s.redactor, Err(e));
            }
            if s.killed.load(Ordering::SeqCst) {
                let gone = Err(crate::SandboxError::gone(&s.id));
                return op.end(&s.layer, &s.redactor, gone);
            }
            if s.stopped.load(Ordering::SeqCst) {
                let stopped = Err(crate::SandboxError::stopped(&s.id));
                return op.end(&s.layer, &s.redactor, stopped);
            }
            // Forwarded even when this handle already is in that state: a handle
            // reattached to a sandbox paused elsewhere does not know it, and adapters
            // answer a repeated pause or resume with success.
            if s.paused.load(Ordering::SeqCst) == to_paused {
                op.noop();
            }
            let r = if to_paused {
                s.inner.pause().await
            } else {
                s.inner.resume().await
            };
            if r.is_ok() {
                s.paused.store(to_paused, Ordering::SeqCst);
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    /// `stop` (`to_stopped`) or `start`: serialised with kills, pauses and resumes,
    /// refused once killed, always forwarded (a handle reattached to a sandbox stopped
    /// elsewhere does not know it; adapters answer a repeat with success). A stop thaws
    /// a paused sandbox (the adapter's job); a start of a paused one is `SandboxPaused`.
    async fn stop_or_start(&self, name: &'static str, to_stopped: bool) -> Result<()> {
        let s = &self.shared;
        let span = if to_stopped {
            op_span!("sandbox.stop", s.backend, s.tier)
        } else {
            op_span!("sandbox.start", s.backend, s.tier)
        };
        let mut op = s.op(span.clone(), name);
        async move {
            let _serial = s.kill_lock.lock().await;
            if let Err(e) = s.require(Capability::STOP_START) {
                return op.end(&s.layer, &s.redactor, Err(e));
            }
            if s.killed.load(Ordering::SeqCst) {
                let gone = Err(crate::SandboxError::gone(&s.id));
                return op.end(&s.layer, &s.redactor, gone);
            }
            if !to_stopped && s.paused.load(Ordering::SeqCst) {
                let paused = Err(crate::SandboxError::paused(&s.id));
                return op.end(&s.layer, &s.redactor, paused);
            }
            if s.stopped.load(Ordering::SeqCst) == to_stopped {
                op.noop();
            }
            let r = if to_stopped {
                s.inner.stop().await
            } else {
                s.inner.start().await
            };
            if r.is_ok() {
                s.stopped.store(to_stopped, Ordering::SeqCst);
                if to_stopped {
                    s.paused.store(false, Ordering::SeqCst);
                }
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }
}

impl fmt::Debug for EnforcedSandbox {
    // The adapter's own `Debug` (which shows the id and never secrets): the layer adds
    // nothing a reader needs, and must not hide an adapter that leaks.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.shared.inner, f)
    }
}

#[async_trait]
impl Sandbox for EnforcedSandbox {
    fn id(&self) -> &str {
        &self.shared.id
    }
    fn backend(&self) -> &str {
        &self.shared.backend
    }
    fn capabilities(&self) -> Capability {
        self.shared.inner.capabilities()
    }
    fn isolation(&self) -> IsolationTier {
        self.shared.inner.isolation()
    }

    async fn run(&self, cmd: Command, options: RunOptions) -> Result<ExecResult> {
        let s = &self.shared;
        let span = op_span!("sandbox.run", s.backend, s.tier);
        let mut op = s.op(span.clone(), "sandbox.run").command(&cmd);
        let redactor = s.redactor.with(options.env.values().map(String::as_str));
        async move {
            let checked = s
                .require(Capability::RUN_COMMAND)
                .and_then(|()| s.alive())
                .and_then(|()| s.run_options(&cmd, options));
            let r = match checked {
                Ok(options) => s.inner.run(cmd, options).await,
                Err(e) => Err(e),
            };
            if let Ok(r) = &r {
                op.exit_code(r.exit_code);
                op.bytes(output_bytes(r));
            }
            op.end(&s.layer, &redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn run_code(&self, code: &str, options: CodeOptions) -> Result<ExecResult> {
        let s = &self.shared;
        let span = op_span!("sandbox.run_code", s.backend, s.tier);
        let mut op = s.op(span.clone(), "sandbox.run_code");
        let digest = sha256_hex(code.as_bytes());
        op.span.record("code_sha256", digest.as_str());
        op.record.code_sha256 = Some(digest);
        if s.layer.record_code {
            op.record.code = Some(code.to_string());
        }
        async move {
            let checked = s.alive().and_then(|()| s.code_options(options));
            let r = match checked {
                Ok(options) => s.inner.run_code(code, options).await,
                Err(e) => Err(e),
            };
            if let Ok(r) = &r {
                op.exit_code(r.exit_code);
                op.bytes(output_bytes(r));
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    fn stream(&self, cmd: Command, options: RunOptions) -> Result<Process> {
        let s = &self.shared;
        let span = op_span!("sandbox.stream", s.backend, s.tier);
        let _entered = span.enter();
        let op = s.op(span.clone(), "sandbox.stream").command(&cmd);
        let redactor = s.redactor.with(options.env.values().map(String::as_str));
        // The span covers starting the stream; the process runs after this returns, and
        // its output is the caller's (it starts on first poll).
        let r = s
            .require(Capability::STREAMING)
            .and_then(|()| s.alive())
            .and_then(|()| s.run_options(&cmd, options))
            .and_then(|options| s.inner.stream(cmd, options));
        op.end(&s.layer, &redactor, r)
    }

    fn files(&self) -> Result<&dyn FileSystem> {
        let s = &self.shared;
        match s.require(Capability::FILESYSTEM) {
            Ok(()) => Ok(&self.files),
            Err(e) => {
                // A refused `files()` is an operation too: it gets its span and record.
                let span = op_span!("sandbox.files", s.backend, s.tier);
                let _entered = span.enter();
                let op = s.op(span.clone(), "sandbox.files");
                op.end(&s.layer, &s.redactor, Err(e))
            }
        }
    }

    async fn kill(&self) -> Result<()> {
        let s = &self.shared;
        let span = op_span!("sandbox.kill", s.backend, s.tier);
        let mut op = s.op(span.clone(), "sandbox.kill");
        async move {
            let _serial = s.kill_lock.lock().await;
            if s.killed.load(Ordering::SeqCst) {
                op.noop();
                return op.end(&s.layer, &s.redactor, Ok(()));
            }
            let r = s.inner.kill().await;
            if r.is_ok() {
                s.killed.store(true, Ordering::SeqCst);
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn pause(&self) -> Result<()> {
        self.pause_or_resume("sandbox.pause", true).await
    }

    async fn extend(&self, by: std::time::Duration) -> Result<std::time::SystemTime> {
        let s = &self.shared;
        let span = op_span!("sandbox.extend", s.backend, s.tier);
        let op = s.op(span.clone(), "sandbox.extend");
        async move {
            // Serialised with kill: an extension never reaches a sandbox being removed.
            let _serial = s.kill_lock.lock().await;
            let checked = s.require(Capability::EXTEND_LIFETIME).and_then(|()| {
                // A paused sandbox's agent is frozen and could not answer.
                s.alive()?;
                if by.is_zero() {
                    return Err(crate::SandboxError::config(
                        "extend needs a positive duration",
                        "pass the time to add, e.g. Duration::from_secs(60)",
                    ));
                }
                Ok(())
            });
            let r = match checked {
                Ok(()) => s.inner.extend(by).await,
                Err(e) => Err(e),
            };
            if let Ok(to) = &r {
                s.moved_deadline(*to);
            }
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn resume(&self) -> Result<()> {
        self.pause_or_resume("sandbox.resume", false).await
    }

    async fn reset_processes(&self) -> Result<u32> {
        let s = &self.shared;
        let span = op_span!("sandbox.reset_processes", s.backend, s.tier);
        let op = s.op(span.clone(), "sandbox.reset_processes");
        async move {
            // Serialised with kill, pause and resume: a frozen agent could not answer.
            let _serial = s.kill_lock.lock().await;
            let checked = s
                .require(Capability::RESET_PROCESSES)
                .and_then(|()| s.alive());
            let r = match checked {
                Ok(()) => s.inner.reset_processes().await,
                Err(e) => Err(e),
            };
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn set_egress(&self, egress: crate::Egress) -> Result<()> {
        let s = &self.shared;
        let span = op_span!("sandbox.set_egress", s.backend, s.tier);
        let op = s.op(span.clone(), "sandbox.set_egress").egress(&egress);
        async move {
            // Serialised with kill: a change never reaches a sandbox being removed. A
            // paused sandbox's egress can change (nothing inside needs to answer): closing
            // the network of a frozen sandbox is what an incident wants.
            let _serial = s.kill_lock.lock().await;
            let checked = s.require(Capability::LIVE_EGRESS).and_then(|()| {
                if s.killed.load(Ordering::SeqCst) {
                    return Err(crate::SandboxError::gone(&s.id));
                }
                // A stopped sandbox has no network namespace to load rules into: start
                // it first (its policy is re-applied at start).
                if s.stopped.load(Ordering::SeqCst) {
                    return Err(crate::SandboxError::stopped(&s.id));
                }
                if !egress.host_ports().is_empty() {
                    s.require(Capability::HOST_PORTS)?;
                }
                if egress.lists_entries() {
                    s.require(Capability::EGRESS_ALLOWLIST)?;
                }
                crate::NetworkPolicy {
                    egress: egress.clone(),
                    ..Default::default()
                }
                .validate_egress()
            });
            let r = match checked {
                Ok(()) => s.inner.set_egress(egress).await,
                Err(e) => Err(e),
            };
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn egress(&self) -> Result<crate::Egress> {
        let s = &self.shared;
        s.require(Capability::LIVE_EGRESS)
            .and_then(|()| {
                if s.killed.load(Ordering::SeqCst) {
                    Err(crate::SandboxError::gone(&s.id))
                } else {
                    Ok(())
                }
            })
            .map_err(|e| s.layer.fill_support(e))?;
        s.inner.egress().await.map_err(|e| s.layer.fill_support(e))
    }

    async fn stop(&self) -> Result<()> {
        self.stop_or_start("sandbox.stop", true).await
    }

    async fn start(&self) -> Result<()> {
        self.stop_or_start("sandbox.start", false).await
    }

    async fn snapshot(&self) -> Result<Snapshot> {
        let s = &self.shared;
        let span = op_span!("sandbox.snapshot", s.backend, s.tier);
        let op = s.op(span.clone(), "sandbox.snapshot");
        async move {
            // Serialised with kill, pause and resume: the adapter may freeze the sandbox
            // while it reads the filesystem, and its thaw must not undo a caller's pause
            // made meanwhile. A paused sandbox can be snapshotted (its files are still).
            let _serial = s.kill_lock.lock().await;
            let checked = s.require(Capability::SNAPSHOT).and_then(|()| {
                if s.killed.load(Ordering::SeqCst) {
                    Err(crate::SandboxError::gone(&s.id))
                } else {
                    Ok(())
                }
            });
            let r = match checked {
                Ok(()) => s.inner.snapshot().await,
                Err(e) => Err(e),
            };
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    async fn fork(&self, options: ForkOptions) -> Result<Vec<Box<dyn Sandbox>>> {
        let s = &self.shared;
        let span = op_span!("sandbox.fork", s.backend, s.tier);
        let op = s.op(span.clone(), "sandbox.fork");
        async move {
            // Serialised with kill, pause and resume: the adapter stops and restores the
            // original, which must not race its removal or a freeze.
            let _serial = s.kill_lock.lock().await;
            let checked = s
                .require(Capability::SNAPSHOT_FORK)
                .and_then(|()| s.alive())
                .and_then(|()| options.validate());
            let r = match checked {
                Ok(()) => s.inner.fork(options.clone()).await,
                Err(e) => Err(e),
            };
            let r = r.map(|forks| {
                // Each fork's deadline as the layer knows it: its own timeout from now,
                // else the original's (a deadline counted from after the call is never
                // earlier than the adapter's).
                let deadline = match options.timeout {
                    Some(t) => Some(tokio::time::Instant::now() + t),
                    None => *s.deadline.lock().unwrap_or_else(|e| e.into_inner()),
                };
                forks
                    .into_iter()
                    .map(|f| {
                        Box::new(EnforcedSandbox::new(s.forked(f, deadline))) as Box<dyn Sandbox>
                    })
                    .collect::<Vec<_>>()
            });
            op.end(&s.layer, &s.redactor, r)
        }
        .instrument(span)
        .await
    }

    fn ingress_address(&self, port: u16) -> Result<std::net::SocketAddr> {
        let s = &self.shared;
        s.require(Capability::INGRESS_PORTS)
            .and_then(|()| s.alive())
            .and_then(|()| s.inner.ingress_address(port))
            .map_err(|e| s.layer.fill_support(e))
    }

    fn native(&self) -> &dyn Any {
        self.shared.inner.native()
    }
}
