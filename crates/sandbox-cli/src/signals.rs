//! Termination signals: Ctrl-C (SIGINT), SIGTERM (systemd, Kubernetes, CI cancellation)
//! and SIGHUP (the terminal went away) all mean "tear down and exit".

use tokio::signal::unix::{SignalKind, signal};

/// Resolves on the first SIGINT, SIGTERM or SIGHUP. The handlers are installed when this
/// is called (not when first polled), so call it before creating any sandbox.
pub fn terminated() -> impl Future<Output = ()> + Send + 'static {
    any_of(vec![
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ])
}

/// SIGINT or SIGTERM; SIGHUP is caught and ignored (the `create` holder outlives the
/// terminal it was started from by design).
pub fn terminated_not_hangup() -> impl Future<Output = ()> + Send + 'static {
    let hangup = signal(SignalKind::hangup());
    let rest = any_of(vec![SignalKind::interrupt(), SignalKind::terminate()]);
    async move {
        let _keep_ignoring = hangup;
        rest.await
    }
}

fn any_of(kinds: Vec<SignalKind>) -> impl Future<Output = ()> + Send + 'static {
    // A handler that cannot be installed (no signal driver) never fires; the others still do.
    let mut streams: Vec<_> = kinds
        .into_iter()
        .filter_map(|k| match signal(k) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot install a signal handler");
                None
            }
        })
        .collect();
    async move {
        if streams.is_empty() {
            return std::future::pending().await;
        }
        let waits = streams.iter_mut().map(|s| Box::pin(s.recv()));
        futures::future::select_all(waits).await;
    }
}
