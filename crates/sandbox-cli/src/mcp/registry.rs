//! The server's live sandboxes, shared by all its sessions: which session owns each (a
//! sandbox is reachable only from the session that created it), the total memory and CPU
//! budget they may hold together, the reservations a create takes before the engine is
//! called, and the teardown of a session's sandboxes when it ends or of all of them when
//! the server stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sandbox::{Sandbox, SandboxError};

/// At most this many live sandboxes per server, all sessions together.
pub(super) const MAX_SANDBOXES: usize = 16;

/// Default of `--total-memory-mb`: what all live sandboxes of the server may hold
/// together, in MiB (two sandboxes at the per-call maximum).
pub const DEFAULT_TOTAL_MEMORY_MB: u64 = 8192;

/// Default of `--total-cpus`: the CPU quota all live sandboxes of the server may hold
/// together, in cores.
pub const DEFAULT_TOTAL_CPUS: f64 = 8.0;

/// The server's total budget: the sum over its live sandboxes (and those being created)
/// of their memory limits and CPU quotas may not exceed it, so a client that may create
/// 16 sandboxes still cannot claim 16 times the per-call maximum.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budget {
    /// Total memory in MiB.
    pub memory_mb: u64,
    /// Total CPU quota in cores.
    pub cpus: f64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            memory_mb: DEFAULT_TOTAL_MEMORY_MB,
            cpus: DEFAULT_TOTAL_CPUS,
        }
    }
}

/// CPU quotas are summed in thousandths of a core, so adding and removing never drifts.
pub(super) fn millicores(cpus: f64) -> u64 {
    (cpus * 1000.0).round() as u64
}

/// What one sandbox holds of the server's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Claim {
    pub(super) count: usize,
    pub(super) memory_mb: u64,
    pub(super) millicores: u64,
}

impl Claim {
    pub(super) fn plus(self, o: Claim) -> Claim {
        Claim {
            count: self.count + o.count,
            memory_mb: self.memory_mb + o.memory_mb,
            millicores: self.millicores + o.millicores,
        }
    }

    pub(super) fn minus(self, o: Claim) -> Claim {
        Claim {
            count: self.count.saturating_sub(o.count),
            memory_mb: self.memory_mb.saturating_sub(o.memory_mb),
            millicores: self.millicores.saturating_sub(o.millicores),
        }
    }
}

/// Which MCP session a handler serves. Numbered by the server, never taken from the
/// client: rmcp hands each session its own handler, so holding the handler is holding the
/// session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Owner(u64);

impl Owner {
    pub(super) fn next() -> Owner {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Owner(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// A live sandbox of the server: the session it belongs to, what it holds of the budget,
/// and when its lifetime ends.
pub(super) struct Entry {
    pub(super) sandbox: Arc<dyn Sandbox>,
    pub(super) owner: Owner,
    pub(super) claim: Claim,
    pub(super) deadline: Instant,
}

/// Every live sandbox of the server, with what they hold together (creations in flight
/// included).
#[derive(Default)]
pub(super) struct Live {
    pub(super) entries: HashMap<String, Entry>,
    pub(super) held: Claim,
}

/// The server's sandboxes, shared by all its sessions, for teardown when it stops.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<Live>>);

impl Registry {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `id` out if `owner` created it. Another session's sandbox is left alone and
    /// reported as absent, exactly like an unknown id.
    pub(super) fn take(&self, id: &str, owner: Owner) -> Option<Arc<dyn Sandbox>> {
        let mut live = self.lock();
        if live.entries.get(id).is_none_or(|e| e.owner != owner) {
            return None;
        }
        let entry = live.entries.remove(id)?;
        live.held = live.held.minus(entry.claim);
        Some(entry.sandbox)
    }

    /// Takes out every sandbox `owner` created.
    pub(super) fn take_owned(&self, owner: Owner) -> Vec<Arc<dyn Sandbox>> {
        self.take_where(|e| e.owner == owner)
    }

    /// Moves the end of `id`'s lifetime to `deadline` when that is later (an extension):
    /// it counts until then, and is not released as expired at its old deadline.
    pub(super) fn move_deadline(&self, id: &str, deadline: Instant) {
        if let Some(e) = self.lock().entries.get_mut(id) {
            e.deadline = e.deadline.max(deadline);
        }
    }

    /// Takes out every sandbox whose lifetime is over: its container ended at its
    /// deadline, and it should stop counting against the limits. Returned to be killed
    /// anyway, so a container that outlived its deadline is removed from here too.
    pub(super) fn take_expired(&self, now: Instant) -> Vec<Arc<dyn Sandbox>> {
        self.take_where(|e| e.deadline <= now)
    }

    /// Takes out every sandbox whose entry `pick` selects, giving back what it held.
    fn take_where(&self, pick: impl Fn(&Entry) -> bool) -> Vec<Arc<dyn Sandbox>> {
        let mut live = self.lock();
        let picked: Vec<String> = live
            .entries
            .iter()
            .filter(|(_, e)| pick(e))
            .map(|(id, _)| id.clone())
            .collect();
        picked
            .iter()
            .filter_map(|id| {
                let entry = live.entries.remove(id)?;
                live.held = live.held.minus(entry.claim);
                Some(entry.sandbox)
            })
            .collect()
    }

    /// Takes out every sandbox, for the server's teardown.
    pub(super) fn drain(&self) -> Vec<Arc<dyn Sandbox>> {
        let mut live = self.lock();
        live.held = Claim::default();
        live.entries.drain().map(|(_, e)| e.sandbox).collect()
    }
}

/// Room held in the registry for a sandbox being created; given back when dropped,
/// unless [`Reservation::commit`] turned it into the sandbox's entry.
pub(super) struct Reservation {
    pub(super) registry: Registry,
    pub(super) claim: Claim,
}

impl Reservation {
    /// Holds `claim` if it fits beside everything live and in flight, else refuses naming
    /// the limit it would exceed. Counted before creating, so concurrent calls cannot
    /// overshoot.
    pub(super) fn take(
        registry: &Registry,
        claim: Claim,
        budget: Budget,
    ) -> sandbox::Result<Reservation> {
        let mut live = registry.lock();
        let after = live.held.plus(claim);
        if after.count > MAX_SANDBOXES {
            return Err(SandboxError::resource_limit(
                format!("live sandboxes of this MCP server ({MAX_SANDBOXES})"),
                Some("kill one with sandbox_kill first".into()),
            ));
        }
        if after.memory_mb > budget.memory_mb {
            return Err(SandboxError::resource_limit(
                format!(
                    "total memory of this MCP server's sandboxes ({} MiB; {} MiB held, {} MiB asked)",
                    budget.memory_mb, live.held.memory_mb, claim.memory_mb
                ),
                Some(
                    "kill a sandbox with sandbox_kill or ask for less memory_mb; the operator sets the total with --total-memory-mb"
                        .into(),
                ),
            ));
        }
        if after.millicores > millicores(budget.cpus) {
            return Err(SandboxError::resource_limit(
                format!(
                    "total cpus of this MCP server's sandboxes ({} cores; {} held, {} asked)",
                    budget.cpus,
                    live.held.millicores as f64 / 1000.0,
                    claim.millicores as f64 / 1000.0
                ),
                Some(
                    "kill a sandbox with sandbox_kill or ask for fewer cpus; the operator sets the total with --total-cpus"
                        .into(),
                ),
            ));
        }
        live.held = after;
        Ok(Reservation {
            registry: registry.clone(),
            claim,
        })
    }

    /// Registers the created sandbox; the room it held is now the entry's.
    pub(super) fn commit(
        mut self,
        id: String,
        sandbox: Arc<dyn Sandbox>,
        owner: Owner,
        deadline: Instant,
    ) {
        // Moved out, so the drop below gives nothing back.
        let claim = std::mem::take(&mut self.claim);
        let mut live = self.registry.lock();
        live.entries.insert(
            id,
            Entry {
                sandbox,
                owner,
                claim,
                deadline,
            },
        );
        drop(live);
    }
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut live = self.registry.lock();
        live.held = live.held.minus(self.claim);
    }
}

/// One MCP session's hold on its sandboxes. Its owner is set when the session's
/// `initialize` arrives; a handler without one (a request of a sessionless protocol
/// revision) can use no sandbox. When the session's handler goes (the client closed the
/// session, it idled out, the transport stopped), the sandboxes it created go too: no
/// other session may use them, so keeping them would only hold the server's budget.
pub(super) struct Session {
    pub(super) owner: OnceLock<Owner>,
    pub(super) registry: Registry,
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.get() {
            // A dropped handle kills its sandbox in the background, bounded by the
            // teardown grace (the library's guarantee); a tool call still running keeps
            // its own handle until it returns.
            drop(self.registry.take_owned(*owner));
        }
    }
}

/// Kills every sandbox of the server concurrently, each bounded by the teardown grace.
/// Returns how many kills failed.
pub async fn kill_all(registry: &Registry) -> usize {
    let all = registry.drain();
    let kills = all.iter().map(|sb| async move {
        let r = sb.kill().await;
        if let Err(e) = &r {
            tracing::warn!(
                sandbox_id = sb.id(),
                code = e.code().as_str(),
                "mcp teardown failed"
            );
        }
        r.is_err()
    });
    futures::future::join_all(kills)
        .await
        .into_iter()
        .filter(|failed| *failed)
        .count()
}
