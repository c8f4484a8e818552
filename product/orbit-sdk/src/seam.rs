//! The SDK's one seam for test builds: the only place in this crate where the feature `seams`
//! appears. The consumer's stream connector passes through [`connector`]; without the feature
//! that is the connector itself, and nothing of this module is left in the build. With it, a
//! test build (`test-tools/receiver-test-builds`, never a release) may install, once per
//! process, a [`LinkLayer`] that sees every text message of every stream connection: it may
//! hold one back, wait after one is sent (a fault barrier), or answer one at once. The layer
//! wraps the transport; the consumer's own loop has no branch for it.

use crate::link::Connector;

/// The connector the consumer runs over: `inner` itself without the feature.
#[cfg(not(feature = "seams"))]
pub(crate) fn connector<C: Connector>(inner: C) -> C {
    inner
}

/// The connector the consumer runs over: `inner` wrapped by the installed layer, if any.
#[cfg(feature = "seams")]
pub(crate) fn connector<C: Connector>(inner: C) -> installed::Layered<C> {
    installed::Layered(inner)
}

#[cfg(feature = "seams")]
pub use installed::{install, HookFuture, LinkLayer};

#[cfg(feature = "seams")]
mod installed {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::OnceLock;

    use crate::link::{Connector, Link, StreamError};

    /// What [`LinkLayer::sent`] returns: the consumer's loop waits for it.
    pub type HookFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

    /// What a test build puts around every stream connection. Each method sees one message as
    /// its JSON text.
    pub trait LinkLayer: Send + Sync + 'static {
        /// A new connection opened.
        fn connected(&self) {}
        /// A message is about to go out: whether it is written at all.
        fn sending(&self, _text: &str) -> bool {
            true
        }
        /// A message was written: the consumer goes on once this is done.
        fn sent(&self, _text: &str) -> HookFuture {
            Box::pin(async {})
        }
        /// A message arrived: what to write back at once, before the consumer sees it.
        fn received(&self, _text: &str) -> Vec<String> {
            Vec::new()
        }
    }

    static LAYER: OnceLock<Box<dyn LinkLayer>> = OnceLock::new();

    /// Installs `layer` for every stream connection of this process; a second is refused.
    pub fn install(layer: Box<dyn LinkLayer>) -> Result<(), &'static str> {
        LAYER
            .set(layer)
            .map_err(|_| "a link layer is already installed")
    }

    pub struct Layered<C>(pub(super) C);

    impl<C: Connector> Connector for Layered<C> {
        type Link = LayeredLink<C::Link>;

        async fn connect(&mut self) -> Result<Self::Link, StreamError> {
            let link = self.0.connect().await?;
            if let Some(layer) = LAYER.get() {
                layer.connected();
            }
            Ok(LayeredLink(link))
        }
    }

    pub struct LayeredLink<L>(L);

    impl<L: Link> Link for LayeredLink<L> {
        async fn send(&mut self, text: String) -> Result<(), StreamError> {
            let Some(layer) = LAYER.get() else {
                return self.0.send(text).await;
            };
            if !layer.sending(&text) {
                return Ok(());
            }
            let after = layer.sent(&text);
            self.0.send(text).await?;
            after.await;
            Ok(())
        }

        async fn recv(&mut self) -> Result<Option<String>, StreamError> {
            let got = self.0.recv().await?;
            if let (Some(layer), Some(text)) = (LAYER.get(), &got) {
                for answer in layer.received(text) {
                    self.0.send(answer).await?;
                }
            }
            Ok(got)
        }

        async fn close(&mut self) {
            self.0.close().await
        }
    }
}
