//! Feeding a process's stdin while its output is read.
//!
//! The input is written by a task of its own, not before the output is read: a command
//! like `cat` given more than a pipe holds blocks writing its output until someone reads
//! it, and would never read the rest of its input. The task ends with the output stream
//! (dropping it aborts the feed). A command that exits without reading all its input
//! makes the feed fail; that is not the command's failure (a shell pipe ignores it too),
//! so the feed's error is only traced.

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sandbox_core::{OutputChunk, Result};
use tokio::task::JoinHandle;

/// Aborts the feed task when the output stream it belongs to is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs `feed` beside `output`, whose life it is tied to from now on.
pub(crate) fn beside(
    output: &mut BoxStream<'static, Result<OutputChunk>>,
    feed: BoxFuture<'static, std::io::Result<()>>,
) {
    let task = tokio::spawn(async move {
        if let Err(e) = feed.await {
            tracing::debug!(error = %e, "stdin feed ended early (the process stopped reading)");
        }
    });
    let guard = AbortOnDrop(task);
    let inner = std::mem::replace(output, futures::stream::empty().boxed());
    *output = inner
        .map(move |item| {
            let _keep = &guard;
            item
        })
        .boxed();
}
