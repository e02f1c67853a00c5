//! The process table of one fake sandbox: every running exec, background job and
//! interpreter has a pid, so `kill -0 PID`, `$$` and `$!` work and a test can assert that
//! nothing was left running. Only the bookkeeping: starting a process task is `program`'s.

use std::collections::BTreeMap;

use tokio::task::AbortHandle;

/// PID of the (simulated) init process; it lives as long as the sandbox.
pub const INIT_PID: u32 = 1;

/// A running process of a fake sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProcessInfo {
    /// Process id.
    pub pid: u32,
    /// Process group: the pid of the exec that started it. Killing an exec kills its group.
    pub pgid: u32,
    /// The command line (argv joined with spaces).
    pub command: String,
}

struct Entry {
    pgid: u32,
    command: String,
    abort: Option<AbortHandle>,
}

/// Why a process could not be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpawnError {
    /// The pids limit is reached.
    PidsLimit,
}

pub(crate) struct ProcTable {
    next_pid: u32,
    limit: u64,
    entries: BTreeMap<u32, Entry>,
}

impl ProcTable {
    pub(crate) fn new(limit: u64) -> Self {
        ProcTable {
            next_pid: INIT_PID + 1,
            limit,
            entries: BTreeMap::new(),
        }
    }

    pub(crate) fn register(
        &mut self,
        pgid: Option<u32>,
        command: String,
    ) -> Result<u32, SpawnError> {
        // init counts as one process.
        if self.entries.len() as u64 + 1 >= self.limit {
            return Err(SpawnError::PidsLimit);
        }
        let pid = self.next_pid;
        self.next_pid += 1;
        self.entries.insert(
            pid,
            Entry {
                pgid: pgid.unwrap_or(pid),
                command,
                abort: None,
            },
        );
        Ok(pid)
    }

    pub(crate) fn set_abort(&mut self, pid: u32, handle: AbortHandle) {
        match self.entries.get_mut(&pid) {
            Some(e) => e.abort = Some(handle),
            // Already exited or killed before the handle was known: make sure it stops.
            None => handle.abort(),
        }
    }

    /// Marks `pid` as exited.
    pub(crate) fn exited(&mut self, pid: u32) {
        self.entries.remove(&pid);
    }

    /// Whether `pid` runs (init always does).
    pub(crate) fn alive(&self, pid: u32) -> bool {
        pid == INIT_PID || self.entries.contains_key(&pid)
    }

    /// Removes `pid` and returns its abort handle (to call outside the lock).
    pub(crate) fn kill(&mut self, pid: u32) -> Option<Option<AbortHandle>> {
        self.entries.remove(&pid).map(|e| e.abort)
    }

    /// Removes every process of group `pgid`; returns their abort handles.
    pub(crate) fn kill_group(&mut self, pgid: u32) -> Vec<AbortHandle> {
        let (group, rest): (BTreeMap<_, _>, _) = std::mem::take(&mut self.entries)
            .into_iter()
            .partition(|(_, e)| e.pgid == pgid);
        self.entries = rest;
        group.into_values().filter_map(|e| e.abort).collect()
    }

    /// Removes every process; returns their abort handles.
    pub(crate) fn kill_all(&mut self) -> Vec<AbortHandle> {
        std::mem::take(&mut self.entries)
            .into_values()
            .filter_map(|e| e.abort)
            .collect()
    }

    /// The running processes (init excluded).
    pub(crate) fn list(&self) -> Vec<ProcessInfo> {
        self.entries
            .iter()
            .map(|(pid, e)| ProcessInfo {
                pid: *pid,
                pgid: e.pgid,
                command: e.command.clone(),
            })
            .collect()
    }
}
