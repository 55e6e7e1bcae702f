//! The HTTP/1.1 upgrade handshake, sans-I/O: parse and check the request,
//! negotiate permessage-deflate, then write the `101` or the HTTP error that
//! refuses it. It knows nothing of handlers or servers: the server's upgrade
//! (`src/upgrade.rs`) puts these pieces together with the handler's hook.
//! The client's side (`client.rs`) writes the request and checks the
//! response.

mod client;
mod extensions;
mod forwarded;
mod negotiate;
mod percent;
mod request;
mod response;

pub use client::{
    Agreed, ClientHandshake, ClientHandshakeError, ClientRequest, ClientRequestError,
    ConnectHandshake, Fields, Response, parse_response,
};
pub use extensions::{Extension, Extensions, ExtensionsError, Param, Params, parse_extensions};
pub use forwarded::{Forwarded, ForwardedError, MAX_HOPS, forwarded};
pub use negotiate::{negotiate, write_response_value};
pub use percent::{percent_decode, percent_encode};
pub use request::{
    HandshakeError, Head, HeaderBuffer, MAX_HEADERS, Request, check_extended_connect,
    check_request, header_buffer, parse_head, parse_request,
};
pub use response::{
    accept_key, error_header, first_line, header_allowed, status_text, write_accept,
    write_continue, write_error, write_http_response,
};
