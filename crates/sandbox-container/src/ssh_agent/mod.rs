//! SSH agent forwarding (`CreateOptions::ssh_agent`): the host side of the relay socket
//! the in-sandbox agent opens at [`SSH_AUTH_SOCK_PATH`].
//!
//! At create, [`HostAgent::resolve`] finds the host agent and the selected keys in it (a
//! key that is not there refuses the create). Once the sandbox's agent answers, [`start`]
//! opens the socket inside and relays: every message the sandbox sends is decided here by
//! [`filter`] — a list is answered with the selected keys alone, a sign request for a
//! selected key goes to the host agent on a connection of its own, everything else fails
//! without reaching it. Each message answered is one `ssh_agent.request` audit record in
//! the sinks of the layer the sandbox was created under (its type, the fingerprint of the
//! key a sign named, refusals with `SBX_E1401`; never key material, data or signatures).
//! The relay is a task of this handle: it ends at kill (or when the handle is dropped, or
//! the sandbox's channel ends), and the socket inside answers nothing after.

pub(crate) mod filter;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sandbox_agent::client::{AgentClient, SshAgentRelay};
use sandbox_agent::protocol::SSH_AGENT_MAX_MESSAGE;
use sandbox_core::layer::{EventReporter, Outcome};
use sandbox_core::ssh_agent::{SSH_AUTH_SOCK_PATH, SshAgentOptions, fingerprint_of};
use sandbox_core::{ErrorCode, Result, SandboxError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use filter::{Decision, FAILURE, Identity};

/// The environment variable naming the socket inside the sandbox.
pub(crate) const SSH_AUTH_SOCK: &str = "SSH_AUTH_SOCK";

/// Longest one exchange with the host agent may take (a sign with a hardware key or a
/// confirmation prompt waits for a person).
const HOST_AGENT_TIMEOUT: Duration = Duration::from_secs(60);

/// Messages from the sandbox handled at once; the in-sandbox agent allows fewer, this
/// holds whatever it sends.
const CONCURRENT: usize = 4;

/// The host agent and the keys of it one sandbox may use.
#[derive(Debug, Clone)]
pub(crate) struct HostAgent {
    socket: PathBuf,
    selected: Arc<Vec<Identity>>,
    /// The audit sinks of the layer the sandbox was created under (taken in
    /// [`Self::resolve`], during its create).
    events: EventReporter,
}

/// What became of one message, for its audit record.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// Answered: the list, or the host agent's signature.
    Answered,
    /// Refused here by the filter, without reaching the host agent.
    Refused(&'static str),
    /// Passed to the host agent, which did not sign.
    HostFailed(String),
}

impl HostAgent {
    /// Finds the agent `options` names and the selected keys in it; refused (with what
    /// to do) when the agent does not answer or a key is not in it. Called during the
    /// layer's create, it keeps the layer's audit sinks for the relay's records.
    pub(crate) async fn resolve(options: &SshAgentOptions) -> Result<HostAgent> {
        let socket = match &options.socket {
            Some(s) => s.clone(),
            None => match std::env::var_os(SSH_AUTH_SOCK) {
                Some(s) if !s.is_empty() => PathBuf::from(s),
                _ => {
                    return Err(SandboxError::config(
                        "ssh_agent: SSH_AUTH_SOCK is not set and no agent socket was given",
                        "start an agent (`eval $(ssh-agent)` and `ssh-add`), or name its \
                         socket with SshAgentOptions::socket",
                    ));
                }
            },
        };
        let unreachable = |why: String| {
            SandboxError::config(
                format!(
                    "ssh_agent: the agent at {} does not answer: {why}",
                    socket.display()
                ),
                "check that the agent runs and SSH_AUTH_SOCK (or SshAgentOptions::socket) \
                 names its socket",
            )
        };
        let answer = exchange(&socket, &[filter::REQUEST_IDENTITIES])
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let held = filter::parse_identities(&answer)
            .ok_or_else(|| unreachable("its list of keys is malformed".into()))?;
        let selected: Vec<Identity> = if options.all_keys {
            held
        } else {
            let mut selected: Vec<Identity> = Vec::new();
            for key in &options.keys {
                let Some(found) = held.iter().find(|i| key.matches(&i.blob)) else {
                    return Err(SandboxError::config(
                        format!(
                            "ssh_agent: key {key} is not in the agent at {}",
                            socket.display()
                        ),
                        "add it with `ssh-add`, or name a key `ssh-add -l` lists",
                    ));
                };
                if !selected.contains(found) {
                    selected.push(found.clone());
                }
            }
            selected
        };
        if selected.is_empty() || selected.len() > sandbox_core::ssh_agent::MAX_SSH_KEYS {
            return Err(SandboxError::config(
                format!(
                    "ssh_agent: the agent at {} holds {} keys, 1 to {} can be offered",
                    socket.display(),
                    selected.len(),
                    sandbox_core::ssh_agent::MAX_SSH_KEYS
                ),
                "add a key with `ssh-add`, or name the keys the sandbox may use",
            ));
        }
        Ok(HostAgent {
            socket,
            selected: Arc::new(selected),
            events: EventReporter::current(),
        })
    }

    /// Fingerprints of the keys offered, for the log.
    pub(crate) fn fingerprints(&self) -> Vec<String> {
        self.selected
            .iter()
            .map(|i| fingerprint_of(&i.blob))
            .collect()
    }

    /// The answer to one message from the sandbox `sandbox_id`, its audit record written
    /// before it is returned (so the record is there by the time the sandbox reads it).
    async fn handle(&self, message: &[u8], sandbox_id: &str) -> Vec<u8> {
        let started = SystemTime::now();
        let (answer, verdict) = self.answer(message).await;
        let request = filter::request_name(message);
        tracing::debug!(
            sandbox_id,
            request,
            allowed = verdict == Verdict::Answered,
            "ssh agent request"
        );
        if self.events.is_active() {
            let mut r = self.events.record("ssh_agent.request", sandbox_id, started);
            r.request = Some(request);
            r.key = filter::sign_key(message).map(fingerprint_of);
            match verdict {
                Verdict::Answered => {}
                Verdict::Refused(why) => {
                    r.outcome = Outcome::Error;
                    r.error_code = Some(ErrorCode::NetworkPolicyViolation.as_str());
                    r.error = Some(why.to_string());
                }
                Verdict::HostFailed(why) => {
                    r.outcome = Outcome::Error;
                    r.error = Some(why);
                }
            }
            self.events.report(r);
        }
        answer
    }

    /// The answer to one message from the sandbox, and what became of it.
    async fn answer(&self, message: &[u8]) -> (Vec<u8>, Verdict) {
        match filter::decide(message, &self.selected) {
            Decision::Answer(a) => (a, Verdict::Answered),
            Decision::Refuse(why) => (vec![FAILURE], Verdict::Refused(why)),
            Decision::Sign(request) => match exchange(&self.socket, &request).await {
                Ok(a) => {
                    let checked = filter::checked_sign_answer(&a);
                    if checked == [FAILURE] {
                        let why = "the host agent did not sign (it failed, or its answer was \
                                   no signature)";
                        (checked, Verdict::HostFailed(why.to_string()))
                    } else {
                        (checked, Verdict::Answered)
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ssh_agent: the host agent did not sign");
                    let why = format!("the host agent did not answer: {e}");
                    (vec![FAILURE], Verdict::HostFailed(why))
                }
            },
        }
    }
}

/// The relay of one agent session; dropping it ends the relay.
#[derive(Debug)]
pub(crate) struct Relay(tokio::task::JoinHandle<()>);

impl Drop for Relay {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One sandbox's forwarding: the host agent with the selection, and the relay on the
/// agent session in use. Kept by the handle that created the sandbox, so a new session
/// of its own (a start after a stop, the original's restore after a fork) opens the
/// socket again; dropped (ending the relay) at kill.
#[derive(Debug)]
pub(crate) struct Forwarding {
    host: HostAgent,
    relay: Option<Relay>,
}

impl Forwarding {
    /// Opens the socket through `client` and starts relaying to `host`.
    pub(crate) async fn start(
        client: &AgentClient,
        host: HostAgent,
        sandbox_id: &str,
    ) -> Result<Forwarding> {
        let relay = start(client, host.clone(), sandbox_id).await?;
        Ok(Forwarding {
            host,
            relay: Some(relay),
        })
    }

    /// After this handle started a new session with the sandbox's agent (`client`): the
    /// old relay ends and the socket is opened again on the new session. Nothing when the
    /// sandbox has no forwarding.
    pub(crate) async fn resume(
        slot: &std::sync::Mutex<Option<Forwarding>>,
        client: &AgentClient,
        sandbox_id: &str,
    ) -> Result<()> {
        let host = {
            let mut f = slot.lock().unwrap_or_else(|p| p.into_inner());
            match f.as_mut() {
                Some(f) => {
                    f.relay = None;
                    f.host.clone()
                }
                None => return Ok(()),
            }
        };
        let relay = start(client, host, sandbox_id).await?;
        if let Some(f) = slot.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            f.relay = Some(relay);
        }
        Ok(())
    }
}

/// Opens the socket inside the sandbox `sandbox_id` through its agent and relays it to
/// `host`.
async fn start(client: &AgentClient, host: HostAgent, sandbox_id: &str) -> Result<Relay> {
    let relay = client
        .ssh_agent_listen(SSH_AUTH_SOCK_PATH)
        .await
        .map_err(|e| {
            SandboxError::config(
                format!(
                    "ssh_agent: the socket {SSH_AUTH_SOCK_PATH} could not be opened in the \
                     sandbox: {}",
                    e.render()
                ),
                "use an image whose /run is writable by its user (the root filesystem must \
                 not be read-only), or create the sandbox without ssh_agent",
            )
        })?;
    tracing::debug!(
        sandbox_id,
        keys = ?host.fingerprints(),
        "ssh agent forwarded"
    );
    Ok(Relay(tokio::spawn(relay_loop(
        relay,
        host,
        sandbox_id.to_string(),
    ))))
}

async fn relay_loop(mut relay: SshAgentRelay, host: HostAgent, sandbox_id: String) {
    let answers = relay.answers();
    let slots = Arc::new(tokio::sync::Semaphore::new(CONCURRENT));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Ok(m) = relay.next_message().await else {
            return;
        };
        let host = host.clone();
        let answers = answers.clone();
        let sandbox_id = sandbox_id.clone();
        tokio::spawn(async move {
            let answer = host.handle(&m.message, &sandbox_id).await;
            let _ = answers.answer(m.conn, &answer).await;
            drop(slot);
        });
    }
}

/// One request to the host agent on a connection of its own, and its answer (bounded in
/// size and time).
async fn exchange(socket: &std::path::Path, message: &[u8]) -> std::io::Result<Vec<u8>> {
    let talk = async {
        let mut s = UnixStream::connect(socket).await?;
        let mut framed = Vec::with_capacity(4 + message.len());
        framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
        framed.extend_from_slice(message);
        s.write_all(&framed).await?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len).await?;
        let len = u32::from_be_bytes(len) as usize;
        if len == 0 || len > SSH_AGENT_MAX_MESSAGE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("answer of {len} bytes"),
            ));
        }
        let mut answer = vec![0u8; len];
        s.read_exact(&mut answer).await?;
        Ok(answer)
    };
    tokio::time::timeout(HOST_AGENT_TIMEOUT, talk)
        .await
        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
}

#[cfg(test)]
mod tests;
