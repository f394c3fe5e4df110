//! Spans named by node path.
//!
//! In a test binary of its own: tracing caches each callsite's interest
//! process-wide when it is first hit, so a test on another thread without a
//! subscriber could make these spans "never" interesting for this one.

use std::sync::{Arc, Mutex};

use provisioners_core::{Context, Provisioner, Result, async_trait};

/// Provisions its children in order (deprovisions them in reverse).
struct Parent(&'static str, Vec<Box<dyn Provisioner>>);

#[async_trait]
impl Provisioner for Parent {
    fn name(&self) -> &str {
        self.0
    }

    async fn provision(&self, cx: &Context) -> Result<()> {
        for child in &self.1 {
            cx.provision(child).await?;
        }
        Ok(())
    }

    async fn deprovision(&self, cx: &Context) -> Result<()> {
        for child in self.1.iter().rev() {
            cx.deprovision(child).await?;
        }
        Ok(())
    }
}

struct Leaf(&'static str);

#[async_trait]
impl Provisioner for Leaf {
    fn name(&self) -> &str {
        self.0
    }

    async fn provision(&self, _cx: &Context) -> Result<()> {
        Ok(())
    }

    async fn deprovision(&self, _cx: &Context) -> Result<()> {
        Ok(())
    }
}

/// Records the name and `node` field of every span created.
#[derive(Clone, Default)]
struct SpanLog(Arc<Mutex<Vec<String>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for SpanLog {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _id: &tracing::span::Id,
        _cx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        struct Node(Option<String>);
        impl tracing::field::Visit for Node {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "node" {
                    self.0 = Some(format!("{value:?}"));
                }
            }
        }
        let mut node = Node(None);
        attrs.record(&mut node);
        let line = format!("{} {}", attrs.metadata().name(), node.0.unwrap_or_default());
        self.0.lock().unwrap().push(line);
    }
}

#[test]
fn every_node_runs_in_a_span_named_by_its_path() {
    use tracing_subscriber::layer::SubscriberExt;

    let spans = SpanLog::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    tracing::subscriber::with_default(subscriber, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let tree = Parent("root", vec![Box::new(Leaf("a")), Box::new(Leaf("b"))]);
            let cx = Context::offline();
            cx.provision(&tree).await.unwrap();
            cx.deprovision(&tree).await.unwrap();
        });
    });
    assert_eq!(
        *spans.0.lock().unwrap(),
        [
            "provision root",
            "provision root/a",
            "provision root/b",
            "deprovision root",
            "deprovision root/b",
            "deprovision root/a",
        ]
    );
}
