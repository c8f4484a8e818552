//! commit-proxy: a MySQL wire-protocol proxy for tests that can drop the server's real OK to
//! COMMIT, so that a client sees a COMMIT whose outcome it cannot know, while the data is in
//! fact committed.
//!
//! It sits between a client under test and a real MySQL or MariaDB server, relays every packet
//! with correct framing, and applies fault rules armed at run time: drop the OK of a COMMIT,
//! swallow a COMMIT, answer a statement with an injected error, delay a reply, or reset the
//! connection. Each firing is logged with the server's own view (thread id, reply, status flags
//! before and after), so a test resolves an unknown outcome against ground truth.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use commit_proxy::{Action, Proxy, RuleSpec};
//! let proxy = Proxy::start("127.0.0.1:0", "127.0.0.1:3306").await?;
//! let rule = proxy.arm(RuleSpec::new(Action::DropCommitOk).once())?;
//! // … point the client under test at proxy.local_addr() and let it COMMIT …
//! let fired = rule.fired().await;
//! assert_eq!(fired.reply, "ok"); // the server committed; the client never heard
//! # Ok(()) }
//! ```
//!
//! It knows MySQL packets and statements and nothing of any application schema, and it handles
//! local, non-TLS test connections only: it listens on loopback, strips TLS and compression from
//! the server's greeting, and is not a production component. On anything it does not
//! understand it stops interpreting that connection and relays raw bytes.

mod classify;
mod control;
mod packet;
mod proxy;
mod rules;
mod session;
mod state;

pub use classify::{classify, Kind, Statement};
pub use proxy::{ConnectionInfo, Proxy, RuleHandle, StartError};
pub use rules::{Action, Fired, On, RuleInfo, RuleSpec, SpecError};
