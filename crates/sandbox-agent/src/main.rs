//! The `sandbox-agent` binary: PID 1 of a container sandbox (see docs/agent.md).

#[cfg(target_os = "linux")]
fn main() {
    let mut raw = std::env::args_os().skip(1).peekable();
    if raw
        .peek()
        .is_some_and(|a| a == sandbox_agent::agent::pty::EXEC_FLAG)
    {
        raw.next();
        std::process::exit(sandbox_agent::agent::pty::exec_helper(raw));
    }
    let args = match sandbox_agent::agent::parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            // The container's log is the only place this can go; the host reads it when
            // the agent does not answer its hello.
            let _ = std::io::Write::write_all(
                &mut std::io::stderr(),
                format!("sandbox-agent: {e}\n").as_bytes(),
            );
            std::process::exit(2);
        }
    };
    std::process::exit(sandbox_agent::agent::run(args));
}

#[cfg(not(target_os = "linux"))]
fn main() {
    std::process::exit(2);
}
