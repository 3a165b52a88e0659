//! A log of the statements one thread sends, from sqlx's own statement log.

use std::sync::Arc;

/// Counts the statements one thread sends, by their first word, from sqlx's own statement log
/// (`sqlx::query` events): a private scope, unlike the server's global `Com_*` counters, which
/// any parallel client moves too. It is the process's global subscriber (a thread-scoped one
/// would lose events: tracing caches a callsite as uninteresting when another thread meets it
/// first), and it counts only the events of the thread being watched.
#[derive(Clone, Default)]
pub(crate) struct Statements {
    watched: Arc<std::sync::Mutex<Option<std::thread::ThreadId>>>,
    counts: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

impl Statements {
    /// The one instance, installed as the global subscriber on first use.
    pub(crate) fn installed() -> &'static Self {
        static ONE: std::sync::OnceLock<Statements> = std::sync::OnceLock::new();
        ONE.get_or_init(|| {
            use tracing_subscriber::layer::SubscriberExt;
            let statements = Self::default();
            tracing::subscriber::set_global_default(
                tracing_subscriber::registry().with(statements.clone()),
            )
            .expect("no other global subscriber in this test binary");
            tracing::callsite::rebuild_interest_cache();
            statements
        })
    }

    /// Counts this thread's statements from now on.
    pub(crate) fn watch_this_thread(&self) {
        *self.watched.lock().unwrap() = Some(std::thread::current().id());
    }

    pub(crate) fn take(&self) -> std::collections::HashMap<String, usize> {
        std::mem::take(&mut *self.counts.lock().unwrap())
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Statements {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Summary(Option<String>);
        impl tracing::field::Visit for Summary {
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                if field.name() == "summary" {
                    self.0 = Some(value.to_owned());
                }
            }
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "summary" {
                    self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
                }
            }
        }
        if event.metadata().target() != "sqlx::query"
            || *self.watched.lock().unwrap() != Some(std::thread::current().id())
        {
            return;
        }
        let mut summary = Summary(None);
        event.record(&mut summary);
        let verb = summary
            .0
            .and_then(|s| s.split_whitespace().next().map(str::to_uppercase))
            .unwrap_or_default();
        *self.counts.lock().unwrap().entry(verb).or_default() += 1;
    }
}
