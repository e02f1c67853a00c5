//! What a user process reads on stdin ([`Stdin`]), and feeding it while its output is
//! read.
//!
//! The input is written by a task of its own, not before the output is read: a command
//! like `cat` given more than a pipe holds blocks writing its output until someone reads
//! it, and would never read the rest of its input. The task ends with the output stream
//! (dropping it aborts the feed). A command that exits without reading all its input
//! makes the feed fail; that is not the command's failure (a shell pipe ignores it too),
//! so the feed's error is only traced.

use bytes::Bytes;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sandbox_core::{InputSink, OutputChunk, PtySize, Result, RunOptions};
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::task::JoinHandle;

/// What a user process reads on stdin.
#[derive(Debug, Clone)]
pub(crate) enum Stdin {
    /// End of input at once.
    Closed,
    /// These bytes, then end of input (`RunOptions::stdin`).
    Given(Bytes),
    /// Live input through `Process::input` until it is ended (`RunOptions::interactive`).
    Live,
    /// A pseudo-terminal of this size (`RunOptions::pty`), typed into through
    /// `Process::input`.
    Terminal(PtySize),
}

impl Stdin {
    /// What `options` ask for (validated by then: at most one of these is set).
    pub(crate) fn of(options: &RunOptions) -> Stdin {
        match (&options.stdin, options.interactive, options.pty) {
            (_, _, Some(size)) => Stdin::Terminal(size),
            (Some(data), _, _) => Stdin::Given(data.clone()),
            (None, true, None) => Stdin::Live,
            (None, false, None) => Stdin::Closed,
        }
    }

    /// Given bytes, or none.
    pub(crate) fn given(data: Option<Bytes>) -> Stdin {
        data.map_or(Stdin::Closed, Stdin::Given)
    }

    /// Whether the process needs a stdin (pipe or terminal) at all.
    pub(crate) fn attached(&self) -> bool {
        !matches!(self, Stdin::Closed)
    }
}

/// Live input for `stdin` beside `output`: the sink a `Process` hands out.
pub(crate) fn live(
    output: &mut BoxStream<'static, Result<OutputChunk>>,
    mut stdin: impl AsyncWrite + Send + Unpin + 'static,
) -> std::sync::Arc<dyn InputSink> {
    let (sink, mut rx) = sandbox_core::channel_input(4);
    beside(
        output,
        Box::pin(async move {
            while let Some(Some(data)) = rx.recv().await {
                stdin.write_all(&data).await?;
            }
            stdin.shutdown().await
        }),
    );
    sink
}

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
