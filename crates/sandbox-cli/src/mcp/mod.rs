//! `sandbox mcp`: a Model Context Protocol server, so any MCP host (Claude Desktop, IDE
//! agents) can create sandboxes and run code in them without Rust.
//!
//! A sandbox belongs to the client session that created it; the server holds all of them
//! to a total budget, kills them when it stops, and each is bounded by its lifetime should
//! the server itself be killed. The tools and their limits are in [`server`]; the
//! transports that carry them are [`stdio`] (one client, the process that started us)
//! and [`http`] (streamable HTTP, for hosts that connect to a URL, behind the bearer
//! [`token`]); the images a call may name are the operator's [`images`] allowlist. This module turns the command line into [`McpOptions`] and picks the
//! transport.

mod http;
mod images;
mod registry;
mod server;
mod stdio;
mod token;

use crate::cli::McpArgs;
use crate::mcp::http::HttpOptions;
use crate::mcp::images::ImageAllowlist;
use crate::mcp::registry::Budget;
use crate::mcp::server::Policy;

/// How `sandbox mcp` serves, checked before anything binds: a refused address never
/// listens.
#[derive(Debug, Clone)]
pub struct McpOptions {
    /// What tool calls may ask for.
    pub policy: Policy,
    /// Streamable HTTP with these options, or stdio when `None`.
    pub http: Option<HttpOptions>,
}

impl TryFrom<&McpArgs> for McpOptions {
    type Error = sandbox::SandboxError;

    fn try_from(a: &McpArgs) -> sandbox::Result<Self> {
        let defaults = Budget::default();
        let policy = Policy {
            allow_egress: a.allow_egress,
            allow_engine_exec: a.allow_engine_exec,
            budget: Budget {
                memory_mb: a.total_memory_mb.unwrap_or(defaults.memory_mb),
                cpus: a.total_cpus.unwrap_or(defaults.cpus),
            },
            images: std::sync::Arc::new(ImageAllowlist::new(&a.allow_image)?),
            egress_hosts: a
                .egress_hosts
                .iter()
                .map(|h| sandbox::EgressRule::parse(h))
                .collect::<sandbox::Result<_>>()?,
            credentials: offered_credentials(&a.credential)?,
        };
        let http = match a.http {
            None => None,
            Some(addr) => Some(HttpOptions::new(
                addr,
                a.allow_non_loopback,
                a.token_env.as_deref(),
                |name| std::env::var(name).ok(),
            )?),
        };
        Ok(McpOptions { policy, http })
    }
}

/// The `--credential` values, read once at start; two with the same variable are
/// refused (a tool call names a credential by it).
fn offered_credentials(args: &[String]) -> sandbox::Result<Vec<sandbox::Credential>> {
    let mut offered: Vec<sandbox::Credential> = Vec::new();
    for arg in args {
        let c = crate::target::credential_of(arg)?;
        if offered.iter().any(|o| o.env_var == c.env_var) {
            return Err(sandbox::SandboxError::config(
                format!("--credential: {} is offered twice", c.env_var),
                "give each credential its own environment variable",
            ));
        }
        offered.push(c);
    }
    Ok(offered)
}

/// Serves MCP until the client goes away (stdio) or a termination signal arrives, then
/// tears every sandbox down; returns the exit code.
pub async fn serve(options: McpOptions) -> sandbox::Result<u8> {
    match options.http {
        Some(http) => http::serve(options.policy, http).await,
        None => stdio::serve(options.policy).await,
    }
}
