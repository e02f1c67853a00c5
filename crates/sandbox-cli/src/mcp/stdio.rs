//! MCP over stdin/stdout (rmcp's stdio transport): one client, the host that started this
//! process. stdout carries only the protocol; logs go to stderr through `tracing`. The
//! session ends at stdin EOF or a termination signal (SIGTERM, SIGHUP, Ctrl-C), and every
//! sandbox it created is killed then.

use rmcp::ServiceExt;
use sandbox::SandboxError;

use crate::exit_code;
use crate::mcp::registry::kill_all;
use crate::mcp::server::{Policy, SandboxServer};

/// Serves MCP on stdin/stdout until the client goes away or a termination signal arrives,
/// then tears every sandbox of the session down.
pub async fn serve(policy: Policy) -> sandbox::Result<u8> {
    let server = SandboxServer::new(policy);
    let registry = server.registry();
    let service = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| SandboxError::engine("mcp", format!("MCP initialisation failed: {e}")))?;
    let cancel = service.cancellation_token();
    let waiting = tokio::spawn(service.waiting());
    let signal = crate::signals::terminated();
    let interrupted = tokio::select! {
        _ = waiting => false,
        _ = signal => true,
    };
    // Stops the protocol loop (no new tool calls) before the sandboxes go.
    cancel.cancel();
    let failed = kill_all(&registry).await;
    if failed > 0 {
        tracing::warn!(
            failed,
            "some sandboxes of the MCP session could not be killed; see `sandbox reap`"
        );
    }
    Ok(match (interrupted, failed) {
        (true, _) => exit_code::INTERRUPTED,
        (false, 0) => exit_code::OK,
        _ => exit_code::FAILURE,
    })
}
