//! Contract trials: SSH agent forwarding (`SSH_AGENT`).
//!
//! What a declared `SSH_AGENT` promises, against a real `ssh-agent` the trial starts on
//! this host with two keys, one selected: a program inside the sandbox speaking the
//! ssh-agent protocol to `$SSH_AUTH_SOCK` lists exactly the selected key and gets a
//! signature with it that verifies on the host; signing with the other key, adding,
//! removing, locking and extensions are refused and leave the host agent as it was; a
//! gibibyte length prefix closes that connection and the socket goes on serving; a key
//! the agent does not hold refuses the create; after kill the sandbox is gone. The sandbox
//! is created through the layer with an audit sink: each message the relay answers is one
//! `ssh_agent.request` record (the lists and the sign with the selected key `ok`, the sign
//! with the fingerprint of the key it named; every refused message an error with
//! `SBX_E1401`), and no record holds a public key blob or a line of a private key.
//! Without `SSH_AGENT` a create asking for it is refused with `CapabilityNotSupported`
//! (`capabilities::every_undeclared_flag_refuses`).
//!
//! The trials need OpenSSH's client tools (`ssh-agent`, `ssh-add`, `ssh-keygen`) on the
//! host and `python3` in the template; without the tools they are ignored with the reason.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use libtest_mimic::Trial;
use sandbox_core::layer::{AuditRecord, Layer, MemorySink, Outcome};
use sandbox_core::{Capability as C, ErrorCode, SshAgentOptions, SshKey};
use tokio::process::{Child, Command};

use crate::ctx::{Ctx, Need, Skip, must_code, records_when, sbx};

/// Messages the probe sends that reach the relay: two lists, two signs, add, remove one,
/// remove all, lock and an extension (the forged length never leaves the sandbox).
const PROBE_MESSAGES: usize = 9;

const AREA: &str = "ssh_agent";

/// The program run inside: every request as raw protocol, one `name value` line per
/// result. Its argument is the unselected key's blob (base64), which it tries to sign
/// with.
pub const PROBE: &str = r#"
import base64, hashlib, os, socket, struct, sys
P = os.environ["SSH_AUTH_SOCK"]
def conn():
    s = socket.socket(socket.AF_UNIX)
    s.connect(P)
    s.settimeout(20)
    return s
def recvn(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b
def req(s, msg):
    s.sendall(struct.pack(">I", len(msg)) + msg)
    return recvn(s, struct.unpack(">I", recvn(s, 4))[0])
def string(b):
    return struct.pack(">I", len(b)) + b
def read_string(b, i):
    n = struct.unpack(">I", b[i:i + 4])[0]
    return b[i + 4:i + 4 + n], i + 4 + n
print("sock", P)
s = conn()
a = req(s, b"\x0b")
print("list_type", a[0])
keys, i = [], 5
for _ in range(struct.unpack(">I", a[1:5])[0]):
    blob, i = read_string(a, i)
    _, i = read_string(a, i)
    keys.append(blob)
print("keys", ",".join(base64.b64encode(k).decode() for k in keys))
msg, ns = b"signed inside the sandbox\n", b"file"
signed = b"SSHSIG" + string(ns) + string(b"") + string(b"sha512") + string(hashlib.sha512(msg).digest())
key = keys[0]
r = req(s, b"\x0d" + string(key) + string(signed) + struct.pack(">I", 0))
print("sign_type", r[0])
if r[0] == 14:
    sig, _ = read_string(r, 1)
    blob = b"SSHSIG" + struct.pack(">I", 1) + string(key) + string(ns) + string(b"") + string(b"sha512") + string(sig)
    print("signature", base64.b64encode(blob).decode())
other = base64.b64decode(sys.argv[1])
print("sign_other", req(s, b"\x0d" + string(other) + string(signed) + struct.pack(">I", 0))[0])
print("add", req(s, b"\x11" + string(b"ssh-ed25519") + string(b"\0" * 32) + string(b"\0" * 64) + string(b"evil"))[0])
print("remove_one", req(s, b"\x12" + string(key))[0])
print("remove_all", req(s, b"\x13")[0])
print("lock", req(s, b"\x16" + string(b"pw"))[0])
print("extension", req(s, b"\x1b" + string(b"session-bind@openssh.com"))[0])
f = conn()
try:
    f.sendall(struct.pack(">I", 1 << 30) + b"x" * 4096)
    got = f.recv(16)
    print("forged", "closed" if got == b"" else "answered")
except (ConnectionResetError, BrokenPipeError):
    print("forged", "closed")
except socket.timeout:
    print("forged", "hung")
print("list_after", req(conn(), b"\x0b")[0])
"#;

/// Lists the keys through `$SSH_AUTH_SOCK` and prints the first one's blob (base64).
const LIST_ONE: &str = r#"
import base64, os, socket, struct
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["SSH_AUTH_SOCK"])
s.sendall(struct.pack(">I", 1) + b"\x0b")
b = b""
while len(b) < 4 or len(b) < 4 + struct.unpack(">I", b[:4])[0]:
    c = s.recv(65536)
    if not c:
        raise EOFError
    b += c
a = b[4:]
n = struct.unpack(">I", a[5:9])[0]
print(base64.b64encode(a[9:9 + n]).decode())
"#;

/// The message the probe signs (in the `file` namespace of `ssh-keygen -Y`).
const SIGNED: &[u8] = b"signed inside the sandbox\n";

/// The trials of this area.
pub fn trials(ctx: &Arc<Ctx>) -> Vec<Trial> {
    // Undeclared, each trial checks the refusal instead (never an ignored trial).
    let declared = ctx.caps.contains(C::SSH_AGENT);
    let needs: &[Need] = if declared {
        &[Need::Cap(C::SSH_AGENT | C::RUN_COMMAND | C::FILESYSTEM)]
    } else {
        &[]
    };
    vec![
        ctx.trial(
            AREA,
            "the_sandbox_signs_with_the_selected_key_and_nothing_else",
            needs,
            the_sandbox_signs_with_the_selected_key_and_nothing_else,
        ),
        ctx.trial(
            AREA,
            "a_key_not_in_the_agent_refuses_the_create",
            &[],
            a_key_not_in_the_agent_refuses_the_create,
        ),
    ]
}

/// Where `SSH_AGENT` is undeclared: a create asking for forwarding is refused with
/// `CapabilityNotSupported` before any agent is looked for or anything is provisioned.
/// Returns whether the backend declares it (the trial's own checks apply then).
async fn declared_or_refused(ctx: &Ctx, c: &str) -> anyhow::Result<bool> {
    if ctx.caps.contains(C::SSH_AGENT) {
        return Ok(true);
    }
    let opts = ctx.opts(c).ssh_agent(SshAgentOptions::all_keys());
    must_code(
        ctx.backend.create(opts).await,
        ErrorCode::CapabilityNotSupported,
    )
    .context("create with ssh agent forwarding where SSH_AGENT is undeclared")?;
    Ok(false)
}

fn case(name: &str) -> String {
    format!("{AREA}::{name}")
}

/// An `ssh-agent` of this trial, its socket in a directory of its own; killed on drop.
pub struct HostAgent {
    child: Child,
    dir: PathBuf,
    /// The agent's socket.
    pub socket: PathBuf,
}

impl Drop for HostAgent {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl HostAgent {
    /// Starts `ssh-agent -D` and adds `n` new ed25519 keys; returns it and the keys'
    /// public key lines. A [`Skip`] when OpenSSH's client tools are not installed.
    pub async fn start(n: usize) -> anyhow::Result<(HostAgent, Vec<String>)> {
        let dir = tempfile::Builder::new()
            .prefix("sbx-ssh-agent-")
            .tempdir()
            .context("temp dir")?
            .keep();
        let socket = dir.join("agent.sock");
        let child = match Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&socket)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(Skip(format!(
                    "ssh-agent cannot start ({e}): install OpenSSH's client (openssh-client)"
                ))
                .into());
            }
        };
        let agent = HostAgent { child, dir, socket };
        for _ in 0..250 {
            if agent.socket.exists() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut lines = Vec::new();
        for i in 0..n {
            let key = agent.dir.join(format!("key{i}"));
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C"])
                .arg(format!("key{i}@contract"))
                .arg("-f")
                .arg(&key))
            .await?;
            run(Command::new("ssh-add")
                .env("SSH_AUTH_SOCK", &agent.socket)
                .arg(&key))
            .await?;
            let line = std::fs::read_to_string(key.with_extension("pub")).context("public key")?;
            lines.push(line.trim().to_string());
        }
        Ok((agent, lines))
    }

    /// How many keys `ssh-add -l` lists; an error when the agent refuses to list (it is
    /// locked).
    pub async fn listed(&self) -> anyhow::Result<usize> {
        let out = Command::new("ssh-add")
            .env("SSH_AUTH_SOCK", &self.socket)
            .arg("-l")
            .output()
            .await
            .context("ssh-add -l")?;
        ensure!(
            out.status.success(),
            "ssh-add -l failed (the host agent is locked or gone): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).lines().count())
    }

    /// Whether `ssh-keygen -Y verify` accepts the SSHSIG `signature` (base64) as `line`'s
    /// signature of [`SIGNED`] in namespace `file`.
    pub async fn verifies(&self, line: &str, signature: &str) -> anyhow::Result<bool> {
        let allowed = self.dir.join("allowed_signers");
        let sig = self.dir.join("message.sig");
        let msg = self.dir.join("message");
        std::fs::write(&allowed, format!("signer {line}\n"))?;
        let lines: Vec<&str> = signature
            .as_bytes()
            .chunks(70)
            .map(|c| std::str::from_utf8(c).unwrap_or_default())
            .collect();
        std::fs::write(
            &sig,
            format!(
                "-----BEGIN SSH SIGNATURE-----\n{}\n-----END SSH SIGNATURE-----\n",
                lines.join("\n")
            ),
        )?;
        std::fs::write(&msg, SIGNED)?;
        let status = Command::new("ssh-keygen")
            .args(["-Y", "verify", "-n", "file", "-I", "signer", "-f"])
            .arg(&allowed)
            .arg("-s")
            .arg(&sig)
            .stdin(std::fs::File::open(&msg)?)
            .stdout(Stdio::null())
            .status()
            .await
            .context("ssh-keygen -Y verify")?;
        Ok(status.success())
    }
}

async fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let out = cmd.output().await.with_context(|| format!("{cmd:?}"))?;
    ensure!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The blob of a public key line, base64 (its second field).
fn blob_b64(line: &str) -> &str {
    line.split_whitespace().nth(1).unwrap_or_default()
}

/// The sandbox lists exactly the selected key and signs with it (the signature verifies
/// on the host); signing with the other key, adding, removing one or all keys, locking
/// and extensions are refused, and the host agent still holds both keys, unlocked; a
/// gibibyte length prefix closes that connection and the socket goes on serving; where
/// `STOP_START` is declared, the socket serves again after a stop and a start; after kill
/// the sandbox is gone.
async fn the_sandbox_signs_with_the_selected_key_and_nothing_else(
    ctx: Arc<Ctx>,
) -> anyhow::Result<()> {
    let c = case("the_sandbox_signs_with_the_selected_key_and_nothing_else");
    if !declared_or_refused(&ctx, &c).await? {
        return Ok(());
    }
    let (agent, keys) = HostAgent::start(2).await?;
    let opts = ctx
        .opts(&c)
        .ssh_agent(SshAgentOptions::keys([SshKey::parse(&keys[0])?]).socket(&agent.socket));
    let sink = Arc::new(MemorySink::new());
    let audited = Layer::new().audit(sink.clone()).wrap(ctx.backend.clone());
    let sb = ctx.create_on(&audited, &c, opts).await?;
    let id = sb.id().to_string();
    sbx(
        sbx(sb.files(), "files")?
            .write("/tmp/ssh_probe.py", Bytes::from_static(PROBE.as_bytes()))
            .await,
        "write the probe",
    )?;
    let r = crate::ctx::run(&*sb, ["python3", "/tmp/ssh_probe.py", blob_b64(&keys[1])]).await?;
    ensure!(
        r.exit_code == 0,
        "probe exited {}: {}",
        r.exit_code,
        r.stderr_text()
    );
    let out: BTreeMap<String, String> = r
        .stdout_text()
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let get = |k: &str| out.get(k).map(String::as_str).unwrap_or("<missing>");
    ensure!(
        get("sock") == sandbox_core::ssh_agent::SSH_AUTH_SOCK_PATH,
        "SSH_AUTH_SOCK inside is {}",
        get("sock")
    );
    ensure!(
        get("list_type") == "12",
        "list answered {}",
        get("list_type")
    );
    ensure!(
        get("keys") == blob_b64(&keys[0]),
        "the list must hold exactly the selected key; it holds {}",
        get("keys")
    );
    ensure!(
        get("sign_type") == "14",
        "a sign request with the selected key answered {}",
        get("sign_type")
    );
    ensure!(
        agent.verifies(&keys[0], get("signature")).await?,
        "the signature made inside does not verify on the host"
    );
    for refused in [
        "sign_other",
        "add",
        "remove_one",
        "remove_all",
        "lock",
        "extension",
    ] {
        ensure!(
            get(refused) == "5",
            "{refused} must be refused with SSH_AGENT_FAILURE (5), got {}",
            get(refused)
        );
    }
    ensure!(
        get("forged") == "closed",
        "a gibibyte length prefix: {}",
        get("forged")
    );
    ensure!(
        get("list_after") == "12",
        "the socket stopped serving after the forged length"
    );
    let held = agent.listed().await?;
    ensure!(held == 2, "the host agent holds {held} keys, not its 2");
    let restarted = sb.capabilities().contains(C::STOP_START);
    if restarted {
        // A start runs a new agent: the handle that created the sandbox opens the socket
        // on it again.
        sbx(sb.stop().await, "stop")?;
        sbx(sb.start().await, "start")?;
        let listed = crate::ctx::run_ok(&*sb, ["python3", "-c", LIST_ONE]).await?;
        ensure!(
            listed.trim() == blob_b64(&keys[0]),
            "after stop and start the list holds {listed:?}"
        );
    }
    sb.kill().await?;
    if ctx.backend.as_reapable().is_some() && !ctx.listed(&c).await?.is_empty() {
        bail!("the sandbox is still listed after kill");
    }
    let expected = PROBE_MESSAGES + usize::from(restarted);
    let records = records_when(&sink, "ssh_agent.request", &id, |r| r.len() >= expected).await;
    audited_as_relayed_and_refused(&records, expected, &agent, &keys)
}

/// The relay's records: one per message (`expected`); the lists and the sign with the
/// selected key `ok`, the sign naming that key's fingerprint; the sign with the other key
/// and every other request errors with `SBX_E1401`; no record with a key's blob or a line
/// of its private key.
fn audited_as_relayed_and_refused(
    records: &[AuditRecord],
    expected: usize,
    agent: &HostAgent,
    keys: &[String],
) -> anyhow::Result<()> {
    let all = records
        .iter()
        .map(AuditRecord::to_json)
        .collect::<Vec<_>>()
        .join("\n");
    ensure!(
        records.len() == expected,
        "{} ssh_agent.request records for {expected} messages:\n{all}",
        records.len()
    );
    let mut material: Vec<String> = keys.iter().map(|k| blob_b64(k).to_string()).collect();
    for i in 0..keys.len() {
        let private = std::fs::read_to_string(agent.dir.join(format!("key{i}")))
            .context("the private key file")?;
        material.extend(
            private
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() > 16)
                .map(str::to_string),
        );
    }
    ensure!(
        material.len() > keys.len(),
        "no private key lines to look for"
    );
    for r in records {
        let json = r.to_json();
        ensure!(
            !material.iter().any(|m| json.contains(m.as_str())),
            "a record holds key material beyond a fingerprint: {json}"
        );
    }
    let fingerprint = |line: &str| SshKey::parse(line).map(|k| k.to_string());
    let (selected, other) = (fingerprint(&keys[0])?, fingerprint(&keys[1])?);
    let of = |request: &str| -> Vec<&AuditRecord> {
        records
            .iter()
            .filter(|r| r.request.as_deref() == Some(request))
            .collect()
    };
    let lists = of("list");
    ensure!(
        lists.len() >= 2 && lists.iter().all(|r| r.outcome == Outcome::Ok),
        "the lists are not all recorded as answered:\n{all}"
    );
    let signs = of("sign");
    ensure!(
        signs
            .iter()
            .any(|r| r.key.as_deref() == Some(selected.as_str()) && r.outcome == Outcome::Ok),
        "no record of the sign with the selected key {selected}:\n{all}"
    );
    ensure!(
        signs
            .iter()
            .any(|r| r.key.as_deref() == Some(other.as_str())
                && r.outcome == Outcome::Error
                && r.error_code == Some(ErrorCode::NetworkPolicyViolation.as_str())),
        "no refused record of the sign with the other key {other}:\n{all}"
    );
    for refused in [
        "add_identity",
        "remove_identity",
        "remove_all_identities",
        "lock",
        "extension",
    ] {
        let found = of(refused);
        ensure!(
            found.len() == 1
                && found[0].outcome == Outcome::Error
                && found[0].error_code == Some(ErrorCode::NetworkPolicyViolation.as_str()),
            "{refused}: want one refused record with SBX_E1401 in:\n{all}"
        );
    }
    Ok(())
}

/// A key the host agent does not hold refuses the create (`Configuration`, naming the
/// key), before anything is made.
async fn a_key_not_in_the_agent_refuses_the_create(ctx: Arc<Ctx>) -> anyhow::Result<()> {
    let c = case("a_key_not_in_the_agent_refuses_the_create");
    if !declared_or_refused(&ctx, &c).await? {
        return Ok(());
    }
    let (agent, _) = HostAgent::start(1).await?;
    let (other, others) = HostAgent::start(1).await?;
    drop(other);
    let absent = SshKey::parse(&others[0])?;
    let opts = ctx
        .opts(&c)
        .ssh_agent(SshAgentOptions::keys([absent.clone()]).socket(&agent.socket));
    let e = must_code(ctx.backend.create(opts).await, ErrorCode::Configuration)?;
    ensure!(
        e.render().contains(&absent.to_string()),
        "the refusal does not name the key: {}",
        e.render()
    );
    if ctx.backend.as_reapable().is_some() {
        ensure!(ctx.listed(&c).await?.is_empty(), "a sandbox was made");
    }
    Ok(())
}
