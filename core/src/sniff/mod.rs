//! What a connection's first bytes say, before any protocol of rapidws's
//! reads them: headers a proxy put in front, and the matchers a port router
//! decides by.
//!
//! | file | concern |
//! |---|---|
//! | `proxy.rs` | the PROXY protocol's header, versions 1 and 2 |
//! | `matchers.rs` | does a connection start like HTTP/1, HTTP/2's preface, or smux? |
//! | `hello.rs` | a TLS ClientHello's server name and ALPN protocols, read without terminating TLS |

pub mod hello;
pub mod matchers;
pub mod proxy;
