//! Where log lines go: stderr, written by a thread of its own through a bounded queue. A
//! reader that stops reading (an unread pipe, a stalled log shipper, a paused pager) fills
//! the pipe; a write to it then blocks, and written from the runtime's threads it would
//! stall every request and delivery of the process. Here only the writing thread waits:
//! lines that find the queue full are dropped and counted
//! (`courier_log_lines_dropped_total`), and a closed stderr drops them silently.

use std::io::Write as _;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{LazyLock, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use tracing_subscriber::fmt::MakeWriter;

/// Lines the queue holds while stderr is not taking them: a few megabytes of typical lines.
pub const QUEUED_LINES: usize = 8_192;

/// The most bytes written to stderr in one call: lines waiting together go out together.
const WRITE_AT_ONCE: usize = 64 * 1024;

/// The longest a flush waits for the writing thread (at exit, before a fatal error's line).
const FLUSH_WAIT: Duration = Duration::from_secs(1);

/// What the writing thread is given.
enum Message {
    /// One formatted line.
    Line(Vec<u8>),
    /// Answer once everything queued before has been written.
    Flush(SyncSender<()>),
}

/// The queue to the writing thread, once it runs.
static QUEUE: OnceLock<SyncSender<Message>> = OnceLock::new();

/// Lines dropped because the queue was full, for `/metrics`.
static DROPPED: LazyLock<Counter> = LazyLock::new(Counter::default);

/// The count of log lines dropped because stderr was not keeping up (shared: every clone
/// counts the same lines).
pub fn dropped_lines() -> Counter {
    DROPPED.clone()
}

/// Starts the writing thread (once per process). If the thread cannot start, lines are
/// written to stderr directly, as they were before there was a queue.
pub(super) fn start() {
    QUEUE.get_or_init(|| {
        let (queue, lines) = sync_channel(QUEUED_LINES);
        let spawned = std::thread::Builder::new()
            .name("courier-log".into())
            .spawn(move || write_lines(&lines));
        match spawned {
            Ok(_) => queue,
            // Nobody receives: every line falls back to a direct write (see `LogWriter`).
            Err(_) => sync_channel(0).0,
        }
    });
}

/// Waits, at most [`FLUSH_WAIT`], until the lines logged so far are written.
pub fn flush() {
    let Some(queue) = QUEUE.get() else {
        return;
    };
    let deadline = Instant::now() + FLUSH_WAIT;
    let (done, written) = sync_channel(1);
    let mut message = Message::Flush(done);
    loop {
        match queue.try_send(message) {
            Ok(()) => break,
            Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                message = back;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(_) => return,
        }
    }
    let _ = written.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

/// The writing thread: takes what is queued, writes it in as few calls as it can, and
/// answers flushes once what came before them is out.
fn write_lines(lines: &Receiver<Message>) {
    let mut batch = Vec::with_capacity(WRITE_AT_ONCE);
    let mut flushed = Vec::new();
    while let Ok(first) = lines.recv() {
        let mut next = Some(first);
        while let Some(message) = next.take() {
            match message {
                Message::Line(line) => batch.extend_from_slice(&line),
                Message::Flush(done) => flushed.push(done),
            }
            if batch.len() < WRITE_AT_ONCE {
                next = lines.try_recv().ok();
            }
        }
        write_stderr(&batch);
        batch.clear();
        for done in flushed.drain(..) {
            let _ = done.try_send(());
        }
    }
}

/// Writes to stderr, ignoring failure: a closed log sink must not take the process down.
fn write_stderr(bytes: &[u8]) {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(bytes);
    let _ = stderr.flush();
}

/// The subscriber's writer: one formatted line per write, queued for the writing thread.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct LogSink;

impl<'a> MakeWriter<'a> for LogSink {
    type Writer = LogWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LogWriter
    }
}

/// Queues what it is given (see [`LogSink`]).
#[derive(Debug)]
pub(super) struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match QUEUE.get() {
            Some(queue) => match queue.try_send(Message::Line(buf.to_vec())) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => {
                    DROPPED.inc();
                }
                Err(TrySendError::Disconnected(_)) => write_stderr(buf),
            },
            None => write_stderr(buf),
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
