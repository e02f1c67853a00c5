//! Starting a process in a sandbox: through the in-sandbox agent when it answered at
//! create, else through the engine's exec path. Every user command, helper with stdin and
//! interpreter starts here, so the choice is made once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandbox_core::{Capability, Process, Result, RunOptions, SandboxError};

use crate::engine::ContainerEngine;
use crate::sandbox::agent::ExecPath;
use crate::sandbox::shared::Shared;
use crate::sandbox::stdin::Stdin;

impl<E: ContainerEngine> Shared<E> {
    /// Which path user commands take.
    pub(crate) fn exec_path(&self) -> ExecPath {
        if self.agent().is_some() {
            ExecPath::Agent
        } else {
            ExecPath::Engine
        }
    }

    /// A user command as a [`Process`], through the agent when there is one.
    pub(crate) fn user_process(
        self: &Arc<Self>,
        argv: Vec<String>,
        options: &RunOptions,
        timeout: Duration,
    ) -> Result<Process> {
        let workdir = options.workdir.as_deref();
        let stdin = Stdin::of(options);
        if matches!(stdin, Stdin::Terminal(_)) && !self.caps.contains(Capability::PTY) {
            // Terminals come from the agent; the engine's exec path does not declare them.
            return Err(SandboxError::unsupported(
                Capability::PTY,
                self.engine.backend(),
            ));
        }
        self.process(argv, &options.env, workdir, timeout, stdin)
    }

    /// A process of `argv` reading `stdin`, through the agent when there is one, else the
    /// engine's exec path.
    pub(crate) fn process(
        self: &Arc<Self>,
        argv: Vec<String>,
        env: &BTreeMap<String, String>,
        workdir: Option<&str>,
        timeout: Duration,
        stdin: Stdin,
    ) -> Result<Process> {
        match self.agent() {
            Some(client) => {
                crate::sandbox::agent::process(self, &client, argv, env, workdir, timeout, stdin)
            }
            None => crate::sandbox::exec::process(self, argv, env, workdir, timeout, stdin),
        }
    }
}
