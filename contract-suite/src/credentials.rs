//! Contract trials: brokered credentials (`CREDENTIALS`).
//!
//! What a declared `CREDENTIALS` promises where the suite can see it without a server of
//! its own: a sandbox created with a credential bound to the listed canary name holds
//! only the placeholder (its variable, every process's environ, cmdline and writable
//! memory, the files under /etc, /run and /tmp: the secret's bytes are in none of them); HTTPS to the bound
//! name is answered with a certificate the sandbox's installed bundle verifies, for that
//! name only; plain HTTP to it is refused by the proxy; and the bound host's other ports
//! are refused although the name is on the allowlist (its traffic goes through the proxy
//! or nowhere). That the bound host receives the real value, and another host only the
//! placeholder, needs servers the suite cannot start: the engine trials prove it
//! (`sandbox_testkit::trials::credentials`). Without `CREDENTIALS` a create with a
//! credential is refused with `CapabilityNotSupported`.
//!
//! Needs `python3` in the template, the canary and the egress names probes.

use std::sync::Arc;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::{Capability as C, Credential, ErrorCode, NetworkPolicy, Placement};

use crate::ctx::{Ctx, Need, Skip, must_code, sbx};

const AREA: &str = "credentials";

/// The secret the trials bind. Nothing inside a sandbox may ever hold these bytes.
const SECRET: &str = "sk-contract-5b1e0c7d93a24f68e2d0";

/// Python defining `readable_dump()`: every byte code inside the sandbox can read where a
/// secret could have been put — its environment, each process's `environ` and `cmdline`,
/// the writable memory of every other process it may read (`/proc/<pid>/mem` through
/// `/proc/<pid>/maps`: heap, stacks, anonymous and data mappings, at most 8 MiB a
/// process and 32 MiB in all), and the files (below 4 MiB) under `/etc`, `/run` and
/// `/tmp`. Prepended to the credentials probes (this area's and the engine trials'),
/// which search the result for the secret; `MEMORY_SCANNED` then lists the pids whose
/// memory was read. The agent (PID 1) is not among them: it makes itself undumpable, so
/// root inside, without `CAP_SYS_PTRACE`, cannot read its memory at all.
pub const READABLE_DUMP_PY: &str = r#"
import os
MEMORY_SCANNED = []
def memory_of(pid, budget):
    out = bytearray()
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", buffering=0)
    except Exception:
        return out
    with mem:
        for line in maps:
            f = line.split()
            lo, hi = (int(x, 16) for x in f[0].split("-"))
            # Writable mappings: where a process keeps what it was given or computed.
            if f[1][0] != "r" or f[1][1] != "w" or len(f) > 5 and f[5] in ("[vvar]", "[vsyscall]"):
                continue
            n = min(hi - lo, budget - len(out))
            if n <= 0:
                break
            try:
                mem.seek(lo)
                out += mem.read(n)
            except Exception:
                pass
    return out
def readable_dump():
    dump = bytearray(repr(dict(os.environ)).encode())
    budget = 32 << 20
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for f in ("environ", "cmdline"):
                try:
                    dump += open("/proc/%s/%s" % (pid, f), "rb").read()
                except Exception:
                    pass
            if int(pid) != os.getpid() and budget > 0:
                m = memory_of(pid, min(8 << 20, budget))
                if m:
                    MEMORY_SCANNED.append(int(pid))
                    budget -= len(m)
                    dump += m
    for root in ("/etc", "/run", "/tmp"):
        for d, _, files in os.walk(root):
            for f in files:
                p = os.path.join(d, f)
                try:
                    if os.path.isfile(p) and os.path.getsize(p) < (4 << 20):
                        dump += open(p, "rb").read()
                except Exception:
                    pass
    return dump
"#;

/// The program run inside: argv is the bound name and the canary's port; prints one
/// `name value` line per result and writes everything it could read to /tmp/dump.bin.
const PROBE: &str = r#"
import os, socket, ssl, sys
name, port = sys.argv[1], int(sys.argv[2])
ph = os.environ.get("API_KEY", "")
dump = readable_dump()
open("/tmp/dump.bin", "wb").write(dump)
print("placeholder", ph)
print("memory_scanned", ",".join(map(str, MEMORY_SCANNED)) or "none")
def https(sni):
    try:
        ctx = ssl.create_default_context()
        s = ctx.wrap_socket(socket.create_connection((name, 443), timeout=10), server_hostname=sni)
        s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nConnection: close\r\n\r\n" % (sni, ph)).encode())
        return "verified " + s.recv(12).decode("latin-1").replace(" ", "_")
    except ssl.SSLError as e:
        return "tls_refused " + type(e).__name__
    except Exception as e:
        return "failed " + type(e).__name__
print("https", https(name))
print("https_other_name", https("elsewhere.invalid"))
try:
    s = socket.create_connection((name, 80), timeout=10)
    s.sendall(("GET / HTTP/1.1\r\nHost: %s\r\n\r\n" % name).encode())
    print("plain", s.recv(12).decode("latin-1").replace(" ", "_"))
except Exception as e:
    print("plain failed_" + type(e).__name__)
try:
    s = socket.create_connection((name, port), timeout=10)
    print("direct", "token_" + s.recv(64).decode("latin-1").strip())
except Exception as e:
    print("direct", "refused_" + type(e).__name__)
"#;

pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    let declared = ctx.caps.contains(C::CREDENTIALS);
    let needs: &[Need] = if declared {
        &[
            Need::Cap(C::CREDENTIALS | C::RUN_COMMAND | C::FILESYSTEM),
            Need::Canary,
        ]
    } else {
        &[]
    };
    vec![ctx.trial(
        AREA,
        "the_sandbox_holds_only_the_placeholder_and_reaches_the_bound_host_through_the_proxy",
        needs,
        the_sandbox_holds_only_the_placeholder_and_reaches_the_bound_host_through_the_proxy,
    )]
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

fn credential(host: &str) -> Credential {
    Credential::new(
        "API_KEY",
        SECRET,
        [host],
        Placement::header_template("Authorization", "Bearer {}"),
    )
}

/// A credential bound to the listed canary name: the sandbox holds only the placeholder,
/// trusts the proxy for that name only, and reaches the name's host through the proxy or
/// not at all (plain HTTP refused, the canary's own port refused despite the allowlist).
/// Where `CREDENTIALS` is undeclared the create is refused.
async fn the_sandbox_holds_only_the_placeholder_and_reaches_the_bound_host_through_the_proxy(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let c =
        case("the_sandbox_holds_only_the_placeholder_and_reaches_the_bound_host_through_the_proxy");
    if !ctx.caps.contains(C::CREDENTIALS) {
        let opts = ctx
            .opts(&c)
            .network(NetworkPolicy::allow())
            .credential(credential("api.example.com"));
        must_code(
            ctx.backend.create(opts).await,
            ErrorCode::CapabilityNotSupported,
        )
        .context("create with a credential where CREDENTIALS is undeclared")?;
        return Ok(());
    }
    let canary = ctx.canary()?.clone();
    let Some(names) = ctx.probes.egress_names() else {
        return Err(Skip("no egress_names probe".into()).into());
    };
    let opts = ctx
        .opts(&c)
        .network(NetworkPolicy::allow_list([names.listed.clone()]))
        .credential(credential(&names.listed));
    let sb = ctx.create(&c, opts).await?;
    // The credential's own variable first (`printenv NAME` runs in every template): a
    // placeholder, never the value.
    let inside = crate::ctx::run(&*sb, ["printenv", "API_KEY"]).await?;
    let inside = inside.stdout_text();
    ensure!(
        !inside.contains(SECRET),
        "API_KEY inside the sandbox holds the secret itself"
    );
    ensure!(
        !inside.trim().is_empty(),
        "API_KEY is not set inside the sandbox: the placeholder is missing"
    );
    // A process that holds the placeholder and lives on beside the probe: the memory
    // scan has one more process to read (and the agent, where the kernel lets it).
    crate::ctx::run(
        &*sb,
        [
            "sh",
            "-c",
            "python3 -c 'import os, time; held = os.environ[\"API_KEY\"]; time.sleep(300)' \
             >/dev/null 2>&1 &",
        ],
    )
    .await?;
    sbx(
        sbx(sb.files(), "files")?
            .write(
                "/tmp/cred_probe.py",
                Bytes::from(format!("{READABLE_DUMP_PY}{PROBE}")),
            )
            .await,
        "write the probe",
    )?;
    let r = crate::ctx::run(
        &*sb,
        [
            "python3",
            "/tmp/cred_probe.py",
            names.listed.as_str(),
            canary.port.to_string().as_str(),
        ],
    )
    .await?;
    ensure!(
        r.exit_code == 0,
        "probe exited {}: {}",
        r.exit_code,
        r.stderr_text()
    );
    let dump = sbx(
        sbx(sb.files(), "files")?.read("/tmp/dump.bin").await,
        "read the dump",
    )?;
    let out: std::collections::BTreeMap<String, String> = r
        .stdout_text()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |k: &str| out.get(k).map(String::as_str).unwrap_or("<missing>");
    ensure!(
        !dump.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()),
        "the secret's bytes are readable inside the sandbox (environment, /proc or files)"
    );
    ensure!(
        get("memory_scanned") != "none",
        "the probe could read the memory of no other process inside: the memory scan \
         proved nothing"
    );
    let ph = get("placeholder");
    ensure!(
        !ph.is_empty() && ph != "<missing>" && ph != SECRET,
        "API_KEY inside is {ph:?}: it must hold a placeholder"
    );
    ensure!(
        dump.windows(ph.len()).any(|w| w == ph.as_bytes()),
        "the dump does not hold the placeholder: the probe read nothing"
    );
    ensure!(
        get("https").starts_with("verified HTTP/1.1"),
        "HTTPS to the bound name must be answered by the proxy with a certificate the \
         sandbox's bundle verifies: {}",
        get("https")
    );
    ensure!(
        get("https_other_name").starts_with("tls_refused"),
        "the proxy must present no certificate for a name that is not bound: {}",
        get("https_other_name")
    );
    ensure!(
        get("plain").starts_with("HTTP/1.1_403"),
        "plain HTTP to the bound name must be refused by the proxy: {}",
        get("plain")
    );
    ensure!(
        get("direct").starts_with("refused"),
        "the bound host's other ports must be refused (allowlisted or not): {}",
        get("direct")
    );
    sb.kill().await
}
