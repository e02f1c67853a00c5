//! What a sandbox can do: capability flags.

use bitflags::bitflags;

bitflags! {
    /// Features a backend or sandbox instance declares.
    ///
    /// A declared flag has passing contract trials; invoking an undeclared one returns
    /// [`SandboxError::CapabilityNotSupported`](crate::SandboxError::CapabilityNotSupported),
    /// never a no-op or an emulation. Capabilities are per sandbox instance.
    ///
    /// With the `serde` feature it serialises as its flag names, e.g. `"RUN_COMMAND | RUN_CODE"`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    pub struct Capability: u32 {
        /// `Sandbox::run` of commands.
        const RUN_COMMAND = 1 << 0;
        /// `Sandbox::run_code` without a context.
        const RUN_CODE = 1 << 1;
        /// `Sandbox::run_code` with a persistent interpreter per `context_id`.
        const STATEFUL_CODE = 1 << 2;
        /// `Sandbox::stream`.
        const STREAMING = 1 << 3;
        /// `Sandbox::files` (read, write, ls, mkdir, remove, stat).
        const FILESYSTEM = 1 << 4;
        /// `FileSystem::upload` / `FileSystem::download` of host paths.
        const UPLOAD_DOWNLOAD = 1 << 5;
        /// `RunOptions::pty`: commands on a pseudo-terminal, typed into and resized through
        /// `Process::input`.
        const PTY = 1 << 6;
        /// Pausing and resuming a sandbox.
        const PAUSE_RESUME = 1 << 7;
        /// Forks with memory: new sandboxes whose processes, interpreter contexts and files
        /// continue from one instant of a running sandbox (an engine that checkpoints
        /// processes). Filesystem snapshots alone are [`Capability::SNAPSHOT`].
        const SNAPSHOT_FORK = 1 << 8;
        /// GPU devices.
        const GPU = 1 << 9;
        /// Network policy (egress deny/allow) applied before user code runs.
        const NETWORK_POLICY = 1 << 10;
        /// Egress restricted to a host/CIDR allowlist.
        const EGRESS_ALLOWLIST = 1 << 11;
        /// Ingress ports published to the host.
        const INGRESS_PORTS = 1 << 12;
        /// Tunnels to the outside.
        const TUNNELS = 1 << 13;
        /// `RunOptions::stdin` (input given to a command run or streamed) and
        /// `RunOptions::interactive` (live input through `Process::input`).
        const STDIN = 1 << 14;
        /// `Resources::disk_mb`: what the sandbox can write is bounded (a read-only root
        /// filesystem with size-limited writable places, or an engine storage quota).
        const DISK_LIMIT = 1 << 15;
        /// The sandbox's processes run under an in-sandbox agent: its first process, which
        /// starts every command, enforces the lifetime and kills timed-out process trees
        /// from inside (where the kernel protects a first process, code in the sandbox
        /// cannot stop it). `CreateOptions::require_agent` needs it. A sandbox that runs
        /// without its agent (reattached with `connect`, or started without one) does not
        /// declare it, so a handle's capabilities say which way its commands go.
        const AGENT = 1 << 16;
        /// `Sandbox::extend`: the deadline moves later, up to `CreateOptions::max_lifetime`,
        /// and the moved deadline is enforced where the one set at create was (inside the
        /// sandbox, not only by the host).
        const EXTEND_LIFETIME = 1 << 17;
        /// `CreateOptions::idle_timeout`: a sandbox with no call and no running process
        /// for that long is removed, enforced inside the sandbox so it holds when the
        /// creating process is gone.
        const IDLE_TIMEOUT = 1 << 18;
        /// `Sandbox::snapshot`: the sandbox's filesystem becomes a template `create`
        /// accepts (without its secrets and without the agent), listed and removed through
        /// `ReapableBackend::list_snapshots` / `remove_snapshot`. Files only: processes and
        /// memory are not kept (that is [`Capability::SNAPSHOT_FORK`]). A sandbox whose
        /// writable places are outside its filesystem (a disk limit's scratch mounts) does
        /// not declare it.
        const SNAPSHOT = 1 << 19;
        /// `Sandbox::reset_processes`: every process in the sandbox except its first one
        /// is killed — stray background jobs, a fork bomb's leftovers — and its files,
        /// identity and policy are kept. Needs the in-sandbox agent (an engine's exec
        /// cannot start anything once the pids limit is exhausted).
        const RESET_PROCESSES = 1 << 23;
        /// `EgressTiers::host_ports`: single TCP ports of services on the host, reachable
        /// inside at `host.sandbox.internal` (the host's address on the sandbox's network)
        /// and no other port or address of the host, enforced where the egress rules
        /// live. Declared where `EGRESS_ALLOWLIST` is and the engine's network has an
        /// address of the host.
        const HOST_PORTS = 1 << 22;
        /// `Sandbox::set_egress` and `Sandbox::egress`: the egress policy of a running
        /// sandbox is replaced at once (one transaction where the rules live, read back
        /// before the call returns; connections the new policy forbids are cut) and read
        /// back from any handle. Declared where `EGRESS_ALLOWLIST` is.
        const LIVE_EGRESS = 1 << 21;
        /// `Sandbox::stop` / `Sandbox::start`: every process ends but the sandbox stays
        /// (its files, id, policy and labels), and a start brings it back usable with its
        /// network policy re-applied before anything of the user's runs. Interpreter
        /// contexts and running commands do not survive a stop (that is
        /// [`Capability::SNAPSHOT_FORK`]'s memory).
        const STOP_START = 1 << 20;
        /// `CreateOptions::ssh_agent`: a socket inside the sandbox (`SSH_AUTH_SOCK`)
        /// speaking the ssh-agent protocol, relayed to an agent on the host over the
        /// sandbox's own channel, which lists only the selected keys and signs only with
        /// them; every other request is refused on the host and no private key enters
        /// the sandbox. It stops working when the sandbox is killed.
        const SSH_AGENT = 1 << 24;
        /// `CreateOptions::git_repo`: a host repository served to the sandbox over git's
        /// smart HTTP by a gate on the host, reached through a loopback port inside the
        /// sandbox relayed over the sandbox's own channel; a per-sandbox token opens it,
        /// pushes land only under the chosen ref prefix (and only with read-write
        /// access), the repository's config, remotes and credentials are never served,
        /// and the gate is gone when the sandbox is killed.
        const GIT_GATE = 1 << 25;
        /// `CreateOptions::credential`: brokered credentials. Requests to the bound hosts
        /// (HTTP and HTTPS) are forced by the sandbox's own rules through a proxy on the
        /// host, which puts the real value where the sandbox sent the placeholder; the
        /// secret never enters the sandbox, and the proxy ends when it is killed.
        const CREDENTIALS = 1 << 26;
    }
}

impl Capability {
    /// The stable upper-case name of a single flag (`"RUN_CODE"`), or the names of
    /// several flags joined by `|`.
    pub fn names(self) -> String {
        let names: Vec<&str> = self.iter_names().map(|(n, _)| n).collect();
        if names.is_empty() {
            "NONE".to_string()
        } else {
            names.join("|")
        }
    }

    /// Every single flag, in declaration order.
    pub fn each() -> impl Iterator<Item = Capability> {
        Capability::all().iter()
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable() {
        assert_eq!(Capability::RUN_CODE.names(), "RUN_CODE");
        assert_eq!(
            (Capability::RUN_CODE | Capability::STREAMING).to_string(),
            "RUN_CODE|STREAMING"
        );
        assert_eq!(Capability::empty().to_string(), "NONE");
        assert_eq!(Capability::each().count(), 27);
        assert_eq!(Capability::GIT_GATE.names(), "GIT_GATE");
        assert_eq!(Capability::HOST_PORTS.names(), "HOST_PORTS");
        assert_eq!(Capability::SSH_AGENT.names(), "SSH_AGENT");
        assert_eq!(Capability::CREDENTIALS.names(), "CREDENTIALS");
        assert_eq!(Capability::LIVE_EGRESS.names(), "LIVE_EGRESS");
        assert_eq!(Capability::STOP_START.names(), "STOP_START");
        assert_eq!(Capability::EXTEND_LIFETIME.names(), "EXTEND_LIFETIME");
        assert_eq!(Capability::SNAPSHOT.names(), "SNAPSHOT");
        assert_eq!(Capability::RESET_PROCESSES.names(), "RESET_PROCESSES");
        assert_eq!(Capability::AGENT.names(), "AGENT");
        assert_eq!(Capability::DISK_LIMIT.names(), "DISK_LIMIT");
        assert_eq!(Capability::STDIN.names(), "STDIN");
    }
}
