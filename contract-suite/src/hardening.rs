//! Contract trials: the security defaults every sandbox gets, verified from inside the
//! sandbox (no-new-privileges, no effective capabilities, limits, interfaces, secrets).

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, IsolationTier, NetworkPolicy, Resources, Sandbox};

use crate::ctx::{Ctx, Need, Skip, run, run_ok, token};
use crate::limits::{expect_memory_limit, expect_pids_limit, read_cgroup};

const AREA: &str = "hardening";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let r = Need::Cap(C::RUN_COMMAND);
    // What these trials read is the kernel's view of the sandbox; on an in-process
    // backend it is a constant, not evidence.
    let k = Need::KernelEvidence;
    vec![
        ctx.trial(AREA, "no_new_privs_pid1", &[r, k], no_new_privs_pid1),
        ctx.trial(AREA, "no_new_privs_self", &[r, k], no_new_privs_self),
        ctx.trial(AREA, "cap_eff_zero_pid1", &[r, k], cap_eff_zero_pid1),
        ctx.trial(AREA, "cap_eff_zero_self", &[r, k], cap_eff_zero_self),
        ctx.trial(AREA, "limits_as_requested", &[r, k], limits_as_requested),
        ctx.trial(AREA, "pid1_is_an_init", &[r, k], pid1_is_an_init),
        ctx.trial(
            AREA,
            "swap_disabled_and_follows_memory",
            &[r, k],
            swap_disabled_and_follows_memory,
        ),
        ctx.trial(AREA, "cpu_quota_read_back", &[r, k], cpu_quota_read_back),
        ctx.trial(
            AREA,
            "interfaces_only_loopback_by_default",
            &[r, k],
            interfaces_only_loopback_by_default,
        ),
        ctx.trial(
            AREA,
            "secrets_not_in_engine_env",
            &[],
            secrets_not_in_engine_env,
        ),
        ctx.trial(
            AREA,
            "secrets_visible_to_process",
            &[r],
            secrets_visible_to_process,
        ),
    ]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// One field of a `/proc/<pid>/status` file, `None` when the file has no such line.
async fn status_field_opt(
    sb: &dyn Sandbox,
    file: &str,
    field: &str,
) -> anyhow::Result<Option<String>> {
    let out = run_ok(sb, ["cat", file]).await?;
    Ok(out.lines().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim() == field)
            .map(|(_, v)| v.trim().to_string())
    }))
}

/// One field of a `/proc/<pid>/status` file.
async fn status_field(sb: &dyn Sandbox, file: &str, field: &str) -> anyhow::Result<String> {
    status_field_opt(sb, file, field)
        .await?
        .with_context(|| format!("{file} has no {field} line"))
}

/// `prctl(PR_GET_NO_NEW_PRIVS)` (option 39) of a process inside the sandbox, through
/// python3's ctypes.
const PRCTL_GET_NO_NEW_PRIVS: &str =
    "import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))";

/// The `NoNewPrivs:` line of `file` must be `1`. Only when the kernel shows no such line
/// (gVisor's `/proc/<pid>/status` has none) is `prctl(PR_GET_NO_NEW_PRIVS)`, called by a
/// process INSIDE the sandbox, the evidence: it must return `1`. Neither available fails.
async fn expect_no_new_privs(ctx: Arc<Ctx>, c: &str, file: &str) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case(c)).await?;
    match status_field_opt(&*sb, file, "NoNewPrivs").await? {
        Some(v) => ensure!(v == "1", "{file} NoNewPrivs = {v:?}"),
        None => {
            let r = run(&*sb, ["python3", "-c", PRCTL_GET_NO_NEW_PRIVS]).await?;
            ensure!(
                r.exit_code == 0,
                "{file} has no NoNewPrivs line and prctl(PR_GET_NO_NEW_PRIVS) could not be \
                 called inside the sandbox: exit {} {:?}",
                r.exit_code,
                r.stderr_text()
            );
            let v = r.stdout_text();
            ensure!(
                v.trim() == "1",
                "{file} has no NoNewPrivs line and prctl(PR_GET_NO_NEW_PRIVS) inside the \
                 sandbox returned {:?}",
                v.trim()
            );
        }
    }
    sb.kill().await
}

/// The capability sets of `file` (a `/proc/<pid>/status`) that must be empty. A process
/// of a non-root user has an empty effective set even without `cap_drop ALL`, so the
/// evidence is the bounding set (what any process of the sandbox — root included — could
/// ever gain) and the permitted set, next to the effective one.
const EMPTY_CAP_SETS: [&str; 3] = ["CapEff", "CapPrm", "CapBnd"];

async fn expect_no_capabilities(ctx: Arc<Ctx>, c: &str, file: &str) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case(c)).await?;
    for set in EMPTY_CAP_SETS {
        let v = status_field(&*sb, file, set).await?;
        let bits = u64::from_str_radix(&v, 16).with_context(|| format!("{set} {v:?}"))?;
        ensure!(bits == 0, "{file} {set} = {v} (capabilities not dropped)");
    }
    sb.kill().await
}

/// PID 1 runs with no-new-privileges (`/proc/1/status`; where the kernel shows no
/// `NoNewPrivs` line — gVisor — the flag cannot be read for another process, so the
/// evidence is `prctl(PR_GET_NO_NEW_PRIVS)` of a sandbox process, which the runtime sets
/// from the same container configuration as PID 1's).
async fn no_new_privs_pid1(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    expect_no_new_privs(ctx, "no_new_privs_pid1", "/proc/1/status").await
}

/// User commands run with no-new-privileges (`/proc/self/status`, else in-sandbox
/// `prctl(PR_GET_NO_NEW_PRIVS)` where the kernel shows no `NoNewPrivs` line).
async fn no_new_privs_self(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    expect_no_new_privs(ctx, "no_new_privs_self", "/proc/self/status").await
}

/// PID 1 has no effective, permitted or bounding capabilities (`cap_drop ALL`, proven
/// even for a root PID 1 by the bounding set).
async fn cap_eff_zero_pid1(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    expect_no_capabilities(ctx, "cap_eff_zero_pid1", "/proc/1/status").await
}

/// User commands have no effective, permitted or bounding capabilities.
async fn cap_eff_zero_self(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    expect_no_capabilities(ctx, "cap_eff_zero_self", "/proc/self/status").await
}

/// Memory and pids limits read back exactly as requested (from the cgroup files inside;
/// under gVisor, which mounts no cgroup filesystem, from `MemTotal` inside and the
/// engine's limits — see `limits.rs`).
async fn limits_as_requested(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("limits_as_requested");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c)
                .resources(Resources::default().memory_mb(300).pids(64)),
        )
        .await?;
    expect_memory_limit(&*sb, 300).await?;
    expect_pids_limit(&ctx, &*sb, 64, 300).await?;
    sb.kill().await
}

/// With the default network policy the only interface is `lo`.
async fn interfaces_only_loopback_by_default(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("interfaces_only_loopback_by_default");
    let sb = ctx
        .create(&c, ctx.opts(&c).network(NetworkPolicy::default()))
        .await?;
    let r = run(&*sb, ["cat", "/proc/net/dev"]).await?;
    let ifs: Vec<String> = r
        .stdout_text()
        .lines()
        .filter_map(|l| l.split_once(':').map(|(n, _)| n.trim().to_string()))
        .filter(|n| !n.is_empty() && !n.contains('|'))
        .collect();
    ensure!(ifs == ["lo"], "interfaces by default: {ifs:?}");
    sb.kill().await
}

/// Secret values are not stored in the engine's configuration (`docker inspect`
/// `Config.Env`).
async fn secrets_not_in_engine_env(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("secrets_not_in_engine_env");
    let secret = token("sbx-secret-");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).secret("SBX_CONTRACT_SECRET", secret.as_str()),
        )
        .await?;
    let Some(env) = ctx
        .probes
        .engine_env(sb.id())
        .await
        .context("the engine_env probe failed")?
    else {
        sb.kill().await?;
        return Err(Skip("no engine_env probe".into()).into());
    };
    ensure!(
        !env.iter().any(|e| e.contains(&secret)),
        "the secret value is stored in the engine's env"
    );
    sb.kill().await
}

/// Secrets are visible to the sandboxed process as environment variables.
async fn secrets_visible_to_process(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("secrets_visible_to_process");
    let secret = token("sbx-secret-");
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).secret("SBX_CONTRACT_SECRET", secret.as_str()),
        )
        .await?;
    let out = run_ok(&*sb, ["printenv", "SBX_CONTRACT_SECRET"]).await?;
    ensure!(out.trim() == secret, "printenv shows {:?}", out.len());
    let out = run_ok(&*sb, "echo $SBX_CONTRACT_SECRET").await?;
    ensure!(
        out.trim() == secret,
        "shell expansion shows a different value"
    );
    sb.kill().await
}

/// The init processes engines run as PID 1 (`docker run --init` → `docker-init`,
/// `podman run --init` → catatonit mounted as `podman-init`, and the common standalone
/// ones), and sandbox-rs's own agent (`/.sandbox-agent`, which reaps every process and
/// owns their lifetimes, so there is nothing to forward signals to).
const INITS: [&str; 7] = [
    ".sandbox-agent",
    "docker-init",
    "podman-init",
    "tini",
    "catatonit",
    "dumb-init",
    "init",
];

/// PID 1 is an init that reaps zombies and forwards signals (`/proc/1/comm` names one),
/// never the user's shell or a `sleep`.
async fn pid1_is_an_init(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let sb = ctx.sandbox(&case("pid1_is_an_init")).await?;
    let comm = run_ok(&*sb, ["cat", "/proc/1/comm"]).await?;
    let comm = comm.trim();
    ensure!(
        INITS.contains(&comm),
        "PID 1 is {comm:?}, not an init ({INITS:?})"
    );
    sb.kill().await
}

/// Swap is disabled, also when the memory limit is raised above the default: with 1 GiB
/// of memory the cgroup allows no swap (`memory.swap.max` 0, or v1 memory+swap = memory);
/// under gVisor, which has no cgroup view, the engine holds memory+swap = memory.
async fn swap_disabled_and_follows_memory(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("swap_disabled_and_follows_memory");
    let mb = 1024;
    let sb = ctx
        .create(
            &c,
            ctx.opts(&c).resources(Resources::default().memory_mb(mb)),
        )
        .await?;
    expect_memory_limit(&*sb, mb).await?;
    let want = mb << 20;
    if let Some(v) = read_cgroup(&*sb, &["/sys/fs/cgroup/memory.swap.max"]).await? {
        ensure!(
            v == "0",
            "memory.swap.max is {v:?} with a {mb} MiB limit: swap is on"
        );
    } else if let Some(v) =
        read_cgroup(&*sb, &["/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes"]).await?
    {
        ensure!(
            v == want.to_string(),
            "memory+swap is {v:?} with a {want}-byte memory limit: swap is on"
        );
    } else {
        ensure!(
            sb.isolation() == IsolationTier::Gvisor,
            "no cgroup swap file inside the sandbox (tier {}): swap cannot be verified",
            sb.isolation()
        );
        let e = ctx
            .probes
            .engine_limits(sb.id())
            .await
            .context("the engine_limits probe failed")?
            .context("gVisor sandbox without a cgroup view and no engine_limits probe")?;
        ensure!(
            e.memory_bytes == want && e.memory_swap_bytes == want,
            "engine memory {} / memory+swap {}, requested {want} for both (no swap)",
            e.memory_bytes,
            e.memory_swap_bytes
        );
    }
    sb.kill().await
}

/// A CPU quota of half a core reads back as a quota/period of 0.5 (cgroup `cpu.max`, or
/// v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`; under gVisor the engine's `NanoCpus`).
async fn cpu_quota_read_back(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("cpu_quota_read_back");
    let sb = ctx
        .create(&c, ctx.opts(&c).resources(Resources::default().cpu(0.5)))
        .await?;
    let cores = if let Some(v) = read_cgroup(&*sb, &["/sys/fs/cgroup/cpu.max"]).await? {
        let (quota, period) = v
            .split_once(' ')
            .with_context(|| format!("cpu.max {v:?}"))?;
        ensure!(quota != "max", "cpu.max is {v:?}: no CPU quota");
        let q: f64 = quota.parse().with_context(|| format!("cpu.max {v:?}"))?;
        let p: f64 = period.parse().with_context(|| format!("cpu.max {v:?}"))?;
        q / p
    } else if let Some(q) = read_cgroup(&*sb, &["/sys/fs/cgroup/cpu/cpu.cfs_quota_us"]).await? {
        let p = read_cgroup(&*sb, &["/sys/fs/cgroup/cpu/cpu.cfs_period_us"])
            .await?
            .context("cpu.cfs_quota_us without cpu.cfs_period_us")?;
        let q: f64 = q.parse().with_context(|| format!("cfs_quota_us {q:?}"))?;
        let p: f64 = p.parse().with_context(|| format!("cfs_period_us {p:?}"))?;
        ensure!(q > 0.0, "cpu.cfs_quota_us is {q}: no CPU quota");
        q / p
    } else {
        ensure!(
            sb.isolation() == IsolationTier::Gvisor,
            "no cgroup cpu file inside the sandbox (tier {}): the quota cannot be verified",
            sb.isolation()
        );
        let e = ctx
            .probes
            .engine_limits(sb.id())
            .await
            .context("the engine_limits probe failed")?
            .context("gVisor sandbox without a cgroup view and no engine_limits probe")?;
        e.nano_cpus as f64 / 1e9
    };
    ensure!(
        (cores - 0.5).abs() < 0.01,
        "CPU quota reads back as {cores} cores, requested 0.5"
    );
    sb.kill().await
}
