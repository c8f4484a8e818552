//! commit-proxy: a MySQL wire-protocol proxy for tests that can drop the server's real OK to
//! COMMIT, so a client sees a COMMIT whose outcome it cannot know.
//!
//! It knows MySQL packets and statements, never the inbox schema, and handles local non-TLS
//! test connections only: it is not a production part.
//!
//! The crate is only the workspace member so far; the proxy is built on top of the inbox
//! store (see `docs/architecture.md`, "where to change what").
