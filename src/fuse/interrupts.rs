//! fuser answers every FUSE_INTERRUPT itself, with ENOSYS, on the
//! `/dev/fuse` descriptor that read it (fuser 0.18, `request.rs`). jext4
//! does not act on interrupts (an operation runs to its end, as the
//! protocol allows), and with one cloned descriptor per worker
//! (`clone_fd`) the interrupt is nearly always read by another worker
//! than the one serving the request it names: the kernel finds no such
//! request on that descriptor and refuses the answer with ENOENT
//! (`fuse_dev_do_write`), and fuser logs "Failed to send FUSE reply" at
//! ERROR. Nothing is wrong — the kernel drops the answer, the interrupted
//! request is answered as usual — so libfuse prints nothing in this case
//! ("ENOENT means the operation was interrupted"). Neither does jext4:
//! this filter drops exactly that event, so that an ERROR in the log stays
//! a real error (the crash tests fail on one).

use std::fmt;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// The `log` target fuser's reply errors carry.
const FUSER_REPLY_TARGET: &str = "fuser::reply";

/// fuser's message for an answer the kernel refused with ENOENT.
const UNMATCHED_REPLY: &str = "Failed to send FUSE reply: No such file or directory";

/// A layer that drops fuser's ERROR for answers the kernel no longer
/// expects (module header).
pub struct UnmatchedReplies;

impl<S: Subscriber> Layer<S> for UnmatchedReplies {
    fn event_enabled(&self, event: &Event<'_>, _context: Context<'_, S>) -> bool {
        let mut seen = Seen::default();
        event.record(&mut seen);
        let from_fuser = seen.target.as_deref() == Some(FUSER_REPLY_TARGET)
            || event.metadata().target() == FUSER_REPLY_TARGET;
        !(from_fuser && seen.message.starts_with(UNMATCHED_REPLY))
    }
}

/// The fields that identify the event: fuser logs through the `log`
/// crate, whose records reach tracing with the target in `log.target`.
#[derive(Default)]
struct Seen {
    target: Option<String>,
    message: String,
}

impl Visit for Seen {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "log.target" => self.target = Some(value.to_string()),
            "message" => self.message = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;

    /// What a subscriber with the filter printed.
    fn printed(emit: impl FnOnce()) -> String {
        let buffer = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&buffer);
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Writer(Arc::clone(&sink)))
            .finish()
            .with(UnmatchedReplies);
        tracing::subscriber::with_default(subscriber, emit);
        String::from_utf8(buffer.lock().unwrap().clone()).unwrap()
    }

    struct Writer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Writer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn only_fusers_refused_answer_is_dropped() {
        let output = printed(|| {
            tracing::error!(
                target: "fuser::reply",
                "Failed to send FUSE reply: No such file or directory (os error 2)"
            );
            tracing::error!(target: "fuser::reply", "Failed to send FUSE reply: Broken pipe (os error 32)");
            tracing::error!(target: "jext4", "Failed to send FUSE reply: No such file or directory (os error 2)");
        });
        assert_eq!(
            output.matches("No such file or directory").count(),
            1,
            "{output}"
        );
        assert!(output.contains("Broken pipe"), "{output}");
        assert!(output.contains(" jext4:"), "{output}");
    }
}
