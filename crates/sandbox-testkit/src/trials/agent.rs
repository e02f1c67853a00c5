//! Attacks on the in-sandbox agent, written once and run by each adapter's tests against
//! its real engine (`tests/agent.rs` in sandbox-docker and sandbox-podman, through
//! [`agent_trials!`](crate::agent_trials)).
//!
//! Each trial runs sandboxed code as root inside an agent-mode sandbox on a [`backend`]
//! and checks a promise from the host side; it returns `Err` with what it saw when the
//! promise broke.

use std::time::{Duration, Instant};

use sandbox_core::{Backend, Command, CreateOptions, RunOptions, Sandbox};

use sandbox_container::{
    AGENT_PATH, ContainerBackend, ContainerConfig, ContainerEngine, ContainerNative,
    EngineErrorKind, ExecPath,
};

use crate::trial_engine::TrialEngine;

type Trial = std::result::Result<(), String>;

/// The image the trials create.
const BUSYBOX: &str = "sandbox-rs/busybox:latest";

/// The backend the trials run on: agent mode, no startup sweep, on `engine`.
pub async fn backend<E: ContainerEngine>(engine: E) -> ContainerBackend<E> {
    ContainerBackend::new(
        engine,
        ContainerConfig::new(BUSYBOX)
            .startup_sweep(false)
            .agent(true),
    )
    .await
}

/// A trial's sandbox: `lifetime`, and the metadata `test=<test>`.
fn trial_options(test: &str, lifetime: Duration) -> CreateOptions {
    CreateOptions::new(BUSYBOX)
        .timeout(lifetime)
        .metadata("test", test)
}

fn fail(what: impl std::fmt::Display) -> String {
    what.to_string()
}

async fn create<E: ContainerEngine>(
    b: &ContainerBackend<E>,
    options: CreateOptions,
) -> std::result::Result<Box<dyn Sandbox>, String> {
    let s = Backend::create(b, options)
        .await
        .map_err(|e| fail(format!("create: {}", e.render())))?;
    let path = s
        .native()
        .downcast_ref::<ContainerNative<E>>()
        .map(|n| n.exec_path);
    if path != Some(ExecPath::Agent) {
        return Err(fail(format!(
            "the sandbox does not use the agent (exec path {path:?}); the trial needs it"
        )));
    }
    Ok(s)
}

async fn sh(
    s: &dyn Sandbox,
    script: &str,
) -> std::result::Result<sandbox_core::ExecResult, String> {
    s.run(
        Command::Shell(script.to_string()),
        RunOptions::default().timeout(Duration::from_secs(30)),
    )
    .await
    .map_err(|e| fail(format!("run {script:?}: {}", e.render())))
}

/// Whether the engine still has the container (running or not).
async fn exists<E: ContainerEngine>(b: &ContainerBackend<E>, id: &str) -> Trial {
    match b.engine().inspect(id).await {
        Ok(c) if c.is_running() => Ok(()),
        Ok(_) => Err("stopped".into()),
        Err(e) if e.kind == EngineErrorKind::NotFound => Err("gone".into()),
        Err(e) => Err(format!("inspect failed: {e}")),
    }
}

/// Sandboxed root stops and kills PID 1 (and everything else) over and over, and its owner
/// walks away without any teardown: the container still ends at its deadline (a short
/// one: 6 s).
pub async fn deadline_survives_stop_and_kill_from_inside<E: ContainerEngine>(
    b: &ContainerBackend<E>,
) -> Trial {
    let options = trial_options("agent_deadline", Duration::from_secs(6));
    let lifetime = options.timeout;
    let created = Instant::now();
    let s = create(b, options).await?;
    let id = s.id().to_string();
    // A loop in the background that keeps signalling PID 1 until the end...
    let r = sh(
        &*s,
        "kill -STOP 1; kill -KILL 1; kill -TERM 1; kill -INT 1; \
         (while true; do kill -STOP 1; kill -KILL 1; sleep 0.05; done) \
         >/dev/null 2>&1 </dev/null & echo attacking",
    )
    .await?;
    if !String::from_utf8_lossy(&r.stdout).contains("attacking") {
        return Err(format!("the attack did not start: {r:?}"));
    }
    // ...and everything else stopped at once (`-1`: every process but PID 1 and the
    // caller; the loop itself freezes here, which is the attacker's own business).
    let r = sh(&*s, "kill -STOP -1; echo stopped").await?;
    if !String::from_utf8_lossy(&r.stdout).contains("stopped") {
        return Err(format!("kill -STOP -1 did not run: {r:?}"));
    }
    // PID 1 still answers after the signals.
    let r = sh(&*s, "echo alive").await?;
    if r.stdout.as_ref() != b"alive\n" {
        return Err(format!(
            "the agent stopped answering after kill -STOP/-KILL: {r:?}"
        ));
    }
    // The owner is "killed": the handle is leaked, so no kill and no drop teardown run.
    std::mem::forget(s);
    let bound = lifetime + Duration::from_secs(5);
    loop {
        match exists(b, &id).await {
            Ok(()) if created.elapsed() < bound => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Ok(()) => {
                let _ = b.engine().remove(&id).await;
                return Err(format!(
                    "the container still runs {:?} after create (lifetime {lifetime:?})",
                    created.elapsed()
                ));
            }
            Err(_) => {
                let took = created.elapsed();
                if took + Duration::from_millis(500) < lifetime {
                    return Err(format!(
                        "the container ended before its deadline ({took:?} < {lifetime:?})"
                    ));
                }
                // Ended (auto-remove may still be under way): make sure it goes.
                let _ = b.engine().remove(&id).await;
                return Ok(());
            }
        }
    }
}

/// Sandboxed root cannot read or write the agent's channel through `/proc/1`: the agent
/// is undumpable, so its fds and memory need CAP_SYS_PTRACE, which the sandbox lacks.
pub async fn agent_channel_is_out_of_reach<E: ContainerEngine>(b: &ContainerBackend<E>) -> Trial {
    let options = trial_options("agent_channel", Duration::from_secs(120));
    let s = create(b, options).await?;
    let attempts = [
        "echo forged > /proc/1/fd/1",
        "head -c 1 /proc/1/fd/0",
        "head -c 1 /proc/1/mem",
        "readlink /proc/1/fd/0",
        "cat /proc/1/environ",
    ];
    let mut out = Ok(());
    for a in attempts {
        let r = sh(&*s, &format!("{a} >/dev/null 2>&1")).await?;
        if r.exit_code == 0 {
            out = Err(format!("`{a}` succeeded inside the sandbox"));
            break;
        }
    }
    // The channel is intact after the attempts.
    if out.is_ok() {
        let r = sh(&*s, "echo still").await?;
        if r.stdout.as_ref() != b"still\n" {
            out = Err(format!("the sandbox stopped answering: {r:?}"));
        }
    }
    let _ = s.kill().await;
    out
}

/// A process that prints a well-formed protocol frame (the agent's "deadline" notice, which
/// would end the session if the host believed it) only produces output: its bytes come
/// back verbatim as that process's stdout, and the sandbox keeps working.
pub async fn forged_frame_on_stdout_is_only_output<E: ContainerEngine>(
    b: &ContainerBackend<E>,
) -> Trial {
    let options = trial_options("agent_forged_frame", Duration::from_secs(120));
    let s = create(b, options).await?;
    let body = br#"{"op":"deadline"}"#;
    let mut frame = ((body.len() + 5) as u32).to_be_bytes().to_vec();
    frame.push(1);
    frame.extend_from_slice(&0u32.to_be_bytes());
    frame.extend_from_slice(body);
    let octal: String = frame.iter().map(|b| format!("\\{b:03o}")).collect();
    let r = sh(&*s, &format!("printf '{octal}'; printf '{octal}' >&2")).await;
    let out = match r {
        Ok(r) if r.stdout.as_ref() == frame && r.stderr.as_ref() == frame => {
            match sh(&*s, "echo after").await {
                Ok(r) if r.stdout.as_ref() == b"after\n" => Ok(()),
                other => Err(format!("the sandbox stopped answering: {other:?}")),
            }
        }
        other => Err(format!(
            "the forged frame did not come back verbatim: {other:?}"
        )),
    };
    let _ = s.kill().await;
    out
}

/// The image with python3, for the interpreter trial.
const PYTHON: &str = "sandbox-rs/python:3.11";

/// User code in a stateful context writes frames to the interpreter driver's own response
/// channel (reachable as `__main__._wr`): a header announcing 1 TiB, then garbage. Each is
/// refused at once with a typed error (`ResourceLimitExceeded`, then `Engine`), nothing is
/// buffered, the context is killed (its state is gone, the next call starts afresh), and
/// other contexts and the sandbox are untouched.
pub async fn forged_interpreter_frames_kill_only_their_context<E: ContainerEngine>(
    b: &ContainerBackend<E>,
) -> Trial {
    use sandbox_core::{CodeOptions, ErrorCode};
    let options = CreateOptions::new(PYTHON)
        .timeout(Duration::from_secs(120))
        .metadata("test", "agent_forged_interpreter_frame");
    let s = create(b, options).await?;
    let out = async {
        let in_ctx = |id: &str| {
            CodeOptions::default()
                .context(id)
                .timeout(Duration::from_secs(30))
        };
        let code = |src: &'static str, id: &'static str| {
            let s = &s;
            async move {
                s.run_code(src, in_ctx(id))
                    .await
                    .map_err(|e| (e.code(), e.render()))
            }
        };
        for (id, forged, want) in [
            (
                "forger",
                "import __main__, struct\n__main__._wr.write(b'SBX1' + struct.pack('>Q', 1 << 40))",
                ErrorCode::ResourceLimitExceeded,
            ),
            (
                "garbler",
                "import __main__\n__main__._wr.write(b'garbage, not a frame')",
                ErrorCode::Engine,
            ),
        ] {
            match code("x = 41", id).await {
                Ok(r) if r.exit_code == 0 => {}
                other => return Err(fail(format!("setting state in {id}: {other:?}"))),
            }
            let t = Instant::now();
            match code(forged, id).await {
                Err((c, _)) if c == want => {}
                other => {
                    return Err(fail(format!(
                        "a forged frame in {id} gave {other:?}, not {want:?}"
                    )));
                }
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err(fail(format!(
                    "refusing the forged frame took {:?}",
                    t.elapsed()
                )));
            }
            match code("print(x)", id).await {
                Ok(r) if r.exit_code != 0 && r.stderr_text().contains("NameError") => {}
                other => {
                    return Err(fail(format!(
                        "after a forged frame, {id} kept its state (not killed): {other:?}"
                    )));
                }
            }
        }
        match code("y = 6 * 7", "bystander").await {
            Ok(r) if r.exit_code == 0 => {}
            other => return Err(fail(format!("bystander: {other:?}"))),
        }
        match code("print(y)", "bystander").await {
            Ok(r) if r.stdout_text() == "42\n" => Ok(()),
            other => Err(fail(format!(
                "the bystander context lost its state: {other:?}"
            ))),
        }
    }
    .await;
    let _ = s.kill().await;
    out
}

/// The bytes ctrl-p ctrl-q (an engine's default detach keys) in the host→agent stream do
/// not end the attach: a 4113-byte output chunk (one `write` of that size, which the
/// agent reads whole unless the pipe splits it) is acknowledged with the body
/// `00 00 10 11`. Ten rounds, so a split read in one round does not hide a detach.
pub async fn detach_keys_in_the_channel_do_not_detach<E: ContainerEngine>(
    b: &ContainerBackend<E>,
) -> Trial {
    let options = trial_options("agent_detach_keys", Duration::from_secs(120));
    let s = create(b, options).await?;
    let mut out = Ok(());
    for round in 0..10 {
        match sh(&*s, "dd if=/dev/zero bs=4113 count=1 2>/dev/null").await {
            Ok(r) if r.stdout.len() == 4113 => {}
            other => {
                out = Err(format!(
                    "round {round}: 4113 bytes did not come back: {other:?}"
                ));
                break;
            }
        }
    }
    if out.is_ok() {
        out = match sh(&*s, "echo attached").await {
            Ok(r) if r.stdout.as_ref() == b"attached\n" => Ok(()),
            other => Err(format!("the channel ended: {other:?}")),
        };
    }
    let _ = s.kill().await;
    out
}

/// Where the engine bind-mounts the agent from this host ([`ContainerEngine::supports_agent_mount`]):
/// the agent is a read-only mount that sandboxed root cannot overwrite, and nothing is
/// uploaded; the host file mounted holds this build's agent. When the engine cannot see the
/// host file after all (here: the decorated engine is handed a path that does not exist,
/// [`TrialEngine::agent_mount_unseen_once`]; the shared host copy is never touched),
/// `create` falls back to uploading it and the sandbox still runs the agent. Builds its own
/// [`backend`] on `engine`, decorated ([`TrialEngine`]) to learn which host file the
/// library mounts and to hide it.
pub async fn agent_is_mounted_read_only_or_uploaded<E: ContainerEngine>(engine: E) -> Trial {
    let b = backend(TrialEngine::new(engine)).await;
    let options = trial_options("agent_mount", Duration::from_secs(120));
    if !b.engine().supports_agent_mount() {
        return Err("the engine does not bind-mount the agent; nothing to prove here".into());
    }
    let mounts = "grep ' /.sandbox-agent ' /proc/self/mountinfo | wc -l";
    let s = create(&b, options.clone()).await?;
    let mounted = sh(&*s, mounts).await;
    let overwrite = sh(&*s, "echo x > /.sandbox-agent && echo overwritten").await;
    let ro = sh(&*s, "grep ' /.sandbox-agent ' /proc/self/mountinfo").await;
    let _ = s.kill().await;
    let mounted = mounted?;
    if String::from_utf8_lossy(&mounted.stdout).trim() != "1" {
        return Err(format!(
            "the agent is not bind-mounted at /.sandbox-agent: {mounted:?}"
        ));
    }
    let ro = ro?;
    if !String::from_utf8_lossy(&ro.stdout)
        .split_whitespace()
        .nth(5)
        .is_some_and(|opts| opts.split(',').any(|o| o == "ro"))
    {
        return Err(format!("the agent's mount is not read-only: {ro:?}"));
    }
    if overwrite?.stdout.as_ref() == b"overwritten\n" {
        return Err("sandboxed root overwrote the mounted agent".into());
    }
    // The engine was handed the library's host copy: this build's agent, as checked.
    let Some(path) = b.engine().agent_mounts().pop() else {
        return Err("no host copy of the agent was mounted although the engine mounts it".into());
    };
    let expected = sandbox_agent::prebuilt().ok_or("no agent ships for this architecture")?;
    if std::fs::read(&path).map_err(|e| format!("read {}: {e}", path.display()))? != expected {
        return Err(format!(
            "the mounted host copy {} is not this build's agent",
            path.display()
        ));
    }
    // An engine that cannot see the host file: the create still gets an agent, uploaded.
    b.engine().agent_mount_unseen_once();
    let s = create(&b, options).await?;
    let uploaded = sh(&*s, mounts).await;
    let _ = s.kill().await;
    let uploaded = uploaded?;
    if String::from_utf8_lossy(&uploaded.stdout).trim() != "0" {
        return Err(format!(
            "with the host file unseen by the engine the agent should have been uploaded, not mounted: {uploaded:?}"
        ));
    }
    Ok(())
}

/// Sandboxed code puts a FIFO where the host will read a result: `files().read` of it
/// (which the agent opens and then waits on for a writer that never comes) fails within
/// the call timeout instead of hanging the caller, and the sandbox's files and commands
/// keep working. Builds its own backend on `engine`, with a 3 s call timeout.
pub async fn fifo_read_fails_within_the_call_timeout<E: ContainerEngine>(engine: E) -> Trial {
    let call_timeout = Duration::from_secs(3);
    let b = ContainerBackend::new(
        engine,
        ContainerConfig::new(BUSYBOX)
            .startup_sweep(false)
            .agent(true)
            .call_timeout(call_timeout),
    )
    .await;
    let s = create(
        &b,
        trial_options("agent_fifo_read", Duration::from_secs(120)),
    )
    .await?;
    let out = async {
        sh(&*s, "mkfifo /work/result.json").await?;
        let files = s.files().map_err(|e| fail(e.render()))?;
        let t = Instant::now();
        let r = tokio::time::timeout(
            call_timeout + Duration::from_secs(10),
            files.read("/work/result.json"),
        )
        .await
        .map_err(|_| fail("files().read of a FIFO hung past the call timeout + 10 s"))?;
        match r {
            Ok(data) => return Err(format!("a FIFO read returned {} bytes", data.len())),
            Err(e) => {
                tracing::info!(after = ?t.elapsed(), error = %e.render(), "FIFO read refused")
            }
        }
        files
            .write("/work/after.txt", bytes::Bytes::from_static(b"after"))
            .await
            .map_err(|e| fail(format!("write after the FIFO: {}", e.render())))?;
        let back = files
            .read("/work/after.txt")
            .await
            .map_err(|e| fail(format!("read after the FIFO: {}", e.render())))?;
        if back.as_ref() != b"after" {
            return Err(format!("read after the FIFO gave {back:?}"));
        }
        match sh(&*s, "echo alive").await {
            Ok(r) if r.stdout.as_ref() == b"alive\n" => Ok(()),
            other => Err(format!("the sandbox stopped answering: {other:?}")),
        }
    }
    .await;
    let _ = s.kill().await;
    out
}

/// The image [`an_image_holding_the_agent_path_is_refused`] builds `FROM` the busybox test
/// image: a directory where the agent goes.
pub const AGENT_DIR_IMAGE: &str = "sandbox-rs/busybox-agent-dir:trial";

/// [`AGENT_DIR_IMAGE`], built now with the engine CLI `cli` (which may carry flags:
/// `podman --remote`) and removed when dropped, also when the trial fails.
struct AgentDirImage {
    cli: Vec<String>,
}

impl AgentDirImage {
    fn build(cli: &str) -> std::result::Result<AgentDirImage, String> {
        let image = AgentDirImage {
            cli: cli.split_whitespace().map(str::to_string).collect(),
        };
        let dir = std::env::temp_dir().join(format!("sbx-agent-dir-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("build context: {e}"))?;
        std::fs::write(
            dir.join("Dockerfile"),
            format!("FROM {BUSYBOX}\nRUN mkdir /.sandbox-agent && touch /.sandbox-agent/kept\nVOLUME /.sandbox-agent\n"),
        )
        .map_err(|e| format!("Dockerfile: {e}"))?;
        let context = dir.display().to_string();
        let built = image.run(&["build", "-q", "-t", AGENT_DIR_IMAGE, &context]);
        let _ = std::fs::remove_dir_all(&dir);
        if !built {
            return Err(format!("{cli} build of {AGENT_DIR_IMAGE} failed"));
        }
        Ok(image)
    }

    fn run(&self, args: &[&str]) -> bool {
        let (program, flags) = self.cli.split_first().expect("an engine CLI");
        let mut all: Vec<&str> = flags.iter().map(String::as_str).collect();
        all.extend_from_slice(args);
        crate::engine_cli::cli_succeeds(program, &all)
    }
}

impl Drop for AgentDirImage {
    fn drop(&mut self) {
        self.run(&["rmi", "-f", AGENT_DIR_IMAGE]);
    }
}

/// The managed containers of trial `test` the engine still holds.
async fn leftovers<E: ContainerEngine>(b: &ContainerBackend<E>, test: &str) -> Vec<String> {
    let filter = sandbox_core::labels::metadata_filter(
        &[("test".to_string(), test.to_string())]
            .into_iter()
            .collect(),
    );
    match b.engine().list(&filter).await {
        Ok(list) => list.into_iter().map(|c| c.id).collect(),
        Err(e) => vec![format!("(listing failed: {e})")],
    }
}

/// An image with its own `/.sandbox-agent` (here a directory, built with the engine CLI
/// `cli`) cannot take the agent: `create` refuses it with a `Configuration` error naming
/// the path, instead of quietly starting the sandbox on the engine's exec path (where
/// sandboxed root can stop PID 1 and kills run the image's own `/bin/sh`). Nothing is
/// left on the engine. Builds its own [`backend`] on `engine`.
pub async fn an_image_holding_the_agent_path_is_refused<E: ContainerEngine>(
    engine: E,
    cli: &str,
) -> Trial {
    use sandbox_core::ErrorCode;
    let b = backend(engine).await;
    let _image = AgentDirImage::build(cli)?;
    let test = "agent_image_path";
    let options = CreateOptions::new(AGENT_DIR_IMAGE)
        .timeout(Duration::from_secs(60))
        .metadata("test", test);
    let out = match Backend::create(&b, options).await {
        Ok(s) => {
            let path = s
                .native()
                .downcast_ref::<ContainerNative<E>>()
                .map(|n| n.exec_path);
            let _ = s.kill().await;
            Err(format!(
                "an image with /.sandbox-agent as a directory was accepted (exec path {path:?})"
            ))
        }
        Err(e) if e.code() == ErrorCode::Configuration && e.to_string().contains(AGENT_PATH) => {
            tracing::info!(error = %e.render(), "refused");
            Ok(())
        }
        Err(e) => Err(format!(
            "refused, but not as a Configuration error naming {AGENT_PATH}: {}",
            e.render()
        )),
    };
    let left = leftovers(&b, test).await;
    for id in &left {
        let _ = b.engine().remove(id).await;
    }
    out?;
    if !left.is_empty() {
        return Err(format!("the refused create left containers: {left:?}"));
    }
    Ok(())
}

/// The exec path a sandbox of engine `E` reports, and whether it declares `AGENT`.
fn path_of<E: ContainerEngine>(s: &dyn Sandbox) -> (Option<ExecPath>, bool) {
    let path = s
        .native()
        .downcast_ref::<ContainerNative<E>>()
        .map(|n| n.exec_path);
    (
        path,
        s.capabilities().contains(sandbox_core::Capability::AGENT),
    )
}

/// `CreateOptions::require_agent` never ends on the engine's exec path, and every handle
/// says which path it takes:
/// - on a backend with the agent off (`off`), a required agent is refused with
///   `CapabilityNotSupported` naming `AGENT`, and the backend does not declare it;
/// - with the agent on, a required-agent sandbox runs on the agent and declares `AGENT`;
/// - when the agent never answers (the engine refuses the attach of both agent attempts),
///   a required agent is refused with `Configuration`, nothing left behind; without
///   `require_agent` the same create falls back to the exec path, and that sandbox
///   declares neither `AGENT` nor `PTY`;
/// - a handle reattached with `connect` takes the agent over and declares `AGENT` too
///   where the engine keeps the agent's stdin open across attaches (Docker), else takes
///   the exec path and does not declare it (Podman).
pub async fn require_agent_refuses_the_exec_path<E: ContainerEngine>(engine: E, off: E) -> Trial {
    use sandbox_core::{Capability, ErrorCode, SandboxError};
    let test = "agent_required";
    let options = || trial_options(test, Duration::from_secs(60));
    let off = ContainerBackend::new(
        off,
        ContainerConfig::new(BUSYBOX)
            .startup_sweep(false)
            .agent(false),
    )
    .await;
    if Backend::capabilities(&off).contains(Capability::AGENT) {
        return Err("a backend with the agent off declares AGENT".into());
    }
    match Backend::create(&off, options().require_agent(true)).await {
        Err(SandboxError::CapabilityNotSupported { capability, .. })
            if capability == Capability::AGENT => {}
        Ok(s) => {
            let _ = s.kill().await;
            return Err("the agent-off backend created a sandbox that requires the agent".into());
        }
        Err(e) => {
            return Err(format!(
                "the agent-off backend refused, but not as AGENT unsupported: {}",
                e.render()
            ));
        }
    }
    let takes_over = engine.attach_survives_detach();
    let b = backend(TrialEngine::new(engine)).await;
    if !Backend::capabilities(&b).contains(Capability::AGENT) {
        return Err("a backend with the agent on does not declare AGENT".into());
    }
    let s = create(&b, options().require_agent(true)).await?;
    let declared = path_of::<TrialEngine<E>>(&*s);
    // A second handle on the same sandbox, as `sandbox exec` makes one.
    let reattached = b.connect_container(s.id()).await;
    let reattached = match reattached {
        Ok(r) => {
            let got = (
                Some(r.exec_path()),
                r.capabilities().contains(Capability::AGENT),
            );
            // Dropping it would remove the sandbox the first handle still uses.
            std::mem::forget(r);
            Ok(got)
        }
        Err(e) => Err(e.render()),
    };
    let _ = s.kill().await;
    if declared != (Some(ExecPath::Agent), true) {
        return Err(format!(
            "a required-agent sandbox reports {declared:?}, not the agent"
        ));
    }
    match reattached {
        Ok((Some(ExecPath::Agent), true)) if takes_over => {}
        Ok((Some(ExecPath::Engine), false)) if !takes_over => {}
        other => {
            return Err(format!(
                "a reattached handle reports {other:?} (the engine keeps stdin across \
                 attaches: {takes_over})"
            ));
        }
    }
    // Both agent attempts (mounted or uploaded) get a refused attach.
    b.engine().refuse_attaches(2);
    let refused = Backend::create(&b, options().require_agent(true)).await;
    b.engine().refuse_attaches(0);
    let refused = match refused {
        Err(e)
            if e.code() == ErrorCode::Configuration && e.to_string().contains("require_agent") =>
        {
            Ok(())
        }
        Err(e) => Err(format!(
            "a failed agent with require_agent gave {} instead of a Configuration refusal",
            e.render()
        )),
        Ok(s) => {
            let path = path_of::<TrialEngine<E>>(&*s);
            let _ = s.kill().await;
            Err(format!(
                "a failed agent with require_agent still gave a sandbox: {path:?}"
            ))
        }
    };
    let left = leftovers(&b, test).await;
    for id in &left {
        let _ = b.engine().remove(id).await;
    }
    refused?;
    if !left.is_empty() {
        return Err(format!("the refused create left containers: {left:?}"));
    }
    b.engine().refuse_attaches(2);
    let fell_back = Backend::create(&b, options()).await;
    b.engine().refuse_attaches(0);
    let s = fell_back.map_err(|e| format!("the fallback create failed: {}", e.render()))?;
    let got = path_of::<TrialEngine<E>>(&*s);
    let pty = s.capabilities().contains(Capability::PTY);
    let ran = sh(&*s, "echo fallback").await;
    let _ = s.kill().await;
    if got != (Some(ExecPath::Engine), false) || pty {
        return Err(format!(
            "a sandbox on the exec path reports {got:?} (PTY {pty}), not the exec path without AGENT"
        ));
    }
    match ran {
        Ok(r) if r.stdout.as_ref() == b"fallback\n" => Ok(()),
        other => Err(format!("the exec-path sandbox did not run: {other:?}")),
    }
}

/// A handle reattached with `connect` runs through the sandbox's agent, taking it over
/// from whoever had it, and the sandbox survives every way the earlier host can be gone
/// (on an engine whose attach ends keep PID 1's stdin open; elsewhere — Podman — the
/// reattached handle reports the exec path, and the creator keeps its agent):
/// - the creator's handle is still attached in this process: the reattached handle runs
///   on the agent (exec path `Agent`, declares `AGENT`); the creator's next command fails
///   with `Connect` (its session ended) instead of reading the new session's replies;
/// - that reattached handle's process side is dropped without removing the container
///   (`mem::forget`, as `sandbox exec` leaves it), then a host writes half a frame and
///   goes away (a process that died mid-frame): the next `connect` still gets the agent,
///   its command runs, and the container still runs — before, the agent read the next
///   host's bytes as the rest of that frame and exited, and PID 1 exiting ended the
///   sandbox.
pub async fn reattached_handle_takes_the_agent_over<E: ContainerEngine>(engine: E) -> Trial {
    use sandbox_core::{Capability, ErrorCode};
    use tokio::io::AsyncWriteExt;
    let takes_over = engine.attach_survives_detach();
    let b = backend(TrialEngine::new(engine)).await;
    let s = create(
        &b,
        trial_options("agent_takeover", Duration::from_secs(120)),
    )
    .await?;
    let id = s.id().to_string();
    let result = async {
        sh(&*s, "echo first > /work/f").await?;
        if !takes_over {
            return reattached_handle_keeps_to_the_exec_path(&b, &*s).await;
        }
        let r1 = b
            .connect_container(&id)
            .await
            .map_err(|e| format!("connect: {}", e.render()))?;
        let got = (
            r1.exec_path(),
            r1.capabilities().contains(Capability::AGENT),
        );
        let seen = sh(&r1, "cat /work/f").await;
        let creator = s
            .run(Command::Shell("true".into()), RunOptions::default())
            .await;
        // Dropping it would remove the sandbox; its process side goes away without that.
        std::mem::forget(r1);
        if got != (ExecPath::Agent, true) {
            return Err(format!(
                "a reattached handle reports {got:?}, not the agent with AGENT"
            ));
        }
        let seen = seen?;
        if seen.stdout_text() != "first\n" {
            return Err(format!("the reattached handle read {seen:?}"));
        }
        match creator {
            Err(e) if e.code() == ErrorCode::Connect => {}
            Err(e) => {
                return Err(format!(
                    "the creator's handle after the takeover failed with {}, not Connect",
                    e.render()
                ));
            }
            Ok(r) => {
                return Err(format!(
                    "the creator's handle still ran after the takeover: {r:?}"
                ));
            }
        }
        // A host that died mid-frame: a stdin frame announcing 1000 bytes, 10 of them sent.
        let mut attach = b
            .engine()
            .attach(&id)
            .await
            .map_err(|e| format!("raw attach: {e}"))?;
        let mut partial = vec![0, 0, 0x03, 0xed, 2, 0, 0, 0, 7];
        partial.extend_from_slice(&[b'x'; 10]);
        attach
            .input
            .write_all(&partial)
            .await
            .map_err(|e| format!("writing half a frame: {e}"))?;
        let _ = attach.input.flush().await;
        drop(attach);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let r2 = b
            .connect_container(&id)
            .await
            .map_err(|e| format!("connect after a host died mid-frame: {}", e.render()))?;
        let path = r2.exec_path();
        let ran = sh(&r2, "cat /work/f; echo second").await;
        std::mem::forget(r2);
        exists(&b, &id)
            .await
            .map_err(|e| format!("after a host died mid-frame the container is {e}"))?;
        if path != ExecPath::Agent {
            return Err(format!(
                "after a host died mid-frame the reattached handle reports {path:?}"
            ));
        }
        match ran {
            Ok(r) if r.stdout_text() == "first\nsecond\n" => Ok(()),
            other => Err(format!(
                "after a host died mid-frame the new session ran {other:?}"
            )),
        }
    }
    .await;
    let _ = s.kill().await;
    result
}

/// On an engine that closes PID 1's stdin when an attach ends: the reattached handle
/// takes the exec path and says so, the creator's handle keeps its agent, and the
/// sandbox lives on.
async fn reattached_handle_keeps_to_the_exec_path<E: ContainerEngine>(
    b: &ContainerBackend<TrialEngine<E>>,
    s: &dyn Sandbox,
) -> Trial {
    use sandbox_core::Capability;
    let r = b
        .connect_container(s.id())
        .await
        .map_err(|e| format!("connect: {}", e.render()))?;
    let got = (r.exec_path(), r.capabilities().contains(Capability::AGENT));
    let seen = sh(&r, "cat /work/f").await;
    std::mem::forget(r);
    if got != (ExecPath::Engine, false) {
        return Err(format!(
            "on an engine that ends the agent with an attach, a reattached handle reports \
             {got:?}, not the exec path without AGENT"
        ));
    }
    match seen {
        Ok(r) if r.stdout_text() == "first\n" => {}
        other => return Err(format!("the reattached handle read {other:?}")),
    }
    match sh(s, "echo creator").await {
        Ok(r) if r.stdout_text() == "creator\n" => {}
        other => return Err(format!("the creator's agent after a connect ran {other:?}")),
    }
    exists(b, s.id()).await
}

/// Whether `engine` gives PID 1 the kernel's protection, which two trials need; prints
/// why `test` is skipped when it does not. gVisor's sentry does not: root inside can stop
/// or kill PID 1 and open `/proc/1/fd/*` (measured with runsc; docs/agent.md, "gVisor").
#[allow(clippy::print_stdout)]
pub fn pid1_is_protected<E: ContainerEngine>(engine: &E, test: &str) -> bool {
    if engine.tier() == sandbox_core::IsolationTier::Gvisor {
        println!(
            "skipping {test} under gVisor: it lets sandboxed root signal PID 1 and open \
             /proc/1/fd (docs/agent.md, \"gVisor\")"
        );
        return false;
    }
    true
}

/// Lists the agent trials as `#[tokio::test]`s of the calling test binary.
///
/// `engine:` an expression that, inside an async test, yields `Option<E>` for a
/// [`ContainerEngine`] `E` (`None`: skip); `cli:` the engine's own CLI (`"docker"`,
/// `"podman --remote"`), which builds the images some trials need. The trials that need the kernel's PID-1
/// protection skip under gVisor ([`pid1_is_protected`]).
#[macro_export]
macro_rules! agent_trials {
    (engine: $engine:expr, cli: $cli:expr $(,)?) => {
        #[tokio::test(flavor = "multi_thread")]
        async fn deadline_survives_stop_and_kill_from_inside() {
            let Some(e) = $engine else { return };
            if !$crate::trials::agent::pid1_is_protected(
                &e,
                "deadline_survives_stop_and_kill_from_inside",
            ) {
                return;
            }
            let b = $crate::trials::agent::backend(e).await;
            $crate::trials::agent::deadline_survives_stop_and_kill_from_inside(&b)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn agent_channel_is_out_of_reach() {
            let Some(e) = $engine else { return };
            if !$crate::trials::agent::pid1_is_protected(&e, "agent_channel_is_out_of_reach") {
                return;
            }
            let b = $crate::trials::agent::backend(e).await;
            $crate::trials::agent::agent_channel_is_out_of_reach(&b)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn forged_frame_on_stdout_is_only_output() {
            let Some(e) = $engine else { return };
            let b = $crate::trials::agent::backend(e).await;
            $crate::trials::agent::forged_frame_on_stdout_is_only_output(&b)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn detach_keys_in_the_channel_do_not_detach() {
            let Some(e) = $engine else { return };
            let b = $crate::trials::agent::backend(e).await;
            $crate::trials::agent::detach_keys_in_the_channel_do_not_detach(&b)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn agent_is_mounted_read_only_or_uploaded() {
            let Some(e) = $engine else { return };
            $crate::trials::agent::agent_is_mounted_read_only_or_uploaded(e)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn fifo_read_fails_within_the_call_timeout() {
            let Some(e) = $engine else { return };
            $crate::trials::agent::fifo_read_fails_within_the_call_timeout(e)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn an_image_holding_the_agent_path_is_refused() {
            let Some(e) = $engine else { return };
            $crate::trials::agent::an_image_holding_the_agent_path_is_refused(e, $cli)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn require_agent_refuses_the_exec_path() {
            let Some(e) = $engine else { return };
            let Some(off) = $engine else { return };
            $crate::trials::agent::require_agent_refuses_the_exec_path(e, off)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn reattached_handle_takes_the_agent_over() {
            let Some(e) = $engine else { return };
            $crate::trials::agent::reattached_handle_takes_the_agent_over(e)
                .await
                .unwrap();
        }

        #[tokio::test(flavor = "multi_thread")]
        async fn forged_interpreter_frames_kill_only_their_context() {
            let Some(e) = $engine else { return };
            let b = $crate::trials::agent::backend(e).await;
            $crate::trials::agent::forged_interpreter_frames_kill_only_their_context(&b)
                .await
                .unwrap();
        }
    };
}
